"""The store behind the NATS connection (the second layer of :class:`~shared.runtime.nats.NatsBus`):
every stream and KV bucket Tessera uses (created again when missing), the store's epoch, the
revisions reported across a lost store, and how one write is run (refused while disconnected,
its outcome unknown when the connection drops before the answer).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.js import api as js_api
from nats.js.kv import KeyValue

from shared import codec, subjects
from shared.messages.epoch import StoreEpoch
from shared.runtime.bus import (
    WATCH_HEARTBEAT_S,
    BusUnavailableError,
    OutcomeUnknownError,
    StoreRefusedError,
)
from shared.runtime.nats.connection import NatsConnection, log

T = TypeVar("T")


def _bucket_stream(bucket: str, history: int, replicas: int) -> js_api.StreamConfig:
    """The stream of a KV bucket as nats-py's ``create_key_value`` makes it, except that it
    refuses rollups: a ``Nats-Rollup: all`` header on a write to any one key would otherwise
    purge the whole bucket, so an identity allowed to write only its own node's keys could wipe
    every node's records. Tessera never purges a key (deletes are delete markers). Atomic
    batches are allowed (``Bus.kv_write_all``)."""
    return js_api.StreamConfig(
        name=f"KV_{bucket}",
        subjects=[f"$KV.{bucket}.>"],
        allow_direct=False,
        allow_rollup_hdrs=False,
        allow_atomic=True,
        deny_delete=True,
        discard=js_api.DiscardPolicy.NEW,
        duplicate_window=120.0,
        max_consumers=-1,
        max_msgs=-1,
        max_msgs_per_subject=history,
        num_replicas=replicas,
    )


_MISSING = (nats.js.errors.NoStreamResponseError, nats.js.errors.ServiceUnavailableError)
"""What nats-py raises when the stream (or consumer) an operation needs does not exist: a
JetStream publish nobody stores, a pull request nobody answers."""


WRONG_LAST_SEQUENCE = 10071
"""JetStream's error code for a message whose expected last sequence (of the stream, or of a
subject) is not the server's: it was not stored."""

_REFUSALS = (10077, 10047)
"""JetStream error codes of a message it refused to store: the stream's store failed (message,
byte or per-subject limit reached with ``discard: new``), insufficient resources."""


def refusal(error: BaseException) -> str:
    """The server's description when ``error`` is JetStream refusing to store a message (it
    answers 503, which nats-py raises as a missing stream would be: ``_MISSING``), else ""."""
    if isinstance(error, nats.js.errors.APIError) and error.err_code in _REFUSALS:
        return str(error.description or f"error {error.err_code}")
    return ""


_DISCONNECTED = (nats.errors.OutboundBufferLimitError, nats.errors.ConnectionReconnectingError)
"""What nats-py raises for a request or a publish while it reconnects: the bus connects with no
buffer for them (``pending_size=0``), so nothing was sent."""


@contextlib.contextmanager
def unavailable(what: str) -> Iterator[None]:
    """A JetStream request before anything was written or read that times out or finds no
    responder (a cluster electing its leaders), or that is made while the connection is down, is
    NATS unavailable: :class:`BusUnavailableError` saying ``what``, which every caller handles,
    rather than nats-py's own error (a read during a reconnect raised "outbound buffer limit
    exceeded")."""
    try:
        yield
    except _DISCONNECTED:
        raise BusUnavailableError(f"{what}: not connected to NATS; nothing was done") from None
    except (nats.errors.TimeoutError, nats.errors.NoRespondersError, *_MISSING) as error:
        raise BusUnavailableError(
            f"{what} ({type(error).__name__}: {error}); nothing was done"
        ) from None


class NatsStore(NatsConnection):
    """The connection, and the store it reaches: topology, epoch, revisions, writes."""

    def __init__(
        self, client: NatsClient, *, request_timeout: float = 5.0, replicas: int = 1
    ) -> None:
        super().__init__(client)
        self._js = client.jetstream(timeout=request_timeout)
        self._replicas = replicas
        self._update_topology = True
        self._create_epoch = True
        """Whether this client may give a new store its epoch (``shared.permissions``: only the
        identities that create the store do); one that may not waits for it."""
        self.watch_heartbeat_s = WATCH_HEARTBEAT_S
        """The server's idle heartbeat on each KV watch (``shared.runtime.bus``)."""
        self._kv: dict[str, KeyValue] = {}
        self._topology = asyncio.Lock()
        self._topology_at = -1.0
        self.topology_restores = 0
        """How many times streams or buckets were found missing and created again."""
        self._background: set[asyncio.Task[None]] = set()
        self._epoch = ""
        self._renewed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        """Resolved (and replaced) when the bus takes a new store's epoch: it wakes every watch
        started before, which then ends (``NatsKv._watch``)."""
        self._revision_base = 0
        """Added to the new store's revisions, so that they count above the lost store's."""
        self._last_revision = 0
        """The highest revision reported so far."""

    def _on_reconnect(self) -> None:
        super()._on_reconnect()
        # The server may have come back without its store: create what is missing at once.
        task = asyncio.get_running_loop().create_task(self._restore_after_reconnect())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _restore_after_reconnect(self) -> None:
        """Take the epoch of the store the connection came back to before any KV operation
        runs again, then create whatever that store lacks (again and again until it is done)."""
        delay = 0.2
        while not self._draining:
            try:
                async with self._topology:
                    self._kv.clear()
                    # The epoch first: it tells a new store from the old one, which is all KV
                    # operations wait for. What is missing is created next, or by the first
                    # operation that needs it. Checked all at once, one stream slow to answer
                    # (its leader still elected after a server loss) held every KV operation
                    # of a device plugin back for 25 s, failing the pods sent to its node.
                    await self._read_epoch()
                    self._checked.set()
                    await self.ensure_topology()
                    self._topology_at = asyncio.get_running_loop().time()
                return
            except Exception as error:  # JetStream not up yet on the server: try again shortly
                log.info("cannot check the streams yet", extra={"error": repr(error)})
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    @property
    def store_epoch(self) -> str:
        return self._epoch

    def _take_epoch(self, epoch: str) -> None:
        """Take ``epoch`` as the store's. A new one (NATS lost its store) ends every watch
        started before: what a watch read and what it reads on are then of one store, the one
        :attr:`store_epoch` names (a watch started on the new store before the epoch was taken,
        a store replaced behind a live connection, read its values under the lost store's)."""
        if self._epoch and epoch != self._epoch:
            self._revision_base = self._last_revision + 1
            log.warning(
                "NATS lost its store: a new, empty one is in use; what is bound is restored "
                "into it from the Kubernetes API",
                extra={"epoch": epoch, "previous_epoch": self._epoch},
            )
            self._epoch = epoch
            renewed, self._renewed = self._renewed, asyncio.get_running_loop().create_future()
            renewed.set_result(None)
            return
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
        except _DISCONNECTED:
            raise BusUnavailableError("not connected to NATS; nothing was sent") from None
        except _MISSING as error:
            refused = refusal(error)
            if refused:
                raise StoreRefusedError(
                    f"JetStream refused to store it ({refused}); nothing was stored"
                ) from None
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
                    or not info.config.allow_atomic
                    or (info.config.num_replicas or 1) != self._replicas
                ):
                    info.config.allow_rollup_hdrs = False
                    info.config.allow_atomic = True
                    info.config.num_replicas = self._replicas
                    await self._js.update_stream(info.config)
        await self._read_epoch()
        return created

    async def _read_epoch(self) -> None:
        """Take the store's epoch. A new store gets one from the first client that may create
        it (the first writer's stays); a client that may not (a node's device plugin or
        inventory, the dashboard: one that could write it could make every service believe the
        store lost at its next reconnect) waits until one that may has: BusUnavailableError."""
        meta = await self._bucket(subjects.KV_META)
        if self._create_epoch:
            fresh = StoreEpoch(epoch=secrets.token_hex(8), created_at=time.time())
            with contextlib.suppress(nats.js.errors.KeyWrongLastSequenceError):
                await meta.create(subjects.META_EPOCH, codec.encode(fresh))
        try:
            entry = await meta.get(subjects.META_EPOCH)
        except nats.js.errors.KeyNotFoundError:
            raise BusUnavailableError(
                "the NATS store has no epoch yet (a placer or the binder gives a new store its "
                "epoch); nothing was done"
            ) from None
        self._take_epoch(codec.decode(entry.value or b"", StoreEpoch).epoch)

    async def restore_topology(self, *, reason: str) -> None:
        """Create again whatever stream or bucket is missing (one check at a time; a check
        within the last half second counts). A check NATS does not answer (a cluster electing)
        is NATS unavailable: nats-py's timeout, let through from a placer's pool lease write
        that found no stream, stopped all three placers of a three-server chaos run."""
        loop = asyncio.get_running_loop()
        async with self._topology:
            if loop.time() - self._topology_at < 0.5:
                return
            self._kv.clear()
            with unavailable(f"NATS cannot be checked for lost streams now ({reason})"):
                created = await self.ensure_topology()
            self._topology_at = loop.time()
        if created:
            self.topology_restores += 1
            log.warning(
                "NATS had lost streams or buckets; created them again",
                extra={"reason": reason, "recreated": created},
            )

    async def _look_for_lost_store(self, reason: str) -> None:
        """A watch lost its consumer while the connection stayed up: the store may have been
        replaced behind it (its streams deleted and created again by another client, which a
        reconnect would have shown). Check it as after a reconnect, so the next watch runs
        under the new store's epoch; NATS unable to answer now (a cluster electing) is left to
        the next check."""
        try:
            await self.restore_topology(reason=reason)
        except Exception as error:  # NATS unavailable or refusing: the watch fails as it was
            log.info("cannot look for a lost store now", extra={"error": repr(error)})

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

    async def _checked_bucket(self, bucket: str) -> KeyValue:
        """The bucket, once the store reached after a reconnect has been checked.

        Looking a bucket up is a JetStream request of its own (after a reconnect, or once the
        topology was restored), which times out or finds no responder while a cluster elects
        its leaders: that is NATS unavailable, nothing done. Let through raw, nats-py's timeout
        passed every handler of a placer's pool leases and stopped all three placers of a
        three-server chaos run."""
        await self._store_checked()
        with unavailable(f"bucket {bucket} cannot be looked up now"):
            return await self._bucket(bucket)
