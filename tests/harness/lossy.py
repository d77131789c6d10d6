"""A real bus that loses one answer: NATS failing between a write and its reply, as a cluster
electing its leaders does (the chaos runs' races), made exact for a test."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from typing import Any

from shared import subjects
from shared.runtime.bus import BusUnavailableError, KvEntry, OutcomeUnknownError
from shared.runtime.nats import NatsBus


class LostAnswerBus:
    """The real bus, except that the answer to the first write (create or compare-and-set) of an
    assignment record is lost (the write lands first when ``lands``), and the next ``unreadable``
    reads of assignment records fail as when NATS is still unreachable (set it to 0 when NATS is
    back). A write the server does not answer (``kv_send``) is answered by the writer's watch:
    there, the first one's version never reaches a watch."""

    def __init__(self, bus: NatsBus, *, lands: bool, unreadable: int) -> None:
        self._bus = bus
        self._lands = lands
        self._lose_next = True
        self._unseen: set[bytes] = set()
        self.unreadable = unreadable

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bus, name)

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
        if self._lose_next and bucket == subjects.KV_ASSIGNMENTS:
            self._lose_next = False
            self._unseen.add(value)
            if self._lands:
                await self._bus.kv_send(
                    bucket, key, value, revision=revision, create=create, guard=guard
                )
            return True
        return await self._bus.kv_send(
            bucket, key, value, revision=revision, create=create, guard=guard
        )

    def kv_watch(
        self, bucket: str, keys: str = ">", *, batch_s: float = 0.0
    ) -> AsyncGenerator[KvEntry | None, None]:
        watch = self._bus.kv_watch(bucket, keys, batch_s=batch_s)
        return self._without_unseen(watch) if bucket == subjects.KV_ASSIGNMENTS else watch

    async def _without_unseen(
        self, watch: AsyncGenerator[KvEntry | None, None]
    ) -> AsyncGenerator[KvEntry | None, None]:
        async with contextlib.aclosing(watch):
            async for entry in watch:
                if entry is None or entry.value not in self._unseen:
                    yield entry

    async def kv_update(self, bucket: str, key: str, value: bytes, *, revision: int) -> int | None:
        if self._lose_next and bucket == subjects.KV_ASSIGNMENTS:
            self._lose_next = False
            if self._lands:
                await self._bus.kv_update(bucket, key, value, revision=revision)
            raise OutcomeUnknownError("the answer was lost (test)")
        return await self._bus.kv_update(bucket, key, value, revision=revision)

    async def kv_create(self, bucket: str, key: str, value: bytes) -> int | None:
        if self._lose_next and bucket == subjects.KV_ASSIGNMENTS:
            self._lose_next = False
            if self._lands:
                await self._bus.kv_create(bucket, key, value)
            raise OutcomeUnknownError("the answer was lost (test)")
        return await self._bus.kv_create(bucket, key, value)

    async def kv_get(self, bucket: str, key: str) -> Any:
        if self.unreadable > 0 and bucket == subjects.KV_ASSIGNMENTS:
            self.unreadable -= 1
            raise BusUnavailableError("not connected to NATS (test)")
        return await self._bus.kv_get(bucket, key)
