"""The assume ledger: book a decision on a node at once, give it back exactly once.

``book`` and ``unbook`` are pure functions from a node and a reservation to the node's next state.
``book`` refuses (returns the reason as a string) any reservation that would over-commit CPU,
memory, or a GPU's memory, cores or slots, or that lands on an unhealthy or exclusively held GPU:
over-commit is impossible by construction, whatever the caller computed. :class:`Ledger` keeps the
reservations by pod UID so that ``reserve`` of a pod already booked and ``release`` of a pod not
booked are no-ops (redelivered messages, a deletion after a failed bind).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import msgspec

from services.placer.core.model import GPU_MILLI, GpuSlice, GpuState, NodeState, Reservation


def _slices(reservation: Reservation) -> Iterator[GpuSlice]:
    for container in reservation.containers:
        yield from container.gpus


def take_share(gpu: GpuState, piece: GpuSlice, pod_uid: str) -> GpuState | str:
    """``gpu`` with ``piece`` reserved on it, or why it cannot be."""
    if not gpu.healthy:
        return f"GPU {gpu.index} is unhealthy"
    if gpu.exclusive:
        return f"GPU {gpu.index} is held exclusively"
    if piece.exclusive and not gpu.idle:
        return f"GPU {gpu.index} is not idle"
    if piece.memory_mib > gpu.memory_free_mib:
        return f"GPU {gpu.index}: {piece.memory_mib} MiB asked, {gpu.memory_free_mib} free"
    if piece.core_milli > gpu.core_milli_free:
        return f"GPU {gpu.index}: cores over-committed"
    if gpu.slots_total and gpu.slots_reserved >= gpu.slots_total:
        return f"GPU {gpu.index}: no logical device left"
    holders = gpu.holders if pod_uid in gpu.holders else tuple(sorted((*gpu.holders, pod_uid)))
    return msgspec.structs.replace(
        gpu,
        memory_reserved_mib=gpu.memory_reserved_mib + piece.memory_mib,
        core_milli_reserved=gpu.core_milli_reserved + piece.core_milli,
        slots_reserved=gpu.slots_reserved + (1 if gpu.slots_total else 0),
        exclusive=piece.exclusive,
        holders=holders,
    )


def _give_share(gpu: GpuState, piece: GpuSlice) -> GpuState:
    return msgspec.structs.replace(
        gpu,
        memory_reserved_mib=max(0, gpu.memory_reserved_mib - piece.memory_mib),
        core_milli_reserved=max(0, gpu.core_milli_reserved - piece.core_milli),
        slots_reserved=max(0, gpu.slots_reserved - (1 if gpu.slots_total else 0)),
        exclusive=False if piece.exclusive else gpu.exclusive,
    )


def _count_kind(
    kinds: tuple[tuple[str, int], ...], kind: str, delta: int
) -> tuple[tuple[str, int], ...]:
    if not kind:
        return kinds
    counts = dict(kinds)
    counts[kind] = counts.get(kind, 0) + delta
    return tuple(sorted((k, n) for k, n in counts.items() if n > 0))


def book(node: NodeState, reservation: Reservation) -> NodeState | str:
    """``node`` with ``reservation`` booked, or the reason it would over-commit."""
    if reservation.cpu_milli > node.cpu_milli_free:
        return "insufficient CPU"
    if reservation.memory_mib > node.memory_mib_free:
        return "insufficient memory"
    gpus = {g.index: g for g in node.gpus}
    for piece in _slices(reservation):
        gpu = gpus.get(piece.index)
        if gpu is None:
            return f"no GPU with index {piece.index}"
        if piece.core_milli > GPU_MILLI or piece.memory_mib < 0 or piece.core_milli < 0:
            return f"GPU {piece.index}: impossible share"
        taken = take_share(gpu, piece, reservation.pod_uid)
        if isinstance(taken, str):
            return taken
        gpus[piece.index] = taken
    return msgspec.structs.replace(
        node,
        cpu_milli_reserved=node.cpu_milli_reserved + reservation.cpu_milli,
        memory_mib_reserved=node.memory_mib_reserved + reservation.memory_mib,
        gpus=tuple(gpus[g.index] for g in node.gpus),
        gpu_task_kinds=_count_kind(node.gpu_task_kinds, reservation.kind, +1),
    )


def unbook(node: NodeState, reservation: Reservation) -> NodeState:
    """``node`` with ``reservation`` given back (the caller makes sure it was booked once)."""
    gpus = {g.index: g for g in node.gpus}
    for piece in _slices(reservation):
        if piece.index in gpus:
            gpus[piece.index] = _give_share(gpus[piece.index], piece)
    uid = reservation.pod_uid
    released = tuple(
        msgspec.structs.replace(g, holders=tuple(h for h in g.holders if h != uid))
        if uid in g.holders
        else g
        for g in (gpus[g.index] for g in node.gpus)
    )
    return msgspec.structs.replace(
        node,
        cpu_milli_reserved=max(0, node.cpu_milli_reserved - reservation.cpu_milli),
        memory_mib_reserved=max(0, node.memory_mib_reserved - reservation.memory_mib),
        gpus=released,
        gpu_task_kinds=_count_kind(node.gpu_task_kinds, reservation.kind, -1),
    )


class Ledger:
    """Reservations by pod UID; reserve and release are idempotent.

    The ledger is pure bookkeeping over ``NodeState`` values: it returns new node states for the
    caller (the cluster index, or the service shell before its KV compare-and-set) to store.
    """

    def __init__(self, reservations: Mapping[str, Reservation] | None = None) -> None:
        self._by_pod: dict[str, Reservation] = dict(reservations or {})

    def __len__(self) -> int:
        return len(self._by_pod)

    def __contains__(self, pod_uid: object) -> bool:
        return pod_uid in self._by_pod

    def get(self, pod_uid: str) -> Reservation | None:
        return self._by_pod.get(pod_uid)

    def reservations(self) -> tuple[Reservation, ...]:
        return tuple(self._by_pod.values())

    def reserve(self, node: NodeState, reservation: Reservation) -> NodeState | str:
        """Book ``reservation`` on ``node``; a pod already booked leaves ``node`` as it is."""
        if reservation.pod_uid in self._by_pod:
            return node
        booked = book(node, reservation)
        if not isinstance(booked, str):
            self._by_pod[reservation.pod_uid] = reservation
        return booked

    def release(self, pod_uid: str, node: NodeState) -> NodeState:
        """Give ``pod_uid``'s reservation back on ``node``; unknown pods change nothing."""
        reservation = self._by_pod.get(pod_uid)
        if reservation is None or reservation.node != node.name:
            return node
        del self._by_pod[pod_uid]
        return unbook(node, reservation)
