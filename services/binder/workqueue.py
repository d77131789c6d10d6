"""A de-duplicating work queue (client-go's workqueue): an item added while queued is queued
once; one added while being processed is processed again afterwards, never twice at once.

Informer handlers add keys (pod uids, node names); workers take a key, look at the *current*
state for it and act, so bursts of changes to one object cost one action.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class WorkQueue(Generic[T]):
    def __init__(self) -> None:
        self._queue: deque[T] = deque()
        self._dirty: set[T] = set()
        self._processing: set[T] = set()
        self._ready = asyncio.Event()

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, item: T) -> None:
        if item in self._dirty:
            return
        self._dirty.add(item)
        if item not in self._processing:
            self._queue.append(item)
            self._ready.set()

    async def get(self) -> T:
        """The next item; call :meth:`done` with it when finished."""
        while not self._queue:
            self._ready.clear()
            await self._ready.wait()
        item = self._queue.popleft()
        self._dirty.discard(item)
        self._processing.add(item)
        return item

    def done(self, item: T) -> None:
        self._processing.discard(item)
        if item in self._dirty:
            self._queue.append(item)
            self._ready.set()

    def idle(self) -> bool:
        """Nothing queued and nothing being processed."""
        return not self._queue and not self._processing
