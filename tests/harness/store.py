"""What the binder says of a NATS store, for tests that run placers without a binder."""

from __future__ import annotations

import time

from shared import codec, subjects
from shared.messages.epoch import StoreEpoch, StoreRestored
from shared.runtime.bus import Bus


async def mark_restored(bus: Bus) -> None:
    """Say, as the leading binder does, that the store holds every bound placement (there are
    none here): placers decide nothing before (docs/design.md §12)."""
    entry = await bus.kv_get(subjects.KV_META, subjects.META_EPOCH)
    assert entry is not None, "the bus creates the store's epoch with its streams"
    restored = StoreRestored(
        epoch=codec.decode(entry.value, StoreEpoch).epoch,
        restored_at=time.time(),
        pods=0,
        binder="test",
    )
    await bus.kv_put(subjects.KV_META, subjects.META_RESTORED, codec.encode(restored))
