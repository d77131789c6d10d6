"""The assume ledger: book a decision on a node at once, give it back exactly once.

``book`` and ``unbook`` are pure functions from a node and a reservation to the node's next state.
``book`` refuses (returns the reason as a string) any reservation that would over-commit CPU,
memory, or a GPU's memory, cores or slots, or that lands on an unhealthy or exclusively held GPU:
over-commit is impossible by construction, whatever the caller computed. :class:`Ledger` keeps the
reservations by pod UID so that ``reserve`` of a pod already booked and ``release`` of a pod not
booked are no-ops (redelivered messages, a deletion after a failed bind).

Whether one share fits on a GPU is :func:`refusal`, the one fit rule: the ledger books with it,
and the fit filter and the GPU choice search with it (``search.py``), so that what the core
decides is what the ledger books.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Literal, Protocol

import msgspec

from services.placer.core.model import GPU_MILLI, GpuSlice, GpuState, NodeState, Reservation


def _slices(reservation: Reservation) -> Iterator[GpuSlice]:
    for container in reservation.containers:
        yield from container.gpus


class GpuRoom(Protocol):
    """What the fit rule reads of a GPU: a ``GpuState``, or the ``GpuShape`` filters see."""

    @property
    def healthy(self) -> bool: ...

    @property
    def exclusive(self) -> bool: ...

    @property
    def idle(self) -> bool: ...

    @property
    def memory_free_mib(self) -> int: ...

    @property
    def core_milli_free(self) -> int: ...

    @property
    def slots_free(self) -> int: ...


Refusal = Literal["", "unhealthy", "exclusive", "not idle", "memory", "cores", "slots"]

_REFUSED: dict[Refusal, str] = {
    "unhealthy": "GPU {index} is unhealthy",
    "exclusive": "GPU {index} is held exclusively",
    "not idle": "GPU {index} is not idle",
    "memory": "GPU {index}: {asked} MiB asked, {free} free",
    "cores": "GPU {index}: cores over-committed",
    "slots": "GPU {index}: no logical device left",
}


def refusal(gpu: GpuRoom, memory_mib: int, core_milli: int, whole: bool) -> Refusal:
    """Why one share of ``memory_mib`` and ``core_milli`` (``whole``: the GPU held exclusively)
    cannot go on ``gpu`` as it is now; empty when it fits. The one fit rule (module docstring)."""
    if not gpu.healthy:
        return "unhealthy"
    if gpu.exclusive:
        return "exclusive"
    if whole and not gpu.idle:
        return "not idle"
    if memory_mib > gpu.memory_free_mib:
        return "memory"
    if core_milli > gpu.core_milli_free:
        return "cores"
    if gpu.slots_free == 0:
        return "slots"
    return ""


def take_share(gpu: GpuState, piece: GpuSlice, pod_uid: str) -> GpuState | str:
    """``gpu`` with ``piece`` reserved on it, or why it cannot be."""
    why = refusal(gpu, piece.memory_mib, piece.core_milli, piece.exclusive)
    if why:
        return _REFUSED[why].format(
            index=gpu.index, asked=piece.memory_mib, free=gpu.memory_free_mib
        )
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
        pods=node.pods if reservation.pod is None else (*node.pods, reservation.pod),
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
        pods=node.pods
        if reservation.pod is None
        else tuple(p for p in node.pods if p is not reservation.pod),
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
