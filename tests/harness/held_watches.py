"""A real bus whose KV watches of some keys, once held, start again only when the test lets
them: a service's watch that comes back late after NATS lost its store (its follow loop backs
off while JetStream is slow to start on the restarted server), made exact for a test."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from typing import Any

from shared.runtime.bus import Bus, KvEntry


class HeldWatches:
    """Wraps a service's bus (:meth:`wrap`); :meth:`hold` keeps every watch started from then on
    whose ``(bucket, keys)`` is one of ``watches`` waiting (the ones running go on) until
    :meth:`release`. Watches are told apart by their keys too: the claims and the bookings are
    one bucket."""

    def __init__(self, *, watches: set[tuple[str, str]]) -> None:
        self._watches = watches
        self._released = asyncio.Event()
        self._released.set()
        self.waiting = 0
        """How many watches wait to start now."""

    def hold(self) -> None:
        self._released.clear()

    def release(self) -> None:
        self._released.set()

    def wrap(self, bus: Bus) -> Bus:
        return _HeldBus(bus, self)

    async def watch(
        self, bus: Bus, bucket: str, keys: str, batch_s: float
    ) -> AsyncGenerator[KvEntry | None, None]:
        if (bucket, keys) in self._watches and not self._released.is_set():
            self.waiting += 1
            try:
                await self._released.wait()
            finally:
                self.waiting -= 1
        async with contextlib.aclosing(bus.kv_watch(bucket, keys, batch_s=batch_s)) as watch:
            async for entry in watch:
                yield entry


class _HeldBus:
    """The wrapped bus: everything but ``kv_watch`` goes straight through."""

    def __init__(self, bus: Bus, held: HeldWatches) -> None:
        self._bus = bus
        self._held = held

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bus, name)

    @property
    def store_epoch(self) -> str:
        return self._bus.store_epoch

    def kv_watch(
        self, bucket: str, keys: str = ">", *, batch_s: float = 0.0
    ) -> AsyncGenerator[KvEntry | None, None]:
        return self._held.watch(self._bus, bucket, keys, batch_s)
