"""Pure: the Allocate hand-off (docs/design.md §4) as plain functions over assignment records.

The kubelet's Allocate carries device IDs only, never the pod. The rule: take the oldest ``bound``
record on this node whose next device-holding container needs exactly as many devices as the
kubelet picked and that stands for a placer's commit (``shared.commits.booking_problem``: the pod's
booking on the node is of the record's commit, with the same slices; issue 19), answer from that
record whatever IDs were picked (the record, not the IDs, says which GPU and how much of it), and
move the record on: one more :class:`ContainerAllocation`, and ``allocated`` once every
device-holding container is answered. The shell commits the new record with a compare-and-set on
the revision it was read at, so two plugin processes can never allocate one record twice; on a
conflict it re-reads and plans again.

A container "holds devices" when its ``resources`` (the pod spec's Tessera limits) ask for this
plugin's resource: the kubelet calls Allocate exactly for those containers, in pod order.

Refusals are data (:class:`Refusal`) whose message says exactly what is missing; the kubelet shows
it in the pod's admission error.

Environment of a granted container (docs/design.md §3), values listed per GPU in
``NVIDIA_VISIBLE_DEVICES`` order and comma-separated when a container has several GPUs:

    NVIDIA_VISIBLE_DEVICES          GPU UUIDs
    TESSERA_GPU_MEMORY_LIMIT_MIB    MiB decided on each GPU
    TESSERA_GPU_MEMORY_TOTAL_MIB    each GPU's total MiB
    TESSERA_GPU_CORES               percent of each GPU's SMs
    isolation "mps":        CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=<uuid>=<M>M[,...],
                            CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, CUDA_MPS_PIPE_DIRECTORY + its mount
    isolation "hami-core":  CUDA_DEVICE_MEMORY_LIMIT_<i>=<M>m, CUDA_DEVICE_SM_LIMIT, LD_PRELOAD +
                            the library mounted read-only from its host path
    compat "volcano":       VOLCANO_GPU_ALLOCATED, VOLCANO_GPU_MEMORY_TOTAL (MiB)
    compat "aliyun":        ALIYUN_COM_GPU_MEM_IDX, _POD, _CONTAINER, _DEV (MiB)

One SM percentage applies to a whole process, so with several GPUs of different shares MPS and
HAMi-core get the smallest one: the container then stays inside every slice.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Final, Literal

import msgspec

from shared.commits import booking_problem
from shared.messages.assignments import AssignmentRecord, ContainerAllocation, RecordView
from shared.messages.base import ContainerSlices, GpuSlice
from shared.messages.inventory import GpuTelemetry
from shared.messages.ledger import Booking

Isolation = Literal["none", "mps", "hami-core"]
Compat = Literal["volcano", "aliyun"]
RefusalKind = Literal["invalid", "no_record", "uncommitted", "unavailable", "conflict"]
"""``invalid``: the kubelet's request itself is wrong. ``no_record``: no bound record waits for a
container of that size (yet). ``uncommitted``: the records that do are not what a placer
committed (forged, or their booking not seen yet). ``unavailable``: the decided GPU is
not usable now. ``conflict``: the record kept changing under the write."""

MPS_PIPE_CONTAINER_PATH: Final = "/tmp/nvidia-mps"
HAMI_CORE_CONTAINER_PATH: Final = "/usr/local/vgpu/libvgpu.so"

ANNOTATION_POD_UID: Final = "tessera.dev/pod-uid"
ANNOTATION_CONTAINER: Final = "tessera.dev/container"


class Refusal(msgspec.Struct, frozen=True, kw_only=True):
    """Why an Allocate (or PreStartContainer) cannot be answered."""

    kind: RefusalKind
    message: str


class Mount(msgspec.Struct, frozen=True, kw_only=True):
    container_path: str
    host_path: str
    read_only: bool = True


class ResponseOptions(msgspec.Struct, frozen=True, kw_only=True):
    """Node-wide choices that shape every container response."""

    isolation: Isolation = "none"
    mps_pipe_dir: str = MPS_PIPE_CONTAINER_PATH
    """Host directory of the MPS control daemon's pipes; mounted at the same path."""
    hami_core_library: str = HAMI_CORE_CONTAINER_PATH
    """Host path of HAMi-core's ``libvgpu.so``."""
    compat: frozenset[Compat] = frozenset()


class ContainerGrant(msgspec.Struct, frozen=True, kw_only=True):
    """The ContainerAllocateResponse contents as plain data."""

    envs: dict[str, str]
    mounts: tuple[Mount, ...] = ()
    annotations: dict[str, str] = {}


class Allocation(msgspec.Struct, frozen=True, kw_only=True):
    """What the shell must do for one container: write ``record`` over ``taken`` by
    compare-and-set, then answer ``grant``."""

    taken: RecordView
    record: AssignmentRecord
    container: ContainerSlices
    grant: ContainerGrant

    @property
    def complete(self) -> bool:
        return self.record.state == "allocated"


# --- which record ------------------------------------------------------------------------------


def devices_needed(container: ContainerSlices, resource: str) -> int:
    """How many devices of ``resource`` the kubelet hands ``container`` (0 = none)."""
    return container.resources.get(resource, 0)


def device_containers(record: AssignmentRecord, resource: str) -> tuple[ContainerSlices, ...]:
    """The containers the kubelet will call Allocate for, in pod order."""
    return tuple(c for c in record.containers if devices_needed(c, resource) > 0)


def next_container(record: AssignmentRecord, resource: str) -> ContainerSlices | None:
    """The container the next Allocate for this record answers, or None when there is none."""
    if record.state != "bound":
        return None
    waiting = device_containers(record, resource)
    answered = len(record.allocated)
    return waiting[answered] if answered < len(waiting) else None


def _age(view: RecordView) -> tuple[float, float, str]:
    record = view.record
    bound_at = record.bound_at if record.bound_at is not None else record.decided_at
    return (bound_at, record.decided_at, record.pod_uid)


def matching_records(views: Iterable[RecordView], *, count: int, resource: str) -> list[RecordView]:
    """Bound records whose next container needs exactly ``count`` devices, oldest first."""
    matching = [
        view
        for view in views
        if (container := next_container(view.record, resource)) is not None
        and devices_needed(container, resource) == count
    ]
    return sorted(matching, key=_age)


def pick_record(views: Iterable[RecordView], *, count: int, resource: str) -> RecordView | None:
    """The oldest bound record whose next container needs exactly ``count`` devices."""
    matching = matching_records(views, count=count, resource=resource)
    return matching[0] if matching else None


def describe_missing(views: Iterable[RecordView], *, count: int, resource: str, node: str) -> str:
    """The "no matching record" message: what was asked and what the bound records wait for."""
    waiting = []
    for view in sorted(views, key=_age):
        container = next_container(view.record, resource)
        if container is not None:
            record = view.record
            waiting.append(
                f"{record.namespace}/{record.name} container {container.container} needs "
                f"{devices_needed(container, resource)}"
            )
    asked = (
        f"no bound assignment record on node {node} has a next container needing exactly "
        f"{count} {resource} device{'s' if count != 1 else ''}"
    )
    if not waiting:
        return f"{asked}; no pod bound to this node is waiting for {resource} devices"
    return f"{asked}; bound pods waiting: {'; '.join(waiting)}"


# --- checking the kubelet's IDs ----------------------------------------------------------------


def _shown(ids: Sequence[str]) -> str:
    return ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")


def check_device_ids(
    device_ids: Sequence[str],
    advertised: AbstractSet[str],
    retired: AbstractSet[str] = frozenset(),
) -> Refusal | None:
    """Refuse an empty request, repeated IDs, IDs of GPUs the node no longer lists (``retired``:
    advertised before, not now), or IDs this plugin never advertised."""
    if not device_ids:
        return Refusal(kind="invalid", message="Allocate carried no device IDs")
    repeated = sorted(i for i, n in Counter(device_ids).items() if n > 1)
    if repeated:
        return Refusal(kind="invalid", message=f"device IDs repeated: {', '.join(repeated)}")
    unknown = [i for i in device_ids if i not in advertised]
    gone = [i for i in unknown if i in retired]
    if gone:
        return Refusal(
            kind="invalid",
            message=f"device IDs no longer advertised (their GPU left the node's inventory): "
            f"{_shown(gone)}",
        )
    if unknown:
        return Refusal(
            kind="invalid",
            message=f"device IDs this plugin never advertised: {_shown(unknown)}",
        )
    return None


# --- the response ------------------------------------------------------------------------------


def _joined(values: Iterable[object]) -> str:
    return ",".join(str(v) for v in values)


def slice_environment(
    slices: Sequence[GpuSlice],
    totals: Sequence[int],
    *,
    options: ResponseOptions,
    pod_memory_mib: int,
) -> tuple[dict[str, str], tuple[Mount, ...]]:
    """The environment and mounts of a container holding ``slices`` (docs/design.md §3), on GPUs
    of ``totals`` MiB each; ``pod_memory_mib`` is every slice of its pod (Aliyun's variable).
    Shared by Allocate and the DRA side's CDI specs, so both hand a container the same."""
    envs = {
        "NVIDIA_VISIBLE_DEVICES": _joined(s.uuid for s in slices),
        "TESSERA_GPU_MEMORY_LIMIT_MIB": _joined(s.memory_mib for s in slices),
        "TESSERA_GPU_MEMORY_TOTAL_MIB": _joined(totals),
        "TESSERA_GPU_CORES": _joined(s.cores for s in slices),
    }
    mounts: list[Mount] = []
    smallest_cores = min(s.cores for s in slices)
    if options.isolation == "mps":
        envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = _joined(
            f"{s.uuid}={s.memory_mib}M" for s in slices
        )
        envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(smallest_cores)
        envs["CUDA_MPS_PIPE_DIRECTORY"] = MPS_PIPE_CONTAINER_PATH
        mounts.append(
            Mount(
                container_path=MPS_PIPE_CONTAINER_PATH,
                host_path=options.mps_pipe_dir,
                read_only=False,
            )
        )
    elif options.isolation == "hami-core":
        for position, gpu_slice in enumerate(slices):
            envs[f"CUDA_DEVICE_MEMORY_LIMIT_{position}"] = f"{gpu_slice.memory_mib}m"
        envs["CUDA_DEVICE_SM_LIMIT"] = str(smallest_cores)
        envs["LD_PRELOAD"] = HAMI_CORE_CONTAINER_PATH
        mounts.append(
            Mount(container_path=HAMI_CORE_CONTAINER_PATH, host_path=options.hami_core_library)
        )
    container_mib = sum(s.memory_mib for s in slices)
    if "volcano" in options.compat:
        envs["VOLCANO_GPU_ALLOCATED"] = str(container_mib)
        envs["VOLCANO_GPU_MEMORY_TOTAL"] = str(sum(totals))
    if "aliyun" in options.compat:
        envs["ALIYUN_COM_GPU_MEM_IDX"] = _joined(s.index for s in slices)
        envs["ALIYUN_COM_GPU_MEM_POD"] = str(pod_memory_mib)
        envs["ALIYUN_COM_GPU_MEM_CONTAINER"] = str(container_mib)
        envs["ALIYUN_COM_GPU_MEM_DEV"] = _joined(totals)
    return envs, tuple(mounts)


def container_grant(
    record: AssignmentRecord,
    container: ContainerSlices,
    *,
    gpus: Mapping[str, GpuTelemetry],
    options: ResponseOptions,
) -> ContainerGrant | Refusal:
    """The response for ``container`` of ``record``, from the record's slices alone."""
    slices = container.gpus
    pod = f"{record.namespace}/{record.name}"
    if not slices:
        return Refusal(
            kind="invalid",
            message=f"assignment record of {pod} has no GPU slices for container "
            f"{container.container}",
        )
    missing = [s.uuid for s in slices if s.uuid not in gpus]
    if missing:
        return Refusal(
            kind="unavailable",
            message=f"assignment record of {pod} container {container.container} names GPU "
            f"{', '.join(missing)}, which the inventory of node {record.node} does not list",
        )
    sick = [_sickness(s.uuid, gpus) for s in slices if _sickness(s.uuid, gpus)]
    if sick:
        return Refusal(
            kind="unavailable",
            message=f"assignment record of {pod} container {container.container} was decided "
            f"on GPU {', '.join(sick)}; it is not granted while the GPU is not healthy",
        )
    totals = [gpus[s.uuid].memory_total_mib for s in slices]
    pod_mib = sum(s.memory_mib for c in record.containers for s in c.gpus)
    envs, mounts = slice_environment(slices, totals, options=options, pod_memory_mib=pod_mib)
    return ContainerGrant(
        envs=envs,
        mounts=mounts,
        annotations={ANNOTATION_POD_UID: record.pod_uid, ANNOTATION_CONTAINER: container.container},
    )


# --- the whole decision ------------------------------------------------------------------------


def advance(
    record: AssignmentRecord,
    container: ContainerSlices,
    device_ids: Sequence[str],
    *,
    resource: str,
    now: float,
) -> AssignmentRecord:
    """``record`` with ``container`` answered; ``allocated`` once no device container waits."""
    allocated = (
        *record.allocated,
        ContainerAllocation(
            container=container.container, device_ids=tuple(device_ids), allocated_at=now
        ),
    )
    done = len(allocated) >= len(device_containers(record, resource))
    return msgspec.structs.replace(
        record,
        allocated=allocated,
        state="allocated" if done else record.state,
        allocated_at=now if done else record.allocated_at,
    )


def plan_allocation(
    device_ids: Sequence[str],
    views: Iterable[RecordView],
    *,
    node: str,
    resource: str,
    advertised: AbstractSet[str],
    gpus: Mapping[str, GpuTelemetry],
    options: ResponseOptions,
    now: float,
    bookings: Mapping[str, Booking],
    retired: AbstractSet[str] = frozenset(),
    refused: AbstractSet[str] = frozenset(),
) -> Allocation | Refusal:
    """Decide one container's Allocate: which record, its next state, the response.

    The oldest matching bound record that can be served now wins; one that cannot (it matches
    no booking, by ``bookings``, the pods' bookings on this node by UID; or its GPU is unhealthy
    or not listed) never blocks a younger one. When none can,
    the oldest one's reason is the answer. Records keyed in ``refused`` (an Allocate that tried
    them was refused, so their pod most likely failed admission) come after every other one.
    """
    refusal = check_device_ids(device_ids, advertised, retired)
    if refusal is not None:
        return refusal
    candidates = list(views)
    matching = matching_records(candidates, count=len(device_ids), resource=resource)
    if not matching:
        return Refusal(
            kind="no_record",
            message=describe_missing(
                candidates, count=len(device_ids), resource=resource, node=node
            ),
        )
    if refused:
        matching.sort(key=lambda view: view.key in refused)  # stable: oldest first otherwise
    first_refusal: Refusal | None = None
    for view in matching:
        container = next_container(view.record, resource)
        assert container is not None  # matching_records only returns records with one
        forged = uncommitted(view, bookings=bookings)
        if forged is not None:
            first_refusal = first_refusal or forged
            continue
        grant = container_grant(view.record, container, gpus=gpus, options=options)
        if isinstance(grant, Refusal):
            first_refusal = first_refusal or grant
            continue
        record = advance(view.record, container, device_ids, resource=resource, now=now)
        return Allocation(taken=view, record=record, container=container, grant=grant)
    assert first_refusal is not None
    return first_refusal


def uncommitted(view: RecordView, *, bookings: Mapping[str, Booking]) -> Refusal | None:
    """The refusal of a record that is not what a placer committed, or None when it is."""
    problem = booking_problem(view.record, bookings.get(view.record.pod_uid))
    if problem is None:
        return None
    return Refusal(
        kind="uncommitted",
        message=f"assignment record {view.key} is not granted: {problem}",
    )


def committed(views: Iterable[RecordView], *, bookings: Mapping[str, Booking]) -> list[RecordView]:
    """The records that stand for a placer's commit."""
    return [v for v in views if uncommitted(v, bookings=bookings) is None]


def _sickness(uuid: str, gpus: Mapping[str, GpuTelemetry]) -> str:
    """Why GPU ``uuid`` cannot serve a container now, or "" when it can."""
    gpu = gpus.get(uuid)
    if gpu is None:
        return f"{uuid} (not in the inventory)"
    if gpu.health == "healthy":
        return ""
    return f"{uuid} ({gpu.health}{': ' + gpu.health_reason if gpu.health_reason else ''})"


def pre_start_check(
    device_ids: Sequence[str],
    views: Iterable[RecordView],
    *,
    gpus: Mapping[str, GpuTelemetry],
) -> Refusal | None:
    """Before a container starts: the record that was allocated these IDs, and its GPUs healthy."""
    wanted = tuple(device_ids)
    for view in views:
        record = view.record
        for answered in record.allocated:
            if sorted(answered.device_ids) != sorted(wanted):
                continue
            slices = next(
                (c.gpus for c in record.containers if c.container == answered.container), ()
            )
            sick = [_sickness(s.uuid, gpus) for s in slices if _sickness(s.uuid, gpus)]
            if sick:
                return Refusal(
                    kind="unavailable",
                    message=f"{record.namespace}/{record.name} container {answered.container} "
                    f"was allocated GPU {', '.join(sick)}",
                )
            return None
    return Refusal(
        kind="no_record",
        message=f"no assignment record was allocated the devices {', '.join(wanted)}",
    )


# --- what this plugin granted, across its restarts ---------------------------------------------


class Granted(msgspec.Struct, frozen=True, kw_only=True):
    """What this plugin granted of one record: its commit and the containers answered."""

    commit: str
    containers: tuple[str, ...]
    slices: tuple[ContainerSlices, ...] = ()
    """The answered containers' slices (empty in a state file from before they were kept)."""
    unrecorded_at: float | None = None
    """When the store lost the record while its pod held the grant (NATS lost its store):
    kept to answer what was granted, no longer checked against records."""


def granted_of(record: AssignmentRecord) -> Granted:
    """What granting ``record`` (as committed after an Allocate) gave away."""
    answered = tuple(a.container for a in record.allocated)
    return Granted(
        commit=record.commit,
        containers=answered,
        slices=tuple(c for c in record.containers if c.container in answered),
    )


def granted_problem(record: AssignmentRecord, granted: Granted | None) -> str | None:
    """Why ``record`` contradicts what this plugin granted of it (``granted``, kept across its
    restarts); None when it does not. A record of another commit at the key is a new placement
    (the commit check decides whether it is believed); a released one gives everything back."""
    if granted is None or granted.commit != record.commit or record.state == "released":
        return None
    answered = tuple(a.container for a in record.allocated)
    if answered[: len(granted.containers)] == granted.containers:
        return None
    return (
        f"this plugin granted container {', '.join(granted.containers)} of commit "
        f"{record.commit} (before a restart, kept in its state file); the record says "
        f"{', '.join(answered) or 'none'} allocated in state {record.state}: moved backwards"
    )
