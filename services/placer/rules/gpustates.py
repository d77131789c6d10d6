"""A node's GPUs as the core's :class:`GpuState` values, kept between derives (pure: no I/O).

:func:`gpu_states` sums what the bookings (and the claims another allocator made) hold of each
GPU of the inventory, and builds a state only for a GPU whose sums or telemetry changed since the
node's last derive: the rest are the objects that derive made (:class:`GpuMemo`). The rules they
apply (foreign memory, health, logical devices, memory units, live readings) are
``translate.py``'s, which derives the rest of the node.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import msgspec

from services.placer.core.model import GpuState
from shared.messages.inventory import GpuTelemetry, NodeInventory
from shared.messages.ledger import BookedSlice, Booking
from shared.messages.nodes import ClaimedGpu

FOREIGN_STEP_MIB = 256
UTILIZATION_STEP_PCT = 10


def slot_limits(memory_mib: Sequence[int], total: int) -> list[int]:
    """``total`` logical devices split over GPUs of ``memory_mib`` (largest remainder)."""
    if not memory_mib:
        return []
    weights = [max(1, m) for m in memory_mib]
    whole = sum(weights)
    exact = [total * w / whole for w in weights]
    slots = [math.floor(x) for x in exact]
    left = total - sum(slots)
    by_remainder = sorted(range(len(exact)), key=lambda i: (slots[i] - exact[i], i))
    for i in by_remainder[:left]:
        slots[i] += 1
    return slots


GpuSums = tuple[int, int, int, bool, tuple[str, ...]]
"""What the bookings hold of one GPU: memory, cores, shares, exclusive, holders (sorted)."""
_NOTHING_HELD: GpuSums = (0, 0, 0, False, ())


class GpuMemo(msgspec.Struct, gc=False, kw_only=True):
    """What ``translate.node_state`` kept of one node's GPUs from its last call, so that the
    next one builds only what changed (a node is derived again at each booking on it, its other
    GPUs unchanged): the inventory's GPUs as the node's state counts them (sorted, memory units
    and health applied), their slot limits and NVLink peers, and each GPU's state with the
    bookings' sums it was built from. It holds while the inventory is the same object and the node's
    allocatable devices are the same; the caller keeps one per node (``indexes.NodeIndexes``).

    Invisible to the garbage collector, as a node's state is (``tests/shared/test_untracked.py``):
    a placer keeps one per node, and what it holds are frozen values and tuples of them, so no
    reference cycle can run through it though it changes."""

    inventory: NodeInventory | None = None
    advertised: int | None = None
    units: int | None = None
    gpus: tuple[GpuTelemetry, ...] = ()
    slots: tuple[int, ...] | None = None
    peers: tuple[tuple[int, ...], ...] = ()
    sums: tuple[GpuSums, ...] = ()
    """Per GPU: what the bookings held of it when its state in :attr:`states` was built (empty:
    none built yet)."""
    states: tuple[GpuState, ...] = ()

    def reset(
        self, inventory: NodeInventory | None, advertised: int | None, units: int | None
    ) -> None:
        """Take the GPUs of ``inventory`` with these allocatable counts, no state built yet."""
        self.inventory = inventory
        self.advertised = advertised
        self.units = units
        gpus = sorted(inventory.gpus, key=lambda g: (g.index, g.uuid)) if inventory else []
        total = [g.memory_total_mib for g in gpus]
        self.slots = tuple(slot_limits(total, advertised)) if advertised else None
        if units:
            addressable = slot_limits(total, units)
            gpus = [
                msgspec.structs.replace(g, memory_total_mib=min(g.memory_total_mib, limit))
                for g, limit in zip(gpus, addressable, strict=True)
            ]
        if advertised == 0 or units == 0:
            # The kubelet's allocatable counts healthy devices: none means every GPU is unusable
            # now (its device plugin is gone or lists nothing), and a pod bound there would be
            # rejected at admission.
            gpus = [msgspec.structs.replace(g, health="unhealthy") for g in gpus]
        self.gpus = tuple(gpus)
        index_of = {gpu.uuid: gpu.index for gpu in gpus}
        self.peers = tuple(
            tuple(sorted(index_of[peer] for peer in gpu.nvlink_peers if peer in index_of))
            for gpu in gpus
        )
        self.sums = ()
        self.states = ()

    def holds(
        self, inventory: NodeInventory | None, advertised: int | None, units: int | None
    ) -> bool:
        """Whether this memo's GPUs are those of ``inventory`` with these allocatable counts."""
        return self.inventory is inventory and self.advertised == advertised and self.units == units


def gpu_states(
    memo: GpuMemo, bookings: Sequence[Booking], claimed: Sequence[ClaimedGpu] = ()
) -> tuple[GpuState, ...]:
    # Per GPU index: [memory, cores, shares, exclusive, holders], one lookup a piece.
    held: dict[int, list[Any]] = {}
    pieces: list[tuple[str, BookedSlice | ClaimedGpu]] = [
        (b.pod_uid, piece) for b in bookings for c in b.containers for piece in c.gpus
    ]
    if claimed:
        pieces += [(f"resourceclaims/{c.claim}", c) for c in claimed]
    for holder, piece in pieces:
        acc = held.get(piece.index)
        if acc is None:
            held[piece.index] = [
                piece.memory_mib,
                piece.core_milli,
                1,
                piece.exclusive,
                {holder},
            ]
        else:
            acc[0] += piece.memory_mib
            acc[1] += piece.core_milli
            acc[2] += 1
            acc[3] = acc[3] or piece.exclusive
            acc[4].add(holder)
    slots, peers = memo.slots, memo.peers
    built_sums, built = memo.sums, memo.states
    sums_now: list[GpuSums] = []
    states: list[GpuState] = []
    for position, gpu in enumerate(memo.gpus):
        found = held.get(gpu.index)
        sums: GpuSums = (
            _NOTHING_HELD
            if found is None
            else (found[0], found[1], found[2], found[3], tuple(sorted(found[4])))
        )
        if built and built_sums[position] == sums:
            state = built[position]
        else:
            slot = slots[position] if slots is not None else None
            state = _gpu_state(gpu, sums, slot, peers[position])
        sums_now.append(sums)
        states.append(state)
    memo.sums = tuple(sums_now)
    memo.states = tuple(states)
    return memo.states


def _gpu_state(
    gpu: GpuTelemetry,
    sums: GpuSums,
    slots: int | None,
    peers: tuple[int, ...],
) -> GpuState:
    reserved, cores, shares, exclusive, holders = sums
    foreign = max(0, gpu.memory_used_mib - reserved)
    foreign = -(-foreign // FOREIGN_STEP_MIB) * FOREIGN_STEP_MIB
    utilization = min(100, max(0, gpu.utilization_pct))
    return GpuState(
        index=gpu.index,
        uuid=gpu.uuid,
        model=gpu.model,
        memory_total_mib=gpu.memory_total_mib,
        memory_reserved_mib=reserved,
        memory_foreign_mib=foreign,
        core_milli_reserved=cores,
        slots_total=slots if slots is not None else 0,
        slots_reserved=shares if slots is not None else 0,
        exclusive=exclusive,
        healthy=gpu.health == "healthy",
        utilization_pct=utilization // UTILIZATION_STEP_PCT * UTILIZATION_STEP_PCT,
        numa_node=-1 if gpu.numa_node is None else gpu.numa_node,
        pci_bus_id=gpu.pci_bus_id,
        pcie_root=gpu.pcie_root,
        nvlink_peers=peers,
        holders=holders,
    )
