"""The Bus port and its NATS adapter (the only module that imports ``nats``).

The Bus is deliberately small: core publish/subscribe, JetStream publish and durable pull
consumers for work that must not be lost, and KV get/put/create/compare-and-set/watch for latest
state. Compare-and-set conflicts are data (``None``), not exceptions: losing a race is normal.

Writes during a NATS outage (issue 9). nats-py buffers what is published while it reconnects and
sends it after the reconnect; a KV write is a JetStream publish awaiting an acknowledgement, so a
compare-and-set that timed out could land long after its caller gave up. The adapter never lets a
write sit in that buffer:

* a write (publish, JetStream publish, any KV write) while disconnected raises
  :class:`BusUnavailableError` at once: nothing was sent and nothing will land later;
* whatever was queued but not yet on the wire when the connection drops is discarded, and a
  request still waiting for its answer then raises :class:`OutcomeUnknownError` at once (as does
  one whose answer times out): it may or may not have reached the server, and it will not reach
  it later, so reading the key back after the reconnect tells what happened.

Durability (DESIGN section 12). Every stream and KV bucket is created with the replica count the
service was given (``--nats-replicas``: 3 on a 3-server JetStream cluster, so that losing a server
loses nothing). A stream or bucket that has gone (NATS restarted with an empty store, someone
deleted it) is created again, never a reason to fail: after every reconnect, and whenever an
operation finds it missing (a write then raises :class:`BusUnavailableError`: nothing was
written; a watch starts over on the new, empty bucket; a durable consumer is attached again).
The store also holds its *epoch* (``tessera-meta``, created with the topology): a new epoch tells
the services that the store was lost, and what it held is rebuilt from the Kubernetes API (the
binder republishes what is bound; placers turn ready only once it has). After each reconnect no
KV operation runs before the bus has checked the store it came back to; when the epoch is new,
the revisions of the new store are reported above every revision the bus reported before, and a
compare-and-set at a revision of the lost store loses (as if the entry had moved on): a mirror
that keeps the newest revision of each key takes the new store's values, and no write decided on
what the lost store held can land in the new one by compare-and-set.

Security (DESIGN section 11): :meth:`NatsBus.connect` takes a :class:`~shared.config.NatsSecurity`
(user/password, token, NKey seed, ``.creds`` file, TLS). A first connection the server refuses for
its credentials or TLS raises :class:`NatsRefusedError` (retrying cannot help); any other first
failure is an ordinary exception the caller retries. After the first success the adapter
reconnects forever; failed attempts back off (doubling up to 30 s when the server refuses the
credentials) and are logged once per back-off step. :class:`ConnectionMonitor` reports the state
(``/readyz``, ``/metrics``) and when the client closed for good.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
import ssl
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable
from urllib.parse import urlsplit

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg as NatsMsg
from nats.aio.subscription import Subscription as NatsSubscription
from nats.js import api as js_api
from nats.js.kv import KeyValue

from shared import codec, subjects
from shared.config import NatsSecurity, redact_url
from shared.messages.store import StoreEpoch
from shared.runtime.tasks import cancel_and_wait, checkpoint

log = logging.getLogger(__name__)

T = TypeVar("T")


class BusUnavailableError(ConnectionError):
    """Not connected to NATS: the write was not sent, and nothing of it will land later."""


class OutcomeUnknownError(TimeoutError):
    """The write was sent but its answer never came (timeout, or the connection dropped).

    It may or may not have been applied, and it will not be applied later: read the key back
    (after the reconnect) to learn which.
    """


class NatsRefusedError(Exception):
    """The server refused the connection for its credentials or TLS; retrying cannot help."""


class NatsUnreachableError(ConnectionError):
    """The server could not be reached (refused, DNS, timeout, network): retrying may help.
    The message says which (:func:`unreachable_reason`)."""


def _address(url: str) -> tuple[str, str]:
    """(host, host:port) of one server URL (an unparsable one as it is)."""
    try:
        where = urlsplit(url.strip())
        host = where.hostname or url
        return host, f"{host}:{where.port or 4222}"
    except ValueError:
        return url, url


def unreachable_reason(error: BaseException, url: str) -> str:
    """Why the server at ``url`` (several, comma-separated: a cluster) could not be reached, for a
    log line and ``/readyz``: the connection refused, a name DNS cannot resolve, a timeout,
    another network error."""
    if isinstance(error, NatsUnreachableError):
        return str(error)
    servers = [_address(part) for part in url.split(",") if part.strip()] or [(url, url)]
    host = ", ".join(dict.fromkeys(h for h, _ in servers))
    address = ", ".join(a for _, a in servers)
    if isinstance(error, ConnectionRefusedError):
        return f"connection refused by {address} (is nats-server running there?)"
    if isinstance(error, socket.gaierror):
        return f"DNS cannot resolve {host!r}: {error.strerror or error}"
    if isinstance(error, TimeoutError | nats.errors.TimeoutError):
        return f"no answer from {address} in time (timeout)"
    if isinstance(error, OSError) and error.strerror:
        return f"network error reaching {address}: {error.strerror}"
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


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


AUTHORIZATION_MARKERS = (
    "authorization violation",
    "authentication expired",
    "authentication revoked",
)
"""Words in a server error that mean the credentials were refused (compared in lower case)."""

MAX_AUTH_BACKOFF_S = 30.0
QUIET_LOG_S = 30.0
"""Other connection errors repeating every attempt are logged at most this often."""


def refusal_of(error: BaseException) -> str | None:
    """Why ``error`` means the server refused our credentials or TLS, or None when it does not."""
    if isinstance(error, ssl.SSLError):
        return f"TLS failed: {error}"
    text = str(error).lower()
    if isinstance(error, nats.errors.AuthorizationError) or any(
        marker in text for marker in AUTHORIZATION_MARKERS
    ):
        return f"authorization failed: {str(error) or type(error).__name__}"
    return None


def _tls_context(security: NatsSecurity) -> ssl.SSLContext | None:
    if not security.uses_tls:
        return None
    context = ssl.create_default_context(cafile=security.tls_ca_file or None)
    if security.tls_cert_file:
        context.load_cert_chain(security.tls_cert_file, security.tls_key_file or None)
    return context


DEFAULT_INBOX_PREFIX = "_INBOX"
"""nats-py's reply-subject prefix, for a client that is none of Tessera's identities."""


def _bucket_stream(bucket: str, history: int, replicas: int) -> js_api.StreamConfig:
    """The stream of a KV bucket as nats-py's ``create_key_value`` makes it, except that it
    refuses rollups: a ``Nats-Rollup: all`` header on a write to any one key would otherwise
    purge the whole bucket, so an identity allowed to write only its own node's keys could wipe
    every node's records. Tessera never purges a key (deletes are delete markers)."""
    return js_api.StreamConfig(
        name=f"KV_{bucket}",
        subjects=[f"$KV.{bucket}.>"],
        allow_direct=False,
        allow_rollup_hdrs=False,
        deny_delete=True,
        discard=js_api.DiscardPolicy.NEW,
        duplicate_window=120.0,
        max_consumers=-1,
        max_msgs=-1,
        max_msgs_per_subject=history,
        num_replicas=replicas,
    )


WATCH_INACTIVE_S = 5.0
"""How long the server keeps a KV watch's consumer once nobody listens (see ``NatsBus._watch``)."""

WATCH_HEARTBEAT_S = 1.0
"""The server's idle heartbeat on a KV watch. nats-py recreates a watch's consumer after two
heartbeats missed: on a NATS cluster whose server holding the consumer died while this client's
own server lives on, the watch is silent, not lost, and with nats-py's default of 5 s it stayed
silent for 10 s or more (a device plugin then refused pods whose records it never saw)."""

_MISSING = (nats.js.errors.NoStreamResponseError, nats.js.errors.ServiceUnavailableError)
"""What nats-py raises when the stream (or consumer) an operation needs does not exist: a
JetStream publish nobody stores, a pull request nobody answers."""

# Errors that only mean the subscription or connection is already gone.
_GONE = (
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionDrainingError,
    nats.errors.BadSubscriptionError,
)


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


Handler = Callable[[Delivery], Awaitable[None]]


class Subscription(Protocol):
    """A live subscription."""

    async def unsubscribe(self) -> None:
        """Stop receiving."""
        ...


class PullConsumer(Protocol):
    """A durable JetStream consumer: what is fetched and not acked comes back after ``ack_wait``."""

    async def fetch(self, batch: int, timeout: float) -> list[Delivery]:
        """Up to ``batch`` messages; an empty list when none arrived within ``timeout``."""
        ...

    async def close(self) -> None:
        """Stop fetching (the durable consumer and its position stay on the server)."""
        ...


class Bus(Protocol):
    """Messaging and latest-state storage, as the services need them.

    Every write (``publish``, ``js_publish``, ``kv_put``/``kv_create``/``kv_update``/
    ``kv_delete``) raises :class:`BusUnavailableError` at once while disconnected (nothing sent)
    and :class:`OutcomeUnknownError` when it was sent but no answer came (read the key back).
    Neither ever lands later. A ``kv_update`` that returns None lost the compare-and-set.
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

    async def kv_delete(self, bucket: str, key: str) -> None:
        """Delete the key (a delete marker stays in history)."""
        ...

    async def kv_delete_if(self, bucket: str, key: str, *, revision: int) -> bool:
        """Delete the key only if it is still at ``revision``; False when it moved on."""
        ...

    async def kv_keys(self, bucket: str) -> list[str]:
        """Every live key of the bucket."""
        ...

    def kv_watch(self, bucket: str, keys: str = ">") -> AsyncGenerator[KvEntry | None, None]:
        """Current values of matching keys, then one ``None`` marking "initial values done",
        then every later change, until the iterator is closed."""
        ...

    async def drain(self) -> None:
        """Finish in-flight work and close the connection."""
        ...


# --- NATS adapter ----------------------------------------------------------------------------


def _delivery(msg: NatsMsg, *, jetstream: bool) -> Delivery:
    headers = dict(msg.headers or {})
    if not jetstream:
        return Delivery(subject=msg.subject, data=msg.data, headers=headers, reply=msg.reply or "")

    async def nak(delay: float | None = None) -> None:
        await msg.nak(delay=delay)

    metadata = msg.metadata
    return Delivery(
        subject=msg.subject,
        data=msg.data,
        headers=headers,
        num_delivered=metadata.num_delivered or 1,
        ack=msg.ack,
        nak=nak,
        term=msg.term,
        in_progress=msg.in_progress,
        sequence=int(metadata.sequence.stream or 0) if metadata.sequence else 0,
    )


class _NatsSubscription:
    def __init__(self, sub: NatsSubscription) -> None:
        self._sub = sub

    async def unsubscribe(self) -> None:
        with contextlib.suppress(nats.errors.ConnectionClosedError):
            await self._sub.unsubscribe()


class _NatsPullConsumer:
    """A durable pull consumer, attached again when the server no longer has it (or its
    stream): the placers' and the binder's work must go on after NATS lost its store."""

    def __init__(
        self, sub: Any, attach: Callable[[], Awaitable[Any]], restore: Callable[[], Awaitable[None]]
    ) -> None:
        self._sub = sub
        self._attach = attach
        self._restore = restore

    async def fetch(self, batch: int, timeout: float) -> list[Delivery]:
        try:
            msgs = await self._sub.fetch(batch, timeout=timeout)
        except TimeoutError:  # nats-py's TimeoutError, and at times a bare asyncio one: no message
            return []
        except (*_MISSING, nats.js.errors.NotFoundError):
            await self._restore()
            with contextlib.suppress(*_GONE):
                await self._sub.unsubscribe()
            self._sub = await self._attach()
            log.warning("durable consumer attached again (it was gone from the server)")
            return []
        return [_delivery(m, jetstream=True) for m in msgs]

    async def close(self) -> None:
        # Unsubscribing before drain avoids nats-py's DrainTimeoutError on open pull subscriptions.
        with contextlib.suppress(*_GONE):
            await self._sub.unsubscribe()


class NatsBus:
    """The Bus over a real NATS server with JetStream (implements ``ConnectionMonitor`` too)."""

    def __init__(
        self, client: NatsClient, *, request_timeout: float = 5.0, replicas: int = 1
    ) -> None:
        self._nc = client
        self._js = client.jetstream(timeout=request_timeout)
        self._replicas = replicas
        self._update_topology = True
        self._kv: dict[str, KeyValue] = {}
        self._topology = asyncio.Lock()
        self._topology_at = -1.0
        self.topology_restores = 0
        """How many times streams or buckets were found missing and created again."""
        self._background: set[asyncio.Task[None]] = set()
        self._epoch = ""
        self._checked = asyncio.Event()
        """Set while the store the connection reached has been checked (topology, epoch)."""
        self._checked.set()
        self._revision_base = 0
        """Added to the new store's revisions, so that they count above the lost store's."""
        self._last_revision = 0
        """The highest revision reported so far."""
        self._consumers: list[_NatsPullConsumer] = []
        self._state: ConnectionState = "connected"
        self._reason = ""
        self._disconnects = 0
        self._reconnects = 0
        self._auth_failures = 0
        self._failures_in_row = 0
        self._reconnect_wait = 1.0
        self._last_quiet_log = 0.0
        self._draining = False
        loop = asyncio.get_running_loop()
        self._lost: asyncio.Future[None] = loop.create_future()
        self._closed: asyncio.Future[str] = loop.create_future()
        self._up = asyncio.Event()
        """Set while connected (and once closed for good, to wake whoever waits for it)."""
        self._up.set()

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        name: str,
        connect_timeout: float = 2.0,
        reconnect_wait: float = 1.0,
        security: NatsSecurity | None = None,
        request_timeout: float = 5.0,
        replicas: int = 1,
        topology: bool = True,
        inbox_prefix: str = DEFAULT_INBOX_PREFIX,
        update_topology: bool = True,
    ) -> NatsBus:
        """Connect once, then reconnect forever after any later loss; ensure streams and buckets
        (``replicas`` copies of each; none when ``topology`` is False: a client that only asks
        questions, ``tessera explain``). ``url`` may name several servers of a cluster,
        separated by commas.

        ``inbox_prefix``: where replies to this client go (``shared.permissions.inbox_prefix``:
        a service's identity may only listen under its own). ``update_topology``: whether this
        client may change an existing stream's or bucket's configuration; one that may not only
        creates what is missing (see :meth:`ensure_topology`).

        Raises:
            NatsRefusedError: the server refused the credentials or the TLS handshake failed.
            NatsUnreachableError: the server could not be reached (the message says why); retry.
        """
        security = security or NatsSecurity()
        bus: NatsBus | None = None
        first_errors: list[Exception] = []
        """What the first connection met (nats-py reports it to the error callback only)."""

        async def on_error(error: Exception) -> None:
            if bus is not None:
                bus._on_error(error)
            else:
                first_errors.append(error)

        async def on_disconnect() -> None:
            if bus is not None:
                bus._on_disconnect()

        async def on_reconnect() -> None:
            if bus is not None:
                bus._on_reconnect()

        async def on_closed() -> None:
            if bus is not None:
                bus._on_closed()

        client = NatsClient()

        def next_attempt(servers: list[Any], info: dict[str, Any]) -> tuple[Any, float]:
            # nats-py leaves the transport of a refused attempt open and replaces it with the
            # next one: close it here, or every refused attempt leaks a socket.
            stale = client._transport
            if stale is not None:
                with contextlib.suppress(Exception):
                    stale.close()  # type: ignore[no-untyped-call]
            # The server tried least often since it last connected: a handler that names none
            # gets the first in the pool every time, however dead (a cluster's other servers
            # were never tried).
            least_tried = min(servers, key=lambda server: server.reconnects) if servers else None
            return least_tried, bus._next_delay() if bus is not None else reconnect_wait

        try:
            # One attempt only: nats-py would otherwise retry a first connection forever inside
            # connect(), hiding a refused password (or a server that is not there) behind
            # "connecting". Without reconnects it gives up on a refused login; with at most one
            # reconnect attempt it gives up on a server it cannot reach at all (after one retry),
            # where it would otherwise loop without end. Both are switched on once connected.
            await client.connect(
                servers=[server.strip() for server in url.split(",") if server.strip()],
                name=name,
                # nats-py annotates these seconds as int but takes floats.
                connect_timeout=connect_timeout,  # type: ignore[arg-type]
                reconnect_time_wait=reconnect_wait,  # type: ignore[arg-type]
                max_reconnect_attempts=1,
                allow_reconnect=False,
                # 0 = never buffer a publish while disconnected (it raises instead).
                pending_size=0,
                error_cb=on_error,
                disconnected_cb=on_disconnect,
                reconnected_cb=on_reconnect,
                closed_cb=on_closed,
                reconnect_to_server_handler=next_attempt,
                **security.client_options(),
                inbox_prefix=inbox_prefix,
                tls=_tls_context(security),
                tls_hostname=security.tls_server_name or None,
            )
        except Exception as error:
            # Bounded: closing flushes to a transport a failed TLS handshake may have wedged.
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1.0):
                    await client.close()
            met = first_errors[-1] if first_errors else error
            reason = refusal_of(error) or refusal_of(met)
            if reason is not None:
                raise NatsRefusedError(reason) from None
            raise NatsUnreachableError(unreachable_reason(met, url)) from error
        client.options["allow_reconnect"] = True
        client.options["max_reconnect_attempts"] = -1
        bus = cls(client, request_timeout=request_timeout, replicas=replicas)
        bus._update_topology = update_topology
        bus._reconnect_wait = reconnect_wait
        log.info("nats connected", extra={"url": redact_url(url)})
        if not topology:
            return bus
        try:
            await bus.ensure_topology()
        except BaseException:  # JetStream not ready yet (a cluster electing): the caller retries
            bus._draining = True
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1.0):
                    await client.close()
            raise
        return bus

    # --- connection state (callbacks of nats-py) -----------------------------------------------

    def _on_error(self, error: Exception) -> None:
        refusal = refusal_of(error)
        if refusal is not None:
            self._auth_failures += 1
            self._state, self._reason = "authorization failed", refusal
        self._failures_in_row += 1
        delay = self._delay_after(self._failures_in_row)
        extra = {"error": f"{type(error).__name__}: {error}", "retry_s": delay}
        if refusal is not None:  # each back-off step, so an operator sees it without a flood
            log.error("nats refused the credentials", extra=extra)
            return
        now = time.monotonic()
        if now - self._last_quiet_log >= QUIET_LOG_S or self._failures_in_row == 1:
            self._last_quiet_log = now
            log.warning("nats error", extra=extra | {"attempts": self._failures_in_row})

    def _delay_after(self, failures: int) -> float:
        if self._state == "authorization failed":
            return float(min(self._reconnect_wait * 2 ** max(failures - 1, 0), MAX_AUTH_BACKOFF_S))
        return self._reconnect_wait

    def _next_delay(self) -> float:
        """Seconds before the next reconnect attempt: none for the first after a loss."""
        return 0.0 if self._failures_in_row == 0 else self._delay_after(self._failures_in_row)

    def _on_disconnect(self) -> None:
        # Commands queued but not yet written would be sent after the reconnect, long after
        # their callers gave up: drop them, and fail the requests waiting for answers.
        self._nc._pending.clear()
        self._nc._pending_data_size = 0
        self._failures_in_row = 0  # errors so far were of the lost connection, not attempts
        if not self._lost.done():
            self._lost.set_result(None)
        self._up.clear()
        self._checked.clear()
        if self._state == "connected" and not self._draining:
            self._disconnects += 1
            self._state, self._reason = "reconnecting", "disconnected; reconnecting"
            log.warning("nats disconnected")

    def _on_reconnect(self) -> None:
        self._reconnects += 1
        self._failures_in_row = 0
        self._state, self._reason = "connected", ""
        self._lost = asyncio.get_running_loop().create_future()
        self._up.set()
        log.info("nats reconnected")
        # The server may have come back without its store: create what is missing at once.
        task = asyncio.get_running_loop().create_task(self._restore_after_reconnect())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _restore_after_reconnect(self) -> None:
        """Check the store the connection came back to before any KV operation runs again."""
        delay = 0.2
        while not self._draining:
            try:
                async with self._topology:
                    self._kv.clear()
                    await self.ensure_topology()
                    self._topology_at = asyncio.get_running_loop().time()
                self._checked.set()
                return
            except Exception as error:  # JetStream not up yet on the server: try again shortly
                log.info("cannot check the streams yet", extra={"error": repr(error)})
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    @property
    def store_epoch(self) -> str:
        return self._epoch

    def _take_epoch(self, epoch: str) -> None:
        if self._epoch and epoch != self._epoch:
            self._revision_base = self._last_revision + 1
            log.warning(
                "NATS lost its store: a new, empty one is in use; what is bound is restored "
                "into it from the Kubernetes API",
                extra={"epoch": epoch, "previous_epoch": self._epoch},
            )
        self._epoch = epoch

    async def _store_checked(self) -> None:
        """Wait (a bounded while) until the store reached after a reconnect has been checked."""
        if self._checked.is_set() or not self._nc.is_connected:
            return
        try:
            async with asyncio.timeout(self._js._timeout):
                await self._checked.wait()
        except TimeoutError:
            raise BusUnavailableError(
                "the NATS store is still being checked after a reconnect; nothing was done"
            ) from None

    def _revision(self, sequence: int) -> int:
        """The revision reported for the stream ``sequence`` of a KV entry."""
        revision = sequence + self._revision_base
        self._last_revision = max(self._last_revision, revision)
        return revision

    def _sequence(self, revision: int) -> int | None:
        """The stream sequence of a reported revision; None when it is of a lost store."""
        return revision - self._revision_base if revision >= self._revision_base else None

    def _on_closed(self) -> None:
        self._up.set()
        self._checked.set()
        if not self._lost.done():
            self._lost.set_result(None)
        if self._draining:
            return
        error = self._nc.last_error
        reason = (refusal_of(error) if error else None) or (
            f"connection closed: {type(error).__name__}: {error}" if error else "connection closed"
        )
        self._state, self._reason = "closed", reason
        if not self._closed.done():
            self._closed.set_result(reason)

    def connection_status(self) -> ConnectionStatus:
        state = self._state
        if state == "connected" and not self._nc.is_connected:
            state = "reconnecting"
        return ConnectionStatus(
            state=state,
            reason="" if state == "connected" else self._reason or "disconnected; reconnecting",
            disconnects=self._disconnects,
            reconnects=self._reconnects,
            authorization_failures=self._auth_failures,
        )

    async def wait_closed(self) -> str:
        return await asyncio.shield(self._closed)

    async def _write(self, operation: Callable[[], Awaitable[T]]) -> T:
        """Run one write: refused at once when disconnected, OutcomeUnknownError when the
        connection drops (or the answer times out) before the answer."""
        if not self.connected:
            raise BusUnavailableError("not connected to NATS; nothing was sent")
        lost = self._lost
        task = asyncio.ensure_future(operation())
        racing: set[asyncio.Future[Any]] = {task, lost}
        try:
            await asyncio.wait(racing, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel()
            raise
        if not task.done():
            task.cancel()
            raise OutcomeUnknownError(
                "the NATS connection dropped before the answer; the write may or may not have "
                "been applied (read it back)"
            )
        try:
            return task.result()
        except (nats.errors.OutboundBufferLimitError, nats.errors.ConnectionReconnectingError):
            raise BusUnavailableError("not connected to NATS; nothing was sent") from None
        except _MISSING:
            await self.restore_topology(reason="a write found no stream")
            raise BusUnavailableError(
                "no stream took the write (NATS lost its store?): nothing was written; the "
                "streams and buckets are created again, try again"
            ) from None
        except nats.errors.TimeoutError:
            raise OutcomeUnknownError(
                "no answer from NATS in time; the write may or may not have been applied "
                "(read it back)"
            ) from None

    async def ensure_topology(self) -> list[str]:
        """Create every stream and KV bucket Tessera uses (retention and age limits from
        ``shared.subjects``, ``replicas`` copies), and the store's epoch; existing ones keep their
        retention, only their subjects and replica count follow, and a bucket made before rollups
        were refused stops taking them; a client that may not change configurations
        (``update_topology=False`` at connect) only creates what is missing. Returns the streams
        it created."""
        update = self._update_topology
        created: list[str] = []
        for name, stream_subjects in subjects.STREAMS.items():
            try:
                info = await self._js.stream_info(name)
            except nats.js.errors.NotFoundError:
                created.append(name)
                await self._js.add_stream(
                    name=name,
                    subjects=list(stream_subjects),
                    retention=(
                        js_api.RetentionPolicy.WORK_QUEUE
                        if name in subjects.WORK_QUEUE_STREAMS
                        else js_api.RetentionPolicy.LIMITS
                    ),
                    max_age=subjects.STREAM_MAX_AGE_S.get(name),
                    num_replicas=self._replicas,
                )
                continue
            config = info.config
            if update and (
                set(config.subjects or ()) != set(stream_subjects)
                or (config.num_replicas or 1) != self._replicas
            ):
                config.subjects = list(stream_subjects)
                config.num_replicas = self._replicas
                await self._js.update_stream(config)
        for bucket, history in subjects.KV_BUCKETS.items():
            await self._bucket(bucket, history=history, created=created)
            if update:
                info = await self._js.stream_info(f"KV_{bucket}")
                if (
                    info.config.allow_rollup_hdrs
                    or (info.config.num_replicas or 1) != self._replicas
                ):
                    info.config.allow_rollup_hdrs = False
                    info.config.num_replicas = self._replicas
                    await self._js.update_stream(info.config)
        meta = await self._bucket(subjects.KV_META)
        fresh = StoreEpoch(epoch=secrets.token_hex(8), created_at=time.time())
        with contextlib.suppress(nats.js.errors.KeyWrongLastSequenceError):
            await meta.create(subjects.META_EPOCH, codec.encode(fresh))  # the first one stays
        entry = await meta.get(subjects.META_EPOCH)
        self._take_epoch(codec.decode(entry.value or b"", StoreEpoch).epoch)
        return created

    async def restore_topology(self, *, reason: str) -> None:
        """Create again whatever stream or bucket is missing (one check at a time; a check
        within the last half second counts)."""
        loop = asyncio.get_running_loop()
        async with self._topology:
            if loop.time() - self._topology_at < 0.5:
                return
            self._kv.clear()
            created = await self.ensure_topology()
            self._topology_at = loop.time()
        if created:
            self.topology_restores += 1
            log.warning(
                "NATS had lost streams or buckets; created them again",
                extra={"reason": reason, "created": created},
            )

    async def _bucket(
        self, bucket: str, *, history: int | None = None, created: list[str] | None = None
    ) -> KeyValue:
        """The bucket, created when missing (named in ``created`` then)."""
        kv = self._kv.get(bucket)
        if kv is not None:
            return kv
        try:
            kv = await self._js.key_value(bucket)
        except nats.js.errors.BucketNotFoundError:
            await self._js.add_stream(
                _bucket_stream(
                    bucket, history or subjects.KV_BUCKETS.get(bucket, 1), self._replicas
                )
            )
            kv = await self._js.key_value(bucket)
            if created is not None:
                created.append(f"KV_{bucket}")
        self._kv[bucket] = kv
        return kv

    @property
    def connected(self) -> bool:
        # nats-py reports the new connection up (and flushes) before it calls our reconnected
        # callback; until then the bus still holds the lost connection's future, and a write
        # would be judged lost the moment it started. Up means both.
        return bool(self._nc.is_connected) and not self._lost.done()

    async def publish(
        self, subject: str, data: bytes, *, headers: Mapping[str, str] | None = None
    ) -> None:
        if not self._nc.is_connected:
            raise BusUnavailableError("not connected to NATS; nothing was sent")
        try:
            await self._nc.publish(subject, data, headers=dict(headers) if headers else None)
        except nats.errors.OutboundBufferLimitError:
            raise BusUnavailableError("not connected to NATS; nothing was sent") from None

    async def subscribe(self, subject: str, handler: Handler, *, queue: str = "") -> Subscription:
        async def callback(msg: NatsMsg) -> None:
            await handler(_delivery(msg, jetstream=False))

        return _NatsSubscription(await self._nc.subscribe(subject, queue=queue, cb=callback))

    async def request(self, subject: str, data: bytes, *, timeout: float) -> bytes:
        if not self._nc.is_connected:
            raise BusUnavailableError("not connected to NATS; nothing was sent")
        try:
            answer = await self._nc.request(subject, data, timeout=timeout)
        except nats.errors.NoRespondersError:
            raise NoResponderError(f"nobody answers on {subject}") from None
        except nats.errors.TimeoutError:
            raise TimeoutError(f"no answer on {subject} within {timeout:g} s") from None
        except (nats.errors.OutboundBufferLimitError, nats.errors.ConnectionReconnectingError):
            raise BusUnavailableError("not connected to NATS; nothing was sent") from None
        return bytes(answer.data)

    async def js_publish(
        self,
        subject: str,
        data: bytes,
        *,
        msg_id: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> int:
        all_headers = dict(headers or {})
        if msg_id:
            all_headers["Nats-Msg-Id"] = msg_id
        ack = await self._write(
            lambda: self._js.publish(subject, data, headers=all_headers or None)
        )
        return int(ack.seq)

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

        async def attach() -> Any:
            return await self._js.pull_subscribe(
                subject,
                durable=durable,
                stream=stream,
                config=js_api.ConsumerConfig(
                    ack_policy=js_api.AckPolicy.EXPLICIT,
                    ack_wait=ack_wait,
                    max_deliver=max_deliver,
                    max_ack_pending=max_ack_pending,
                ),
            )

        async def restore() -> None:
            await self.restore_topology(reason=f"consumer {durable} was gone")

        try:
            sub = await attach()
        except nats.js.errors.NotFoundError:
            await restore()
            sub = await attach()
        consumer = _NatsPullConsumer(sub, attach, restore)
        self._consumers.append(consumer)
        return consumer

    async def _checked_bucket(self, bucket: str) -> KeyValue:
        """The bucket, once the store reached after a reconnect has been checked."""
        await self._store_checked()
        return await self._bucket(bucket)

    async def kv_get(self, bucket: str, key: str) -> KvEntry | None:
        kv = await self._checked_bucket(bucket)
        try:
            entry = await kv.get(key)
        except nats.js.errors.KeyNotFoundError:  # includes KeyDeletedError
            return None
        return KvEntry(
            key=key, value=entry.value or b"", revision=self._revision(int(entry.revision or 0))
        )

    async def kv_put(self, bucket: str, key: str, value: bytes) -> int:
        kv = await self._checked_bucket(bucket)
        return self._revision(int(await self._write(lambda: kv.put(key, value))))

    async def kv_create(self, bucket: str, key: str, value: bytes) -> int | None:
        kv = await self._checked_bucket(bucket)
        try:
            return self._revision(int(await self._write(lambda: kv.create(key, value))))
        except nats.js.errors.KeyWrongLastSequenceError:
            return None

    async def kv_update(self, bucket: str, key: str, value: bytes, *, revision: int) -> int | None:
        kv = await self._checked_bucket(bucket)
        last = self._sequence(revision)
        if last is None:  # read from a store that was lost: that entry has moved on for good
            return None
        try:
            return self._revision(int(await self._write(lambda: kv.update(key, value, last=last))))
        except nats.js.errors.KeyWrongLastSequenceError:
            return None

    async def kv_delete(self, bucket: str, key: str) -> None:
        kv = await self._checked_bucket(bucket)
        await self._write(lambda: kv.delete(key))

    async def kv_delete_if(self, bucket: str, key: str, *, revision: int) -> bool:
        kv = await self._checked_bucket(bucket)
        last = self._sequence(revision)
        if last is None:
            return False
        try:
            await self._write(lambda: kv.delete(key, last=last))
        except nats.js.errors.APIError as error:
            if error.err_code in (10071, 10164):  # wrong last sequence: the key moved on
                return False
            raise
        return True

    async def kv_keys(self, bucket: str) -> list[str]:
        # Not nats-py's KeyValue.keys(): it ends at its watcher's "initial values done" marker,
        # which can come before the values (see _watch); this one comes after them.
        live: dict[str, bool] = {}
        async with contextlib.aclosing(self._watch(bucket, ">", headers_only=True)) as watch:
            async for entry in watch:
                if entry is None:
                    break
                live[entry.key] = not entry.deleted
        return [key for key, alive in live.items() if alive]

    def kv_watch(self, bucket: str, keys: str = ">") -> AsyncGenerator[KvEntry | None, None]:
        """Initial values, ``None``, then changes; ends (once reconnected) when the connection
        is lost. A watch does not survive a server restart: nats-py's consumer behind it may
        stay silent for many seconds after the reconnect, so callers watch again and take the
        fresh initial values (which also show what was deleted meanwhile)."""
        return self._watch(bucket, keys, headers_only=False)

    async def _watch(
        self, bucket: str, keys: str, *, headers_only: bool
    ) -> AsyncGenerator[KvEntry | None, None]:
        """The watch behind :meth:`kv_watch` and :meth:`kv_keys`: an ordered consumer over the
        bucket's stream, last value per key first.

        Where the initial values end is known, not guessed. nats-py's own watcher marks the end
        when the server reports nothing pending and no message has been read yet, or when a
        message reports nothing pending after it; the first can hold while the server has
        already sent every value (still unread in the socket), the second while a concurrent
        write makes the count move (nats.py issues 842 and 995): seen here as an empty key list
        in about 6 % of listings of a bucket of 5 keys under writes. Counting what the consumer
        holds is no better: a key written again while the values are replayed leaves its old
        place for a later one. So the keys are asked for first (the stream's subjects, deleted
        keys included, since a deletion is a message too), and the initial values are done once
        each of them has been delivered, whatever its place.
        """
        subject = f"$KV.{bucket}.{keys}"
        stream = f"KV_{bucket}"
        await self._checked_bucket(bucket)
        try:
            existing = await self._js.stream_info(stream, subjects_filter=subject)
        except nats.js.errors.NotFoundError:  # gone since the bucket was looked up: create it
            await self.restore_topology(reason=f"watching {bucket}")
            await self._bucket(bucket)
            existing = await self._js.stream_info(stream, subjects_filter=subject)
        awaited = set(existing.state.subjects or ())
        # Bounded, as nats-py's own watcher: a slow reader holds the messages back in nats-py.
        arrived: asyncio.Queue[NatsMsg] = asyncio.Queue(maxsize=256)
        subscription = await self._js.subscribe(
            subject,
            stream=stream,
            cb=arrived.put,
            ordered_consumer=True,
            deliver_policy=js_api.DeliverPolicy.LAST_PER_SUBJECT,
            headers_only=headers_only or None,
            # The server keeps a consumer nobody listens to this long; each is deleted on close
            # as well, since a stream holds at most 1,000 of them (with nats-py's 5 minutes,
            # the 1,001st listing within 5 minutes failed).
            inactive_threshold=WATCH_INACTIVE_S,
            idle_heartbeat=WATCH_HEARTBEAT_S,
        )
        prefix = len(f"$KV.{bucket}.")
        lost = self._lost
        following: asyncio.Future[Any] | None = None
        consumer = ""
        try:
            consumer = (await subscription.consumer_info()).name
            if not awaited:
                yield None
            while True:
                checkpoint()  # nats-py's requests above may have swallowed a stop's cancel
                if arrived.empty():
                    following = asyncio.ensure_future(arrived.get())
                    await asyncio.wait({following, lost}, return_when=asyncio.FIRST_COMPLETED)
                    if not following.done():
                        await cancel_and_wait(following)
                        await self._reconnected()
                        return
                    msg = following.result()
                else:  # one at hand: no need to watch for a loss
                    msg = arrived.get_nowait()
                headers = msg.headers or {}
                yield KvEntry(
                    key=msg.subject[prefix:],
                    value=msg.data or b"",
                    revision=self._revision(int(msg.metadata.sequence.stream)),
                    deleted=headers.get("KV-Operation") in ("DEL", "PURGE")
                    or "Nats-Marker-Reason" in headers,
                )
                if awaited:
                    awaited.discard(msg.subject)
                    if not awaited:
                        yield None
        finally:
            if following is not None and not following.done():
                await cancel_and_wait(following)
            # Bounded: a stop that cannot reach the server must not hold up a shutdown.
            with contextlib.suppress(nats.errors.Error, TimeoutError):
                async with asyncio.timeout(2.0):
                    await subscription.unsubscribe()
                if consumer:
                    async with asyncio.timeout(2.0):
                        await self._js.delete_consumer(stream, consumer)

    async def _reconnected(self) -> None:
        """Return once the connection is up again (or closed for good)."""
        await self._up.wait()

    async def drain(self) -> None:
        self._draining = True
        for task in list(self._background):
            await cancel_and_wait(task)
        for consumer in self._consumers:
            await consumer.close()
        if self._nc.is_closed:
            return
        try:
            async with asyncio.timeout(5.0):
                await self._nc.drain()
        except (TimeoutError, nats.errors.Error):
            await self._nc.close()
