"""nats-py's client, with its writes to the socket gathered over a short wait.

nats-py hands every publish to one flusher task, which writes whatever is pending to the socket
as soon as it runs: in a burst nearly every publish of a placer or the binder went out in a
write of its own, each a system call that also wakes nats-server, and the socket writes were
about 15 % of a placer's CPU in ``benchmarks/e2e.py``. :class:`CoalescingClient` lets the flusher
wait ``coalesce_s`` after a publish asks for a write, so the publishes of that moment (other
pods' bookings, claims and acks) go out in one write, and nats-server reads them at once.

The wait delays each message by up to ``coalesce_s``; the per-node services, whose device
plugin answers the kubelet's Allocate, connect without it (``shared.runtime.lifecycle``).
The flusher is nats-py's loop (``Client._flusher`` of the version the lock pins) with the wait
added; ``tests/shared/test_nats_writes.py`` counts the writes, so a nats-py that stopped calling
it would fail there rather than silently write message by message. nats-py writes a PING (a
``flush()``, its keep-alive) straight to the socket, ahead of what is still pending; here it
queues behind that, so a ``flush()`` still returns only once the server has read every publish
made before it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from nats.aio.client import PING_PROTO
from nats.aio.client import Client as NatsClient


class CoalescingClient(NatsClient):
    """A nats-py client whose flusher waits ``coalesce_s`` before each write (0: at once, as
    nats-py does); ``socket_writes`` counts its writes."""

    def __init__(self, *, coalesce_s: float = 0.0) -> None:
        super().__init__()
        self.coalesce_s = coalesce_s
        self.socket_writes = 0

    async def _flusher(self) -> None:
        assert self._transport, "Client.connect must be called first"
        assert self._flush_queue, "Client.connect must be called first"
        while True:
            if not self.is_connected or self.is_connecting:
                break
            asked = [await self._flush_queue.get()]
            try:
                if self.coalesce_s > 0:
                    await asyncio.sleep(self.coalesce_s)
                    while not self._flush_queue.empty():  # kicked again meanwhile: one write
                        asked.append(self._flush_queue.get_nowait())
                if self._pending_data_size > 0:
                    self._transport.writelines(self._pending[:])
                    self._pending = []
                    self._pending_data_size = 0
                    self.socket_writes += 1
                    await self._transport.drain()  # type: ignore[no-untyped-call]
            except OSError as error:
                await self._error_cb(error)
                await self._process_op_err(error)
                break
            except (asyncio.CancelledError, RuntimeError, AttributeError):
                break  # cancelled by a close or a reconnect, or the loop is closing
            finally:
                for future in asked:
                    if not future.done():  # one may have been cancelled (nats-py issue 624)
                        future.set_result(None)

    async def _send_ping(self, future: asyncio.Future[Any] | None = None) -> None:
        if future is None:
            future = asyncio.get_running_loop().create_future()
        self._pongs.append(future)
        self._pending.append(PING_PROTO)  # behind the publishes before it, in the same write
        self._pending_data_size += len(PING_PROTO)
        await self._flush_pending()
