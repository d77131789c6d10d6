"""Pure: which record an Allocate takes, the record's next state, the response, the refusals."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.deviceplugin.rules import allocate
from services.deviceplugin.rules.allocate import (
    Allocation,
    ContainerGrant,
    Mount,
    Refusal,
    ResponseOptions,
)
from shared.messages.assignments import (
    AssignmentRecord,
    AssignmentState,
    ContainerAllocation,
    RecordView,
)
from shared.messages.inventory import GpuTelemetry
from shared.messages.ledger import Booking
from tests.deviceplugin.builders import (
    GPU_RESOURCE,
    MEMORY_RESOURCE,
    NODE,
    container,
    gpu,
    record,
    share,
    uuid,
)
from tests.harness.commits import bookings_of

GPUS = {g.uuid: g for g in (gpu(0, memory_mib=16_384), gpu(1, memory_mib=24_576), gpu(2))}
NOW = 1_700_000_500.0
NO_ISOLATION = ResponseOptions()


def ids(index: int, *ordinals: int) -> tuple[str, ...]:
    return tuple(f"{uuid(index)}::{n}" for n in ordinals)


ADVERTISED = frozenset(i for index in range(3) for i in ids(index, *range(8)))


def views(*records: AssignmentRecord) -> list[RecordView]:
    return [
        RecordView(key=f"node.{r.pod_uid}", revision=n + 1, record=r) for n, r in enumerate(records)
    ]


def plan(
    device_ids: tuple[str, ...],
    *records: AssignmentRecord,
    options: ResponseOptions = NO_ISOLATION,
    gpus: dict[str, GpuTelemetry] = GPUS,
    resource: str = GPU_RESOURCE,
    advertised: frozenset[str] = ADVERTISED,
    bookings: dict[str, Booking] | None = None,
    refused: frozenset[str] = frozenset(),
) -> Allocation | Refusal:
    """Plan over ``records``, each committed (its booking held) unless ``bookings`` says
    otherwise."""
    return allocate.plan_allocation(
        device_ids,
        views(*records),
        node=NODE,
        resource=resource,
        advertised=advertised,
        gpus=gpus,
        options=options,
        now=NOW,
        bookings=bookings_of(*records) if bookings is None else bookings,
        refused=refused,
    )


def granted(result: Allocation | Refusal) -> Allocation:
    assert isinstance(result, Allocation), result
    return result


# --- which record -------------------------------------------------------------------------------


ONE_GPU = container("main", share(0))
TWO_GPUS = container("main", share(0), share(1))


@pytest.mark.parametrize(
    ("records", "count", "expected_uid"),
    [
        pytest.param([record("a", ONE_GPU)], 1, "a", id="single"),
        pytest.param(
            [record("late", ONE_GPU, bound_at=200.0), record("early", ONE_GPU, bound_at=100.0)],
            1,
            "early",
            id="oldest-bound-first",
        ),
        pytest.param(
            [record("pair", TWO_GPUS, bound_at=100.0), record("one", ONE_GPU, bound_at=200.0)],
            1,
            "one",
            id="size-must-match-exactly",
        ),
        pytest.param([record("r", ONE_GPU, state="reserved")], 1, None, id="reserved-not-yet"),
        pytest.param([record("done", ONE_GPU, state="allocated")], 1, None, id="allocated-done"),
        pytest.param([record("gone", ONE_GPU, state="released")], 1, None, id="released"),
        pytest.param(
            [
                record(
                    "multi",
                    container("init", share(0)),
                    container("main", share(1), share(2)),
                    allocated=(
                        ContainerAllocation(
                            container="init", device_ids=ids(0, 0), allocated_at=1.0
                        ),
                    ),
                )
            ],
            2,
            "multi",
            id="multi-container-next-is-second",
        ),
        pytest.param(
            [record("cpu-first", container("sidecar"), container("main", share(0)))],
            1,
            "cpu-first",
            id="container-without-devices-skipped",
        ),
        pytest.param(
            [record("mem", container("main", share(0), devices=4096, resource=MEMORY_RESOURCE))],
            1,
            None,
            id="other-resource-not-matched",
        ),
    ],
)
def test_pick_record(records: list[AssignmentRecord], count: int, expected_uid: str | None) -> None:
    picked = allocate.pick_record(views(*records), count=count, resource=GPU_RESOURCE)
    assert (picked.record.pod_uid if picked else None) == expected_uid


# --- the next state ---------------------------------------------------------------------------


def test_single_container_pod_becomes_allocated() -> None:
    result = granted(plan(ids(2, 5), record("a", ONE_GPU)))
    assert result.record.state == "allocated" and result.complete
    assert result.record.allocated_at == NOW
    assert result.record.allocated == (
        ContainerAllocation(container="main", device_ids=ids(2, 5), allocated_at=NOW),
    )
    assert result.taken.revision == 1
    assert result.container.container == "main"
    assert [s.uuid for s in result.container.gpus] == [uuid(0)]


def test_multi_container_pod_stays_bound_until_last_container() -> None:
    pod = record(
        "m",
        container("first", share(0)),
        container("sidecar"),
        container("second", share(1), share(2)),
    )
    first = granted(plan(ids(0, 0), pod))
    assert (first.container.container, first.record.state) == ("first", "bound")
    assert not first.complete
    second = granted(plan(ids(1, 0, 1), first.record))
    assert (second.container.container, second.record.state) == ("second", "allocated")
    assert [a.container for a in second.record.allocated] == ["first", "second"]
    assert second.complete


# --- the response -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "envs", "mounts"),
    [
        pytest.param(ResponseOptions(), {}, (), id="none"),
        pytest.param(
            ResponseOptions(isolation="mps", mps_pipe_dir="/run/mps"),
            {
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"{uuid(0)}=4096M,{uuid(1)}=2048M",
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "20",
                "CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps",
            },
            (Mount(container_path="/tmp/nvidia-mps", host_path="/run/mps", read_only=False),),
            id="mps",
        ),
        pytest.param(
            ResponseOptions(isolation="hami-core", hami_core_library="/opt/hami/libvgpu.so"),
            {
                "CUDA_DEVICE_MEMORY_LIMIT_0": "4096m",
                "CUDA_DEVICE_MEMORY_LIMIT_1": "2048m",
                "CUDA_DEVICE_SM_LIMIT": "20",
                "LD_PRELOAD": "/usr/local/vgpu/libvgpu.so",
            },
            (Mount(container_path="/usr/local/vgpu/libvgpu.so", host_path="/opt/hami/libvgpu.so"),),
            id="hami-core",
        ),
        pytest.param(
            ResponseOptions(compat=frozenset({"volcano"})),
            {"VOLCANO_GPU_ALLOCATED": "6144", "VOLCANO_GPU_MEMORY_TOTAL": "40960"},
            (),
            id="volcano-compat",
        ),
        pytest.param(
            ResponseOptions(compat=frozenset({"aliyun"})),
            {
                "ALIYUN_COM_GPU_MEM_IDX": "0,1",
                "ALIYUN_COM_GPU_MEM_POD": str(4096 + 2048 + 1000),
                "ALIYUN_COM_GPU_MEM_CONTAINER": "6144",
                "ALIYUN_COM_GPU_MEM_DEV": "16384,24576",
            },
            (),
            id="aliyun-compat",
        ),
    ],
)
def test_response_per_isolation_provider_and_compat(
    options: ResponseOptions, envs: dict[str, str], mounts: tuple[Mount, ...]
) -> None:
    pod = record(
        "p",
        container("main", share(0, memory_mib=4096, cores=30), share(1, memory_mib=2048, cores=20)),
        container("other", share(2, memory_mib=1000)),
    )
    grant = granted(plan(ids(2, 0, 1), pod, options=options)).grant
    assert grant == ContainerGrant(
        envs={
            "NVIDIA_VISIBLE_DEVICES": f"{uuid(0)},{uuid(1)}",
            "TESSERA_GPU_MEMORY_LIMIT_MIB": "4096,2048",
            "TESSERA_GPU_MEMORY_TOTAL_MIB": "16384,24576",
            "TESSERA_GPU_CORES": "30,20",
            **envs,
        },
        mounts=mounts,
        annotations={"tessera.dev/pod-uid": "p", "tessera.dev/container": "main"},
    )


# --- refusals ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("device_ids", "records", "gpus", "kind", "says"),
    [
        pytest.param((), [record("a", ONE_GPU)], GPUS, "invalid", "no device IDs", id="empty"),
        pytest.param(
            ids(0, 1) * 2,
            [record("a", TWO_GPUS)],
            GPUS,
            "invalid",
            f"repeated: {uuid(0)}::1",
            id="repeated",
        ),
        pytest.param(
            ("GPU-other::9",),
            [record("a", ONE_GPU)],
            GPUS,
            "invalid",
            "never advertised: GPU-other::9",
            id="never-advertised",
        ),
        pytest.param(
            ids(0, 1),
            [],
            GPUS,
            "no_record",
            f"no bound assignment record on node {NODE} has a next container needing "
            "exactly 1 tessera.dev/gpu device; no pod bound to this node is waiting",
            id="no-record-at-all",
        ),
        pytest.param(
            ids(0, 0, 1, 2, 3),
            [record("a", TWO_GPUS)],
            GPUS,
            "no_record",
            "exactly 4 tessera.dev/gpu devices; bound pods waiting: ml/pod-a container "
            "main needs 2",
            id="no-record-of-that-size",
        ),
        pytest.param(
            ids(0, 1),
            [record("a", ONE_GPU)],
            {},
            "unavailable",
            f"names GPU {uuid(0)}, which the inventory of node {NODE} does not list",
            id="decided-gpu-not-in-inventory",
        ),
        pytest.param(
            ids(0, 1),
            [record("a", container("main", devices=1))],
            GPUS,
            "invalid",
            "has no GPU slices for container main",
            id="record-without-slices",
        ),
    ],
)
def test_refusals_say_what_is_missing(
    device_ids: tuple[str, ...],
    records: list[AssignmentRecord],
    gpus: dict[str, GpuTelemetry],
    kind: str,
    says: str,
) -> None:
    result = plan(device_ids, *records, gpus=gpus)
    assert isinstance(result, Refusal)
    assert result.kind == kind
    assert says in result.message


# --- PreStartContainer --------------------------------------------------------------------------


ALLOCATED = record(
    "s",
    ONE_GPU,
    state="allocated",
    allocated=(ContainerAllocation(container="main", device_ids=ids(2, 3), allocated_at=1.0),),
)


@pytest.mark.parametrize(
    ("device_ids", "gpus", "says"),
    [
        pytest.param(ids(2, 3), GPUS, None, id="healthy"),
        pytest.param(
            ids(2, 3),
            {uuid(0): gpu(0, health="unhealthy", reason="XID 79")},
            f"was allocated GPU {uuid(0)} (unhealthy: XID 79)",
            id="gpu-turned-unhealthy",
        ),
        pytest.param(ids(2, 3), {}, "(not in the inventory)", id="gpu-gone"),
        pytest.param(
            ids(2, 4), GPUS, "no assignment record was allocated the devices", id="unknown-ids"
        ),
    ],
)
def test_pre_start_check(
    device_ids: tuple[str, ...], gpus: dict[str, GpuTelemetry], says: str | None
) -> None:
    refusal = allocate.pre_start_check(device_ids, views(ALLOCATED), gpus=gpus)
    if says is None:
        assert refusal is None
    else:
        assert refusal is not None and says in refusal.message


# --- only committed records (issue 19) -----------------------------------------------------------

REAL = record("real", container("main", share(0, memory_mib=16_384, cores=100)))
"""A pod holding GPU 0 whole, committed."""
FORGED = record("ghost", container("main", share(0, memory_mib=1024, cores=10)), commit="c-x")
"""A well-formed bound record of a pod that does not exist, on the GPU ``REAL`` holds whole."""


MOVED = msgspec.structs.replace(REAL, node="gpu-node-2.example.com")
UNCOMMITTED: list[tuple[AssignmentRecord, dict[str, Booking], str]] = [
    (FORGED, bookings_of(REAL), "ledger holds nothing for pod ml/pod-ghost"),
    (
        msgspec.structs.replace(FORGED, pod_uid="real", name="pod-real"),
        bookings_of(REAL),
        "ledger holds commit commit-real for pod ml/pod-real, not commit c-x",
    ),
    (
        msgspec.structs.replace(REAL, containers=FORGED.containers),
        bookings_of(REAL),
        "slices of pod ml/pod-real are not the ones commit commit-real booked",
    ),
    (msgspec.structs.replace(FORGED, commit=""), bookings_of(FORGED), "no commit"),
    (MOVED, bookings_of(REAL), "booked ml/pod-real on gpu-node-1.example.com"),
]


@pytest.mark.parametrize(
    ("forged", "bookings", "says"),
    UNCOMMITTED,
    ids=["not-booked", "booking-of-another-commit", "other-slices", "no-commit", "moved"],
)
def test_a_record_that_matches_no_booking_is_refused_with_the_reason(
    forged: AssignmentRecord, bookings: dict[str, Booking], says: str
) -> None:
    result = plan(ids(0, 0), forged, bookings=bookings)
    assert isinstance(result, Refusal) and result.kind == "uncommitted", result
    assert says in result.message


def test_a_forged_older_record_never_blocks_the_committed_one() -> None:
    assert REAL.bound_at is not None
    forged = msgspec.structs.replace(FORGED, bound_at=REAL.bound_at - 50.0)  # older: first pick
    result = granted(plan(ids(0, 3), forged, REAL, bookings=bookings_of(REAL)))
    assert result.taken.record.pod_uid == "real"
    assert result.grant.envs["TESSERA_GPU_MEMORY_LIMIT_MIB"] == "16384"


@pytest.mark.parametrize(
    ("refused", "served"),
    [
        (frozenset(), "older"),
        (frozenset({"node.older"}), "younger"),  # its Allocate was refused: its pod failed
        (frozenset({"node.older", "node.younger"}), "older"),
        (frozenset({"node.gone"}), "older"),
    ],
)
def test_a_refused_record_is_served_after_every_other_one(
    refused: frozenset[str], served: str
) -> None:
    older = record("older", container("main", share(0)), bound_at=100.0)
    younger = record("younger", container("main", share(0)), bound_at=200.0)
    result = granted(plan(ids(0, 0), younger, older, refused=refused))
    assert result.taken.record.pod_uid == served


# --- properties -------------------------------------------------------------------------------


@st.composite
def bound_records(draw: st.DrawFn) -> list[AssignmentRecord]:
    count = draw(st.integers(0, 6))
    records = []
    for n in range(count):
        sizes = draw(st.lists(st.integers(0, 3), min_size=1, max_size=3))
        containers = [
            container(f"c{k}", *(share(i % 3) for i in range(size))) for k, size in enumerate(sizes)
        ]
        state: AssignmentState = draw(st.sampled_from(["reserved", "bound", "bound", "allocated"]))
        bound_at = draw(st.floats(1.0, 1000.0, allow_nan=False))
        records.append(record(f"u{n}", *containers, state=state, bound_at=bound_at))
    return records


@given(
    records=bound_records(),
    picked_ordinals=st.lists(st.integers(0, 7), min_size=1, max_size=3, unique=True),
    picked_gpu=st.integers(0, 2),
)
def test_any_claim_follows_the_oldest_matching_record(
    records: list[AssignmentRecord], picked_ordinals: list[int], picked_gpu: int
) -> None:
    device_ids = ids(picked_gpu, *picked_ordinals)
    result = plan(device_ids, *records)
    matching = [
        r
        for r in records
        if (c := allocate.next_container(r, GPU_RESOURCE)) is not None
        and allocate.devices_needed(c, GPU_RESOURCE) == len(device_ids)
    ]
    if not matching:
        assert isinstance(result, Refusal) and result.kind == "no_record"
        return
    taken = granted(result)
    oldest = min(matching, key=lambda r: (r.bound_at, r.decided_at, r.pod_uid))
    assert taken.taken.record == oldest
    # The response follows the record, whatever IDs the kubelet picked.
    assert taken.grant.envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(
        s.uuid for s in taken.container.gpus
    )
    # One more container answered; the state only moves forward.
    assert len(taken.record.allocated) == len(oldest.allocated) + 1
    waiting = allocate.device_containers(oldest, GPU_RESOURCE)
    complete = len(taken.record.allocated) == len(waiting)
    assert taken.record.state == ("allocated" if complete else "bound")
    assert taken.complete == complete
