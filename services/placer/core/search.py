"""The one search over a node's GPUs: which GPU each of a pod's shares goes on.

A pod's shares go container by container, each share of a container on a distinct GPU (shares of
different containers may share one), each on a GPU the pod may use at all (``admitted``: model,
group) where the fit rule says it fits: :func:`~.ledger.refusal`, the rule the ledger books
with. The fit filter asks :func:`assign` whether a node can take a pod (on the node's shape,
:func:`smallest_first`); the GPU choice asks it where the shares go (on the node's GPUs, in the
order of the profile's chooser). Only the order differs, and the search is complete, so the filter
says a node fits exactly when the choice finds GPUs on it.

**How it searches.** Shares are placed one at a time, each on the first candidate in the order;
when a later share finds no room, the search goes back and tries the next candidate (depth first).
So it finds the first assignment in the order's preference: the greedy walk (the order's first
choice every time) whenever that fits, which is what the filter and the choosers did before they
searched. What keeps it small: before each container, the containers left are checked to be
possible at all (each has as many GPUs where one of its shares fits as it has shares, and the
GPUs could hold that many shares together; for a pod of one container this is exact, and the
walk never goes back); a candidate in the same state as one already tried for the same share is
skipped (it leads to the same outcome); and a state from which the rest failed once is not
explored again.

**Bound.** A search places at most :data:`SEARCH_STEPS` shares; a pod that needs more is taken as
not fitting there. Pods of up to three containers of three shares, or four of two, stay below it
on an 8-GPU node: in random stresses of 140,000 such pods the most any needed was about 1,200,
and 99.9 % needed under 70 (``tests/placer/test_search.py`` has the hardest of three containers).
At about 20 us a placement, the bound caps what a pathological pod costs at tens of milliseconds
per node shape.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import msgspec

from services.placer.core.facts import ShareAsk
from services.placer.core.ledger import refusal
from services.placer.core.model import GpuState
from services.placer.core.shape import GpuShape, free_milli

SEARCH_STEPS = 2_000
"""Placements of a share one search may try (see the module docstring)."""

Prefer = Callable[[Sequence[GpuShape], list[int], Sequence[int]], Sequence[int]]
"""The order to try candidate GPUs in for the next share: given the node's GPUs as the pod's
earlier shares left them, the candidates (positions in that sequence) and the positions chosen
for the earlier shares, the candidates, most preferred first."""


def slice_memory(ask: ShareAsk, gpu: GpuShape | GpuState) -> int:
    """MiB one share of ``ask`` takes on ``gpu``: a whole GPU takes all its free memory."""
    return gpu.memory_free_mib if ask.whole else ask.memory_on(gpu.memory_total_mib)


def share_fits(ask: ShareAsk, gpu: GpuShape) -> bool:
    """Whether one share of ``ask`` fits on ``gpu`` as it is now (the ledger's rule)."""
    return not refusal(gpu, slice_memory(ask, gpu), ask.core_milli, ask.whole)


def taken(gpu: GpuShape, ask: ShareAsk) -> GpuShape:
    """``gpu`` once one share of ``ask`` is on it (as ``ledger.take_share`` leaves the GPU)."""
    memory = slice_memory(ask, gpu)
    memory_free = gpu.memory_free_mib - memory
    core_free = gpu.core_milli_free - ask.core_milli
    return msgspec.structs.replace(
        gpu,
        free_milli=0 if ask.whole else free_milli(memory_free, gpu.memory_total_mib, core_free),
        memory_free_mib=memory_free,
        core_milli_free=core_free,
        slots_free=gpu.slots_free - 1 if gpu.slots_free > 0 else gpu.slots_free,
        idle=gpu.idle and not (memory or ask.core_milli or ask.whole),
        exclusive=ask.whole,
    )


def _may_fit(asks: Sequence[ShareAsk], gpus: Sequence[GpuShape], admitted: Sequence[bool]) -> bool:
    """False when ``asks`` surely do not fit: an ask with fewer GPUs where one of its shares fits
    than it has shares, or more shares in all than the GPUs could hold together."""
    allowed = [gpu for ok, gpu in zip(admitted, gpus, strict=True) if ok]
    fits = [[share_fits(ask, gpu) for gpu in allowed] for ask in asks]
    if any(sum(row) < ask.shares for ask, row in zip(asks, fits, strict=True)):
        return False
    if len(asks) == 1:
        return True
    room = sum(
        _most_shares([ask for ask, row in zip(asks, fits, strict=True) if row[j]], gpu)
        for j, gpu in enumerate(allowed)
    )
    return room >= sum(ask.shares for ask in asks)


def _most_shares(fitting: Sequence[ShareAsk], gpu: GpuShape) -> int:
    """The most shares ``gpu`` could hold together, one of each ask in ``fitting`` (each of which
    fits on it alone)."""
    shared = [ask for ask in fitting if not ask.whole]
    whole = int(len(shared) < len(fitting))
    if not shared:
        return whole
    most = len(shared)
    memory = min(ask.memory_on(gpu.memory_total_mib) for ask in shared)
    if memory:
        most = min(most, gpu.memory_free_mib // memory)
    cores = min(ask.core_milli for ask in shared)
    if cores:
        most = min(most, gpu.core_milli_free // cores)
    if gpu.slots_free >= 0:
        most = min(most, gpu.slots_free)
    return max(most, whole)


def smallest_first(
    gpus: Sequence[GpuShape], candidates: list[int], chosen: Sequence[int]
) -> list[int]:
    """The fit filter's order: least free memory, then least free cores, first."""
    return sorted(candidates, key=lambda i: (gpus[i].memory_free_mib, gpus[i].core_milli_free))


def assign(
    asks: Sequence[ShareAsk],
    gpus: Sequence[GpuShape],
    admitted: Sequence[bool],
    prefer: Prefer = smallest_first,
) -> tuple[int, ...] | None:
    """Positions in ``gpus`` where ``asks``' shares go, one per share in ask order: the first
    assignment in ``prefer``'s order; None when the shares do not fit (module docstring)."""
    shares = [ask for ask in asks for _ in range(ask.shares)]
    firsts: list[int] = []  # for each share, the position of its container's first share
    for ask in asks:
        firsts += [len(firsts)] * ask.shares
    starts = {first: n for n, first in enumerate(dict.fromkeys(firsts))}  # -> place in asks
    if len(shares) > 1 and not _may_fit(asks, gpus, admitted):
        return None
    rooms = list(gpus)
    chosen: list[int] = []
    failed: set[tuple[object, ...]] = set()
    steps = 0

    def state(k: int, used: list[int]) -> tuple[object, ...]:
        """Share ``k``, the GPUs as left so far and those its container took: from an equal
        state the rest fits alike."""
        return (k, *rooms, *sorted(used))

    def walk(k: int) -> bool | None:
        """Place shares ``k``...: True when all fit, False when they cannot, None when the search
        ran out of steps."""
        nonlocal steps
        if k == len(shares):
            return True
        ask = shares[k]
        used = chosen[firsts[k] : k]
        if failed and state(k, used) in failed:
            return False
        if k and k in starts and not _may_fit(asks[starts[k] :], rooms, admitted):
            failed.add(state(k, used))
            return False
        candidates = [
            i
            for i, room in enumerate(rooms)
            if admitted[i] and i not in used and share_fits(ask, room)
        ]
        if candidates:
            order = prefer(rooms, candidates, chosen)
            if k == len(shares) - 1:  # the last share: any candidate completes
                chosen.append(order[0])
                return True
            tried: set[GpuShape] = set()
            for i in order:
                room = rooms[i]
                if room in tried:
                    continue
                tried.add(room)
                steps += 1
                if steps > SEARCH_STEPS:
                    return None
                rooms[i] = taken(room, ask)
                chosen.append(i)
                found = walk(k + 1)
                if found is not False:
                    return found
                chosen.pop()
                rooms[i] = room
        failed.add(state(k, used))
        return False

    return tuple(chosen) if walk(0) else None
