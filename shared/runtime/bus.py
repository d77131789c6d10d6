"""The Bus port: what the services need of messaging and latest-state storage.

The Bus is deliberately small: core publish/subscribe, JetStream publish and durable pull
consumers for work that must not be lost, and KV get/put/create/compare-and-set/watch for latest
state. Compare-and-set conflicts are data (``None``), not exceptions: losing a race is normal.

This module holds the interfaces only (the :class:`Bus` and its parts, the records it hands out,
the errors a caller handles, what an adapter reports about its connection); it imports no I/O
library. The adapter over nats-py is the package :mod:`shared.runtime.nats` (``NatsBus``), the
only code that imports ``nats``; how it keeps these promises through outages, store losses and
refused credentials is told there.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable


class BusUnavailableError(ConnectionError):
    """Not connected to NATS: the write was not sent, and nothing of it will land later."""


class StoreRefusedError(BusUnavailableError):
    """NATS took the message but JetStream refused to store it (a stream full: its message or
    byte limit, the server's storage exhausted): nothing of it landed, nor will later."""


class OutcomeUnknownError(TimeoutError):
    """The write was sent but its answer never came (timeout, or the connection dropped).

    It may or may not have been applied, and it will not be applied later: read the key back
    (after the reconnect) to learn which.
    """


class NoResponderError(LookupError):
    """A request found nobody subscribed to its subject (the answering service is not running)."""


ConnectionState = Literal["connected", "reconnecting", "authorization failed", "closed"]


@dataclass(frozen=True, slots=True)
class ConnectionStatus:
    """Where the connection stands, with counts since the process started."""

    state: ConnectionState
    reason: str = ""
    """Why it is not connected (secrets never appear here)."""
    disconnects: int = 0
    reconnects: int = 0
    authorization_failures: int = 0

    @property
    def connected(self) -> bool:
        return self.state == "connected"


@runtime_checkable
class ConnectionMonitor(Protocol):
    """What a Bus adapter may report about its connection (``NatsBus`` does; test fakes need not).

    The service runtime uses it for ``/readyz``, ``/metrics`` and to stop a service whose client
    closed for good.
    """

    def connection_status(self) -> ConnectionStatus:
        """The state now."""
        ...

    async def wait_closed(self) -> str:
        """Return, with the reason, once the client closed for good (never after ``drain``)."""
        ...


WATCH_HEARTBEAT_S = 1.0
"""The server's idle heartbeat on a KV watch of the control plane (placers, binder). nats-py
recreates a watch's consumer after two heartbeats missed: on a NATS cluster whose server holding
the consumer died while this client's own server lives on, the watch is silent, not lost, and
with nats-py's default of 5 s it stayed silent for 10 s or more."""

NODE_WATCH_HEARTBEAT_S = 10.0
"""The idle heartbeat on the KV watches of the per-node services (``shared.permissions.
NODE_ROLES``). Heartbeats cost the server per watch, not per change, and every node runs three
watches: at 1 s, an idle system of 100 nodes sent its device plugins 314 messages a second and
nats-server spent 52 ms of CPU a second (at 10 s: 46 messages and 27 ms); 10,000 nodes would get
30,000 heartbeats a second. A node's services do not need to notice a silent watch quickly: an
Allocate whose record or commit is not there yet reads them afresh at once (``services.
deviceplugin.records`` and ``commits``), and the inventory also comes on its core subject."""

WRITE_COALESCE_S = 0.0005
"""How long the control plane's NATS client (placers, binder) waits after a publish before it
writes to the socket, so that the publishes of that moment go out in one write
(``shared.runtime.nats.client``). In a 1,000-pod burst (``benchmarks/e2e.py --nodes 100 --pods
1000``) it cut the control plane's CPU per pod by 4-8 % and raised pods/s; at a steady 250
pods/s, where little is written at once, a decision's three or four writes in a row may each wait
(``benchmarks/placer_service.py``: p50 3.1 -> 4.5 ms with every client of the run waiting, no
change beyond noise with the placer alone). The per-node services write little and the device
plugin answers the kubelet: none."""


async def _noop() -> None:
    return None


async def _noop_delay(delay: float | None = None) -> None:
    return None


@dataclass(frozen=True, slots=True)
class Delivery:
    """A received message. ``ack``/``nak``/``term``/``in_progress`` act on JetStream messages
    only."""

    subject: str
    data: bytes
    headers: Mapping[str, str] = field(default_factory=dict)
    num_delivered: int = 1
    ack: Callable[[], Awaitable[None]] = _noop
    nak: Callable[[float | None], Awaitable[None]] = _noop_delay
    term: Callable[[], Awaitable[None]] = _noop
    in_progress: Callable[[], Awaitable[None]] = _noop
    """Tell JetStream the message is still being worked on: its ``ack_wait`` starts again."""
    sequence: int = 0
    """The message's stream sequence (JetStream messages only; 0 otherwise)."""
    reply: str = ""
    """Where the sender of a request waits for the answer (core messages; empty otherwise)."""


@dataclass(frozen=True, slots=True)
class KvEntry:
    """One KV value at one revision; ``deleted`` marks a delete or purge marker."""

    key: str
    value: bytes
    revision: int
    deleted: bool = False


@dataclass(frozen=True, slots=True)
class KvWrite:
    """One write of :meth:`Bus.kv_write_all`: ``value`` at ``key`` if the key is still at
    ``revision`` (0: only if it is absent or deleted, as ``kv_create``).

    ``guard``: a key filter; when set, ``revision`` is the latest revision expected among *all*
    keys it matches, delete markers included (0: none was ever written), not ``key``'s own. So a
    write can depend on a group of keys as a compare-and-set depends on one."""

    key: str
    value: bytes
    revision: int
    guard: str = ""


@dataclass(frozen=True, slots=True)
class Publication:
    """One message of :meth:`Bus.js_publish_all`; ``msg_id`` de-duplicates it."""

    subject: str
    data: bytes
    msg_id: str


Handler = Callable[[Delivery], Awaitable[None]]


class Subscription(Protocol):
    """A live subscription."""

    async def unsubscribe(self) -> None:
        """Stop receiving."""
        ...


class PullConsumer(Protocol):
    """A durable JetStream consumer: what is fetched and not acked comes back after ``ack_wait``."""

    async def fetch(self, batch: int, timeout: float) -> list[Delivery]:
        """Up to ``batch`` messages; an empty list when none arrived within ``timeout``.
        Raises :class:`BusUnavailableError` while disconnected."""
        ...

    async def close(self) -> None:
        """Stop fetching (the durable consumer and its position stay on the server)."""
        ...


class Bus(Protocol):
    """Messaging and latest-state storage, as the services need them.

    Every write (``publish``, ``js_publish``, ``kv_put``/``kv_create``/``kv_update``/
    ``kv_write_all``/``kv_delete``) raises :class:`BusUnavailableError` at once while
    disconnected (nothing sent) and :class:`OutcomeUnknownError` when it was sent but no answer
    came (read the key back). Neither ever lands later. A ``kv_update`` that returns None lost
    the compare-and-set. Reads (``kv_get``, ``kv_keys``, a watch starting) and attaching or
    fetching a consumer raise :class:`BusUnavailableError` too while disconnected.
    """

    @property
    def connected(self) -> bool:
        """True while the connection to the server is up."""
        ...

    @property
    def store_epoch(self) -> str:
        """The epoch of the store the bus talks to (``tessera-meta``), as last checked."""
        ...

    async def publish(
        self, subject: str, data: bytes, *, headers: Mapping[str, str] | None = None
    ) -> None:
        """Fire-and-forget publish (telemetry, dead letters)."""
        ...

    async def subscribe(self, subject: str, handler: Handler, *, queue: str = "") -> Subscription:
        """Call ``handler`` for each message on ``subject`` (a queue group shares the load)."""
        ...

    async def request(self, subject: str, data: bytes, *, timeout: float) -> bytes:
        """Send a request and return the first reply (core request/reply; the answering side
        publishes to its delivery's ``reply``). Raises :class:`BusUnavailableError` while
        disconnected, :class:`NoResponderError` when nobody listens on ``subject`` and
        ``TimeoutError`` when no reply came within ``timeout`` seconds."""
        ...

    async def js_publish(
        self,
        subject: str,
        data: bytes,
        *,
        msg_id: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> int:
        """Publish durably; returns the stream sequence. ``msg_id`` de-duplicates retries."""
        ...

    async def js_publish_all(self, stream: str, publications: Sequence[Publication]) -> None:
        """Publish ``publications`` durably, in order, to ``stream`` (their subjects are its):
        when it returns, each is stored (or was already: its ``msg_id``). Raises as
        :meth:`js_publish`; some may be stored then. Where it can, one answer answers for all."""
        ...

    async def pull_consumer(
        self,
        *,
        stream: str,
        durable: str,
        subject: str,
        ack_wait: float = 30.0,
        max_deliver: int = -1,
        max_ack_pending: int | None = None,
    ) -> PullConsumer:
        """Create or attach to the durable consumer ``durable`` on ``stream``.

        ``max_ack_pending`` caps the messages delivered and not yet acked (None: the server's
        default, 1,000); settings apply when the consumer is created.
        """
        ...

    async def kv_get(self, bucket: str, key: str) -> KvEntry | None:
        """The latest value, or None when the key is absent or deleted."""
        ...

    async def kv_put(self, bucket: str, key: str, value: bytes) -> int:
        """Write unconditionally; returns the new revision."""
        ...

    async def kv_create(self, bucket: str, key: str, value: bytes) -> int | None:
        """Write only if the key does not exist; None when it does."""
        ...

    async def kv_update(self, bucket: str, key: str, value: bytes, *, revision: int) -> int | None:
        """Compare-and-set: write only if the key is still at ``revision``; None on conflict."""
        ...

    async def kv_send(
        self,
        bucket: str,
        key: str,
        value: bytes,
        *,
        revision: int,
        create: bool = False,
        guard: str = "",
    ) -> bool:
        """Compare-and-set with no answer: ``value`` is stored only if the key is still at
        ``revision``, and the server says nothing either way (one message fewer through it than
        :meth:`kv_update`). For a writer that watches the key anyway: the first version of the
        key its watch shows above ``revision`` is this write if it landed, the one that beat it
        if not (``shared.runtime.records.RecordMirror.write``). ``create``: ``revision`` is the
        key's deletion the writer saw last (0: none), and one of a store that was lost counts as
        none. ``guard``: ``revision`` is the latest among every key the filter matches, as for
        :class:`KvWrite`; the first version of any of them the watch shows above it is this
        write or the one that beat it. False when it was not sent because it cannot land
        (``revision`` is of a store that was lost); raises :class:`BusUnavailableError` while
        disconnected (nothing was sent)."""
        ...

    async def kv_write_all(self, bucket: str, writes: Sequence[KvWrite]) -> tuple[int, ...] | None:
        """Write all of ``writes`` (to distinct keys) or none: each a compare-and-set or a
        create-only write, landing together. Returns their new revisions, in order; None when
        any one lost (then none was written)."""
        ...

    async def kv_delete(self, bucket: str, key: str) -> None:
        """Delete the key (a delete marker stays in history)."""
        ...

    async def kv_delete_if(
        self, bucket: str, key: str, *, revision: int, guard: str = ""
    ) -> int | None:
        """Delete the key only if it is still at ``revision`` (with ``guard``, a key filter:
        only if ``revision`` is still the latest among the keys it matches, as ``KvWrite.guard``);
        returns the delete marker's revision, None when the key (or the guard's keys) moved on."""
        ...

    async def kv_keys(self, bucket: str) -> list[str]:
        """Every live key of the bucket."""
        ...

    async def kv_list(self, bucket: str, keys: str) -> list[KvEntry]:
        """The latest entry of every key matching the filter ``keys``, delete markers included
        (the revision of each is what a ``KvWrite.guard`` of ``keys`` compares with)."""
        ...

    def kv_watch(
        self, bucket: str, keys: str = ">", *, batch_s: float = 0.0
    ) -> AsyncGenerator[KvEntry | None, None]:
        """Current values of matching keys, then one ``None`` marking "initial values done",
        then every later change, until the iterator is closed.

        ``batch_s`` above 0: while changes keep coming, they are asked for every ``batch_s``
        rather than each sent as it is written, so they come up to that much later and several
        at a time: for a reader that can lag that long and would otherwise wake for every
        change. The first change after a quiet spell comes at once."""
        ...

    async def drain(self) -> None:
        """Finish in-flight work and close the connection."""
        ...
