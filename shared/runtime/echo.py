"""A compare-and-set sent with no answer from the server (``Bus.kv_send``), waiting for its
writer's own KV watch to show what became of it.

The server stores a key's versions in order and a compare-and-set lands only on the version it
names, so the first version the watch shows above the one written over is this write (landed)
or the one that beat it (lost). Shown none in time, shown one of another store, or the
connection dropped meanwhile, the outcome is unknown and the writer reads the key back, as for a
write whose answer was lost. Used by the record mirror (``shared.runtime.records``) and the
placer's claims and bookings (``services.placer.kvwrites``; a booking is guarded by its node's
bookings, and any of them shown first above the guard settles it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Final

from shared.runtime.bus import Bus, OutcomeUnknownError

CONNECTION_CHECK_S: Final = 0.05
"""How often a write waiting for its version looks whether the NATS connection is still up
(nats-py reconnects a second or more after it noticed a loss)."""


class EchoWait:
    """One unanswered write of ``key`` over revision ``above``, sent into the store of
    ``epoch``: :meth:`settle` takes each version the watch shows, :meth:`result` waits."""

    def __init__(self, key: str, *, above: int, value: bytes, epoch: str) -> None:
        self.key = key
        self.above = above
        """The revision it wrote over."""
        self.value = value
        self.epoch = epoch
        """The store's epoch when it was sent."""
        self.outcome: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()

    def settle(self, revision: int, value: bytes | None, *, epoch: str) -> None:
        """The watch shows the key at ``revision`` (``value`` None: deleted), the bus being on
        the store of ``epoch``: the outcome, if this is the first version above ``above``."""
        if revision <= self.above or self.outcome.done():
            return
        if epoch != self.epoch:
            lost = f"NATS lost its store while {self.key} was written; read it back"
            self.outcome.set_exception(OutcomeUnknownError(lost))
        else:
            self.outcome.set_result(revision if value == self.value else None)

    async def send(
        self,
        bus: Bus,
        bucket: str,
        *,
        seen_s: float,
        create: bool = False,
        guard: str = "",
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> int | None:
        """Send the write over ``above`` with no answer (``Bus.kv_send``; ``create``, ``guard``
        as there), then wait for what the watch shows (:meth:`result`). None also when it was
        not sent because it cannot land (``above`` is of a store that was lost). The wait is
        registered where the watch settles it before this is called: the watch may show the
        write before ``kv_send`` returns."""
        sent = await bus.kv_send(
            bucket, self.key, self.value, revision=self.above, create=create, guard=guard
        )
        if not sent:
            return None
        return await self.result(bus, seen_s=seen_s, sleep=sleep)

    async def result(
        self,
        bus: Bus,
        *,
        seen_s: float,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> int | None:
        """The revision the write landed at, or None when another version came first, as the
        watch shows within ``seen_s`` (timed by ``sleep``). A connection that drops meanwhile
        makes it unknown at once, as it does a write waiting for its answer: nats-py sends what
        was written but not flushed again once it reconnects, maybe to a new store, and a caller
        reading it back must not take that for this write landing where it was meant to."""
        deadline = asyncio.ensure_future(sleep(seen_s))
        try:
            while not self.outcome.done():
                if deadline.done() or not bus.connected:
                    why = (
                        f"{seen_s:g} s passed" if deadline.done() else "the NATS connection dropped"
                    )
                    raise OutcomeUnknownError(
                        f"{why} before a version of {self.key} above revision {self.above} was "
                        "seen; the write may or may not have landed (read it back)"
                    )
                await asyncio.wait(
                    (self.outcome, deadline),
                    timeout=CONNECTION_CHECK_S,
                    return_when=asyncio.FIRST_COMPLETED,
                )
        finally:
            deadline.cancel()
        return self.outcome.result()
