"""Never trust what a peer wrote: one validation of assignment records and inventory snapshots.

Decoding at the edge (``Edge.accept``) proves a payload has the right *shape*; this module decides
whether its *content* can be believed. It is pure (no I/O, time passed in) and every service that
reads assignment records or inventory calls it after decoding. A failed check is data: a reason an
operator can act on, which the caller dead-letters (``Edge.reject(..., kind="validate")``) before
dropping the value. Nothing here raises on bad input.

Assignment records (KV ``tessera-assignments``)::

    record_problem(record, *, key)                 -> str | None   # the record on its own
    record_inventory_problem(record, inventory)    -> str | None   # against the node's GPUs
    assignment_problem(record, *, key, inventory)  -> str | None   # both of the above
    transition_problem(previous, record)           -> str | None   # may ``previous`` become it?

Inventory snapshots (``tessera.inventory.<node>`` and KV ``tessera-inventory``), the rule
every reader applies (the placer, the device plugin)::

    inventory_problem(inventory, *, node, now, limits=None) -> str | None
    take_inventory(candidate, held, *, node, now, limits=None) -> InventoryVerdict
        # problem: dead-letter it, keep what is held; take: hold this from now on

Typical reader (the device plugin's shape; the placer and binder do the same)::

    record = await edge.accept(delivery, AssignmentRecord, family="assignments")
    if record is None:
        return                                    # did not decode: already dead-lettered
    problem = assignment_problem(record, key=entry.key, inventory=inventory) or (
        transition_problem(held.get(entry.key), record)
    )
    if problem:
        await edge.reject(delivery, family="assignments", reason=problem, kind="validate")
        forget(entry.key)                         # never served, never kept
        return

``transition_problem`` needs the last version the reader accepted for that key (``None`` when it
holds none). It cannot see rewrites made while the reader was not running, which is why
:func:`record_problem` also checks that the fields each state implies are consistent (a ``bound``
record carries no ``allocated_at``, only a ``released`` one a ``released_at``, an
``allocated`` one its ``allocated_at``): a careless regression shows there too.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Final

import msgspec

from shared import subjects
from shared.annotations import GPU, PREFIX
from shared.messages.assignments import AssignmentRecord, moves_forward
from shared.messages.base import ContainerSlices
from shared.messages.inventory import GpuTelemetry, NodeInventory

GPU_RESOURCE: Final = GPU
"""The resource whose count is the number of GPU shares of a container (one slice each)."""

RESOURCE_PREFIX: Final = PREFIX

MAX_CORES_PERCENT: Final = 100
MAX_GPU_CONTAINERS: Final = 64
"""Containers with GPUs in one pod (the containers of its assignment record). A record beyond
it is refused here, so the device plugin never serves it and such a pod could never pass the
kubelet's admission: ``shared.podspec`` refuses the pod up front instead, as an invalid request
the binder explains, rather than let it be placed and bound to fail."""


MAX_GPU_MEMORY_MIB: Final = 1 << 20
"""Memory of one GPU: 1 TiB (the largest GPUs today have under 200 GiB). An inventory saying
more is not believed, and a pod asking more per GPU is refused (``shared.podspec``)."""

MAX_TEMPERATURE_C: Final = 200
MAX_POWER_W: Final = 10_000.0
MAX_CLOCK_MHZ: Final = 100_000
"""Physics: no GPU runs at these (today: under 100 C, 1.5 kW, 3 GHz)."""
MAX_NUMA_NODE: Final = 1023
"""The largest NUMA node number Linux allows (``CONFIG_NODES_SHIFT`` is at most 10); -1: none."""


class InventoryLimits(msgspec.Struct, frozen=True, kw_only=True):
    """What a believable inventory snapshot may say. The defaults are far above any real node."""

    max_gpus: int = 256
    """GPUs on one node (the largest systems today have 16)."""
    max_gpu_memory_mib: int = MAX_GPU_MEMORY_MIB
    max_future_s: float = 300.0
    """How far ``observed_at`` may lie ahead of the reader's clock (clock skew between hosts).
    A reader on the same node as the producer can pass a much smaller value."""
    max_sequence: int = (1 << 53) - 1
    """The largest integer every JSON reader keeps exact: an inventory publishing a thousand
    snapshots a second would take 285,000 years to get there."""
    max_uuid_length: int = 128
    max_text_length: int = 1024
    """Any other text: model, PCI bus ID, health reason, driver version, backend, producer."""
    max_processes: int = 4096
    """Processes listed on one GPU."""


# --- assignment records ------------------------------------------------------------------------


def _slices_problem(container: ContainerSlices) -> str | None:
    where = f"container {container.container!r}"
    for name, count in container.resources.items():
        if name.startswith(RESOURCE_PREFIX) and count < 0:
            return f"{where} asks for {count} {name}"
    for gpu in container.gpus:
        if gpu.memory_mib < 0:
            return f"{where} has {gpu.memory_mib} MiB on GPU {gpu.uuid}"
        if not 0 <= gpu.cores <= MAX_CORES_PERCENT:
            return f"{where} has {gpu.cores} % of the SMs of GPU {gpu.uuid} (0..100)"
        if gpu.index < 0:
            return f"{where} names GPU index {gpu.index}"
        if not gpu.uuid:
            return f"{where} names a GPU without a UUID"
    repeated = sorted(u for u, n in Counter(g.uuid for g in container.gpus).items() if n > 1)
    if repeated:
        return (
            f"{where} holds GPU {', '.join(repeated)} more than once (shares are on distinct GPUs)"
        )
    shares = container.resources.get(GPU_RESOURCE)
    if shares is not None and shares != len(container.gpus):
        return (
            f"{where} asks for {shares} {GPU_RESOURCE} but the record gives it "
            f"{len(container.gpus)} GPU slice{'s' if len(container.gpus) != 1 else ''}"
        )
    asks_devices = any(
        n > 0 for name, n in container.resources.items() if name.startswith(RESOURCE_PREFIX)
    )
    if asks_devices and not container.gpus:
        return f"{where} asks for Tessera devices but the record gives it no GPU slice"
    return None


def _state_problem(record: AssignmentRecord) -> str | None:
    state = record.state
    if state in ("reserved", "bound") and record.allocated_at is not None:
        return f"a {state} record with allocated_at set (an allocated record moved back?)"
    if state != "released" and record.released_at is not None:
        return f"a {state} record with released_at set (a released record moved back?)"
    if state == "reserved" and record.allocated:
        return "a reserved record with allocated containers"
    if state == "allocated" and record.allocated_at is None:
        return "an allocated record without allocated_at"
    names = [c.container for c in record.containers]
    answered = [a.container for a in record.allocated]
    if len(set(answered)) != len(answered):
        return "the same container is allocated twice"
    unknown = [name for name in answered if name not in names]
    if unknown:
        return f"allocated container {unknown[0]!r} is not one of the record's containers"
    in_order = [name for name in names if name in set(answered)]
    if in_order != answered:
        return "allocated containers are out of the record's container order"
    for allocation in record.allocated:
        if len(set(allocation.device_ids)) != len(allocation.device_ids):
            return f"container {allocation.container!r} was allocated a device ID twice"
    return None


def record_problem(record: AssignmentRecord, *, key: str) -> str | None:
    """Why ``record``, read under KV ``key``, cannot be believed on its own; None when it can.

    Checks: the key names the record's node and pod UID; the pod's UID, namespace, name and node
    are present; container
    names are unique; every slice has memory >= 0, cores 0..100, an index >= 0 and a UUID, and no
    GPU twice in one container; a container's ``tessera.dev/gpu`` count equals its slices; the
    fields each state implies are consistent; allocated containers are the record's, in order.
    """
    for field in ("pod_uid", "namespace", "name", "node"):
        if not getattr(record, field):
            return f"the record has an empty {field}"
    try:
        expected = subjects.assignment_key(record.node, record.pod_uid)
    except ValueError as error:
        return f"the record's node cannot form a key: {error}"
    if key != expected:
        return (
            f"key {key} does not match the record (node {record.node!r}, pod UID "
            f"{record.pod_uid!r} belong under {expected})"
        )
    if not math.isfinite(record.decided_at):
        return "decided_at is not a finite time"
    if len(record.containers) > MAX_GPU_CONTAINERS:
        return f"{len(record.containers)} containers (more than {MAX_GPU_CONTAINERS})"
    names = [c.container for c in record.containers]
    if len(set(names)) != len(names) or not all(names):
        return "container names are empty or repeated"
    for container in record.containers:
        problem = _slices_problem(container)
        if problem:
            return problem
    return _state_problem(record)


def record_inventory_problem(record: AssignmentRecord, inventory: NodeInventory) -> str | None:
    """Why ``record``'s slices cannot exist on the node ``inventory`` describes; None when they can.

    Each slice's GPU must be listed (by UUID), at the index the record says, with at least the
    memory the slice holds. Health is not checked here: an unhealthy GPU makes a valid record
    unservable for now, not wrong (the device plugin refuses it at Allocate with the reason).
    """
    if inventory.node != record.node:
        return f"the record is for node {record.node!r}, the inventory for {inventory.node!r}"
    gpus = {gpu.uuid: gpu for gpu in inventory.gpus}
    for container in record.containers:
        for piece in container.gpus:
            gpu = gpus.get(piece.uuid)
            where = f"container {container.container!r}"
            if gpu is None:
                return f"{where} names GPU {piece.uuid}, which node {record.node} does not list"
            if gpu.index != piece.index:
                return (
                    f"{where} names GPU {piece.uuid} at index {piece.index}, but it is index "
                    f"{gpu.index}"
                )
            if piece.memory_mib > gpu.memory_total_mib:
                return (
                    f"{where} holds {piece.memory_mib} MiB of GPU {piece.uuid}, which has "
                    f"{gpu.memory_total_mib} MiB"
                )
    return None


def assignment_problem(
    record: AssignmentRecord, *, key: str, inventory: NodeInventory | None
) -> str | None:
    """:func:`record_problem`, then :func:`record_inventory_problem` when the inventory is known.

    A ``released`` record is only checked on its own: its GPUs may rightly be gone.
    """
    problem = record_problem(record, key=key)
    if problem or inventory is None or record.state == "released":
        return problem
    return record_inventory_problem(record, inventory)


_FIXED_FIELDS: Final = ("pod_uid", "namespace", "name", "node", "containers", "placer_id")


def may_replace(previous: AssignmentRecord | None, commit: str) -> bool:
    """Whether a record of ``commit`` may take the key of ``previous`` as a new placement:
    nothing is there, or a released record of another commit that does not fence ``commit``
    too (the fence a given-back placement leaves: the pod placed on the same node again after a
    requeue). The one rule every writer and reader of records follows."""
    return previous is None or (
        previous.state == "released" and previous.commit != commit and commit not in previous.fenced
    )


def transition_problem(previous: AssignmentRecord | None, record: AssignmentRecord) -> str | None:
    """Why ``previous`` may not be rewritten as ``record``; None when it may (or ``previous`` is
    None: nothing to compare with).

    A record of another commit is a new placement, allowed only over a released record
    (:func:`may_replace`). Within one commit, states only move forward (``reserved -> bound ->
    allocated -> released``); a rewrite in the same state is fine (the binder touching it, one
    more container answered), but it never forgets an answered container, and who and what the
    record decided never change.
    """
    if previous is None:
        return None
    if record.commit != previous.commit:
        if may_replace(previous, record.commit):
            return None
        if previous.state == "released":
            return (
                f"a record of commit {record.commit or '(none)'} over the released record of "
                f"commit {previous.commit or '(none)'}, which fences it"
            )
        return (
            f"a record of commit {record.commit or '(none)'} over the live {previous.state} "
            f"record of commit {previous.commit or '(none)'}"
        )
    if not moves_forward(previous.state, record.state):
        return f"state moved backwards: {previous.state} -> {record.state}"
    for field in _FIXED_FIELDS:
        if getattr(previous, field) != getattr(record, field):
            return f"{field} changed in a rewrite ({previous.state} -> {record.state})"
    if record.allocated[: len(previous.allocated)] != previous.allocated:
        return "a rewrite dropped or changed containers already allocated"
    return None


# --- inventory -------------------------------------------------------------------------------


def inventory_problem(
    inventory: NodeInventory,
    *,
    node: str,
    now: float,
    limits: InventoryLimits | None = None,
) -> str | None:
    """Why ``inventory`` cannot be believed as node ``node``'s at wall time ``now``; None if it can.

    Checks the node, the time (finite, not ahead of ``now`` by more than ``limits.max_future_s``),
    the sequence (0..``limits.max_sequence``), the GPU count, unique UUIDs and indices, the length
    of every text, and per GPU: a UUID of sane length, index in range, memory total in
    1..``limits.max_gpu_memory_mib``, used and free memory (and each process's) within the total,
    utilisation 0..100, temperature, power and clocks within physics, a NUMA node, at most
    ``limits.max_gpus`` peers and processes of sane number.
    """
    limits = limits or InventoryLimits()
    if inventory.node != node:
        return f"inventory of node {inventory.node!r} on the subject or key of node {node!r}"
    if not math.isfinite(inventory.observed_at) or inventory.observed_at <= 0:
        return f"observed_at {inventory.observed_at} is not a time"
    ahead = inventory.observed_at - now
    if ahead > limits.max_future_s:
        return (
            f"observed_at is {ahead:.0f} s ahead of this clock (at most {limits.max_future_s:.0f} "
            "s is believed)"
        )
    if not 0 <= inventory.sequence <= limits.max_sequence:
        return f"sequence {inventory.sequence} outside 0..{limits.max_sequence}"
    for field in ("producer", "backend", "driver_version"):
        if len(getattr(inventory, field)) > limits.max_text_length:
            return f"{field} longer than {limits.max_text_length} characters"
    if len(inventory.gpus) > limits.max_gpus:
        return f"{len(inventory.gpus)} GPUs (at most {limits.max_gpus} per node are believed)"
    for what, values in (
        ("UUID", [g.uuid for g in inventory.gpus]),
        ("index", [g.index for g in inventory.gpus]),
    ):
        repeated = sorted(str(v) for v, n in Counter(values).items() if n > 1)
        if repeated:
            return f"GPU {what} {', '.join(repeated)} listed more than once"
    for gpu in inventory.gpus:
        problem = _gpu_problem(gpu, limits)
        if problem:
            return f"GPU {gpu.uuid[: limits.max_uuid_length]!r}: {problem}"
    return None


def _gpu_problem(gpu: GpuTelemetry, limits: InventoryLimits) -> str | None:
    if not gpu.uuid or len(gpu.uuid) > limits.max_uuid_length:
        return f"UUID empty or longer than {limits.max_uuid_length} characters"
    if not 0 <= gpu.index < limits.max_gpus:
        return f"index {gpu.index} outside 0..{limits.max_gpus - 1}"
    total = gpu.memory_total_mib
    if not 1 <= total <= limits.max_gpu_memory_mib:
        return f"{total} MiB of memory (1..{limits.max_gpu_memory_mib} MiB are believed)"
    for field in ("model", "pci_bus_id", "health_reason"):
        if len(getattr(gpu, field)) > limits.max_text_length:
            return f"{field} longer than {limits.max_text_length} characters"
    ranges: tuple[tuple[str, float, float, float], ...] = (
        ("memory_used_mib", gpu.memory_used_mib, 0, total),
        ("memory_free_mib", gpu.memory_free_mib, 0, total),
        ("utilization_pct", gpu.utilization_pct, 0, 100),
        ("temperature_c", gpu.temperature_c, -273, MAX_TEMPERATURE_C),
        ("power_w", gpu.power_w, 0, MAX_POWER_W),
        ("sm_clock_mhz", gpu.sm_clock_mhz, 0, MAX_CLOCK_MHZ),
        ("sm_clock_max_mhz", gpu.sm_clock_max_mhz, 0, MAX_CLOCK_MHZ),
        ("numa_node", -1 if gpu.numa_node is None else gpu.numa_node, -1, MAX_NUMA_NODE),
        ("peers", len(gpu.nvlink_peers) + len(gpu.links), 0, 2 * limits.max_gpus),
        ("processes", len(gpu.processes), 0, limits.max_processes),
    )
    for field, value, low, high in ranges:
        if not low <= value <= high:  # NaN is never within
            return f"{field} {value} outside {low}..{high}"
    for process in gpu.processes:
        if process.pid < 0 or not 0 <= process.used_memory_mib <= total:
            return f"process {process.pid} holds {process.used_memory_mib} MiB of {total}"
    for link in gpu.links:
        if not 0 <= link.nvlinks <= limits.max_gpus:
            return f"{link.nvlinks} NVLinks to one peer"
    return None


class InventoryVerdict(msgspec.Struct, frozen=True, kw_only=True):
    """What a reader does with one inventory snapshot (:func:`take_inventory`)."""

    problem: str = ""
    """Why it cannot be believed: dead-letter it with this reason and keep what is held."""
    take: NodeInventory | None = None
    """What to hold from now on (the snapshot, its ``observed_at`` never later than the reader's
    clock); None when it is not newer than what is held (nothing to do)."""


def take_inventory(
    candidate: NodeInventory,
    held: NodeInventory | None,
    *,
    node: str,
    now: float,
    limits: InventoryLimits | None = None,
) -> InventoryVerdict:
    """The one rule every reader of node ``node``'s inventory applies to ``candidate`` at its
    wall clock ``now``, holding ``held`` (what an earlier verdict said to take, or None).

    A ``candidate`` :func:`inventory_problem` finds wrong is the verdict's problem (dead-letter
    it, keep ``held``). Otherwise it replaces ``held`` when it is the same producer's next
    snapshot (a higher ``sequence``, whatever the clocks did: a clock stepped back must not stop
    a running inventory) or, in every other case, when it is fresher (a later ``observed_at``).
    What is held is never dated after its arrival: a snapshot stamped ahead of the reader's
    clock (within ``max_future_s``, for skew between hosts) is held as of ``now``.

    Why an honest producer always recovers: whatever a forger published (any producer, any
    sequence, any time the bounds let through), the held snapshot is dated no later than when
    it arrived, and an honest snapshot observed after that (by the producer's clock, so plus
    any skew between the hosts) is fresher, so it is taken, and the next of its sequence after
    it. A forged snapshot holds at most until the honest producer publishes again (its
    heartbeat), even one naming the honest producer with a huge sequence; the bounds refuse
    outright what no producer could send, such as a sequence of 2**62. A reader cannot tell a
    believable forgery from the truth: keeping forgeries off the bus is the job of its
    permissions, and this rule only guarantees they never outlast the next honest snapshot.
    """
    problem = inventory_problem(candidate, node=node, now=now, limits=limits)
    if problem:
        return InventoryVerdict(problem=problem)
    if candidate.observed_at > now:
        candidate = msgspec.structs.replace(candidate, observed_at=now)
    if held is None or _newer(candidate, held):
        return InventoryVerdict(take=candidate)
    return InventoryVerdict()


def _newer(candidate: NodeInventory, held: NodeInventory) -> bool:
    same_producer = bool(candidate.producer) and candidate.producer == held.producer
    if same_producer and candidate.sequence > held.sequence:
        return True
    return candidate.observed_at > held.observed_at
