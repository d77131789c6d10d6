"""The NATS adapter put together: :class:`NatsBus`, its first connection and its drain."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import nats.errors

from shared.config import NatsSecurity, redact_url
from shared.runtime.bus import WATCH_HEARTBEAT_S
from shared.runtime.nats.client import CoalescingClient
from shared.runtime.nats.connection import (
    DEFAULT_INBOX_PREFIX,
    NatsRefusedError,
    NatsUnreachableError,
    _tls_context,
    log,
    refusal_of,
    unreachable_reason,
)
from shared.runtime.nats.kv import NatsKv
from shared.runtime.nats.messaging import NatsMessaging
from shared.runtime.tasks import cancel_and_wait


class NatsBus(NatsKv, NatsMessaging):
    """The Bus over a real NATS server with JetStream (implements ``ConnectionMonitor`` too)."""

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
        create_epoch: bool = True,
        watch_heartbeat_s: float = WATCH_HEARTBEAT_S,
        write_coalesce_s: float = 0.0,
    ) -> NatsBus:
        """Connect once, then reconnect forever after any later loss; ensure streams and buckets
        (``replicas`` copies of each; none when ``topology`` is False: a client that only asks
        questions, ``tessera explain``). ``url`` may name several servers of a cluster,
        separated by commas.

        ``inbox_prefix``: where replies to this client go (``shared.permissions.inbox_prefix``:
        a service's identity may only listen under its own). ``update_topology``: whether this
        client may change an existing stream's or bucket's configuration; one that may not only
        creates what is missing (see :meth:`ensure_topology`). ``create_epoch``: whether it may
        give a new store its epoch (``shared.permissions.creates_store``); one that may not
        waits, its connection refused as not ready, until a client that may has.
        ``watch_heartbeat_s``: the server's idle heartbeat on each KV watch
        (``shared.runtime.bus``). ``write_coalesce_s``: how long a write to the socket waits for
        the publishes after it (``shared.runtime.nats.client``; 0: none).

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

        client = CoalescingClient(coalesce_s=write_coalesce_s)

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
        bus._create_epoch = create_epoch
        bus.watch_heartbeat_s = watch_heartbeat_s
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
