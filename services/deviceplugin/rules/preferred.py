"""Pure: GetPreferredAllocation, steering the kubelet to IDs of the GPUs a record decided.

Allocate answers from the record whatever IDs the kubelet picks, so a preference never changes what
a container gets. It keeps the kubelet's own accounting true: when the kubelet takes devices of the
GPU the placer decided, its per-device bookkeeping (and ``kubectl describe node``) matches the GPUs
really in use, and devices of other GPUs stay free for the pods decided onto them.

The preferred list always holds every ``must_include`` ID, then takes available IDs of the decided
GPUs in turn (one from each GPU per round, so a container with shares on several GPUs gets one
device on each first), then fills up with the remaining available IDs in a stable order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def prefer(
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    *,
    decided_gpus: Sequence[str],
    gpu_of: Mapping[str, str],
) -> tuple[str, ...]:
    """The IDs to prefer for one container.

    Args:
        available: IDs the kubelet may choose from.
        must_include: IDs the kubelet has already chosen; always part of the answer.
        size: how many IDs the container gets.
        decided_gpus: UUIDs of the GPUs the matching record decided, in slice order (empty when no
            bound record waits for a container of this size).
        gpu_of: device ID -> GPU UUID, for every advertised device.
    """
    chosen: list[str] = list(dict.fromkeys(must_include))
    taken = set(chosen)
    free = sorted(i for i in dict.fromkeys(available) if i not in taken)

    by_gpu: dict[str, list[str]] = {uuid: [] for uuid in dict.fromkeys(decided_gpus)}
    for device in free:
        gpu = gpu_of.get(device)
        if gpu in by_gpu:
            by_gpu[gpu].append(device)
    queues = [list(reversed(ids)) for ids in by_gpu.values()]
    while len(chosen) < size and any(queues):
        for queue in queues:
            if queue and len(chosen) < size:
                device = queue.pop()
                chosen.append(device)
                taken.add(device)

    for device in free:
        if len(chosen) >= size:
            break
        if device not in taken:
            chosen.append(device)
            taken.add(device)
    return tuple(chosen)
