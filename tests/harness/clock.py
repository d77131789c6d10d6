"""A fake clock tests advance by hand; ``sleep`` returns when the clock has been advanced."""

from __future__ import annotations

import asyncio


class FakeClock:
    """Implements ``shared.clock.Clock``; time moves only through :meth:`advance`."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start
        self._mono = 0.0
        self._waiters: list[tuple[float, asyncio.Future[None]]] = []

    def now(self) -> float:
        return self._now

    def monotonic(self) -> float:
        return self._mono

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((self._mono + seconds, future))
        await future

    async def advance(self, seconds: float) -> None:
        """Move time forward and wake every sleeper whose deadline passed."""
        self._now += seconds
        self._mono += seconds
        due = [(t, f) for t, f in self._waiters if t <= self._mono]
        self._waiters = [(t, f) for t, f in self._waiters if t > self._mono]
        for _, future in sorted(due, key=lambda item: item[0]):
            if not future.done():
                future.set_result(None)
        # let woken tasks run
        for _ in range(5):
            await asyncio.sleep(0)

    @property
    def sleepers(self) -> int:
        return sum(1 for _, f in self._waiters if not f.done())
