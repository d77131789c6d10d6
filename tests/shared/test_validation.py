"""``shared.validation``: what a record or an inventory snapshot may say (issue 9, items 3-6)."""

from __future__ import annotations

from typing import Any, Unpack

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared import subjects, validation
from shared.messages.assignments import AssignmentRecord, AssignmentState, ContainerAllocation
from shared.messages.base import ContainerSlices, GpuSlice
from shared.messages.inventory import GpuProcess, GpuTelemetry, NodeInventory
from tests.harness import wire

NODE = "gpu-1.example"
NOW = 1_700_000_000.0


def gpu(index: int, *, memory_mib: int = 81_920, **fields: Any) -> GpuTelemetry:
    return GpuTelemetry(
        uuid=f"GPU-{index}",
        index=index,
        model=fields.pop("model", "A100"),
        memory_total_mib=memory_mib,
        memory_used_mib=fields.pop("used", 0),
        memory_free_mib=fields.pop("free", memory_mib),
        **fields,
    )


def node_inventory(
    *gpus: GpuTelemetry,
    node: str = NODE,
    observed_at: float = NOW,
    **fields: Unpack[wire.InventoryFields],
) -> NodeInventory:
    return wire.inventory(*(gpus or (gpu(0), gpu(1))), node=node, at=observed_at, **fields)


def piece(
    gpu_index: int = 0, *, index: int | None = None, memory_mib: int = 4096, cores: int = 30
) -> GpuSlice:
    """A slice of GPU ``gpu_index`` (``GPU-<gpu_index>``); ``index`` says another (a wrong one)."""
    return wire.share(
        gpu_index if index is None else index,
        uuid=f"GPU-{gpu_index}",
        memory_mib=memory_mib,
        cores=cores,
    )


def slices(*pieces: GpuSlice, name: str = "main", count: int | None = None) -> ContainerSlices:
    return wire.container(name, *pieces, devices=count)


def assignment(
    *containers: ContainerSlices,
    pod_uid: str = "uid-1",
    node: str = NODE,
    state: AssignmentState = "bound",
    **fields: Unpack[wire.RecordFields],
) -> AssignmentRecord:
    """Pod ``ml/train``'s record of no commit, bound a second after it was decided unless
    ``reserved``."""
    return wire.record(
        pod_uid,
        *(containers or (slices(piece()),)),
        node=node,
        commit="",
        name="train",
        state=state,
        **({"bound_at": None if state == "reserved" else NOW + 1} | fields),
    )


KEY = subjects.assignment_key(NODE, "uid-1")


@pytest.mark.parametrize(
    ("record", "key", "says"),
    [
        pytest.param(assignment(), KEY, None, id="valid"),
        pytest.param(assignment(state="reserved"), KEY, None, id="valid-reserved"),
        pytest.param(
            assignment(), subjects.assignment_key(NODE, "uid-2"), "does not match", id="uid"
        ),
        pytest.param(assignment(node="gpu-2"), KEY, "does not match the record", id="node"),
        pytest.param(assignment(pod_uid=""), KEY, "empty pod_uid", id="empty-uid"),
        pytest.param(assignment(slices(piece(memory_mib=-1))), KEY, "-1 MiB", id="negative-mib"),
        pytest.param(assignment(slices(piece(cores=101))), KEY, "101 % of the SMs", id="cores"),
        pytest.param(assignment(slices(piece(index=-2))), KEY, "index -2", id="index"),
        pytest.param(assignment(slices(piece(), piece())), KEY, "more than once", id="twice"),
        pytest.param(assignment(slices(piece(), count=3)), KEY, "asks for 3", id="count"),
        pytest.param(
            assignment(ContainerSlices(container="c", gpus=(), resources={"tessera.dev/gpu": 1})),
            KEY,
            "asks for 1 tessera.dev/gpu but the record gives it 0",
            id="devices-without-slices",
        ),
        pytest.param(
            assignment(slices(piece(0)), slices(piece(1))),
            KEY,
            "container names are empty or repeated",
            id="same-container-name",
        ),
        pytest.param(assignment(allocated_at=NOW), KEY, "allocated_at set", id="bound-allocated"),
        pytest.param(assignment(released_at=NOW), KEY, "released_at set", id="bound-released"),
        pytest.param(assignment(state="allocated"), KEY, "without allocated_at", id="allocated"),
        pytest.param(
            assignment(
                allocated=(ContainerAllocation(container="x", device_ids=("a",), allocated_at=1),)
            ),
            KEY,
            "allocated container 'x' is not one of the record's containers",
            id="unknown-allocated",
        ),
        pytest.param(
            assignment(
                allocated=(
                    ContainerAllocation(container="main", device_ids=("a", "a"), allocated_at=1),
                )
            ),
            KEY,
            "allocated a device ID twice",
            id="device-twice",
        ),
    ],
)
def test_record_problem(record: AssignmentRecord, key: str, says: str | None) -> None:
    problem = validation.record_problem(record, key=key)
    if says is None:
        assert problem is None
    else:
        assert problem is not None and says in problem


@pytest.mark.parametrize(
    ("record", "says"),
    [
        pytest.param(assignment(), None, id="valid"),
        pytest.param(assignment(slices(piece(7))), "names GPU GPU-7, which node", id="unlisted"),
        pytest.param(
            assignment(slices(piece(0, index=1))), "at index 1, but it is index 0", id="index"
        ),
        pytest.param(
            assignment(slices(piece(memory_mib=10_000_000))),
            "holds 10000000 MiB of GPU GPU-0, which has 81920 MiB",
            id="memory",
        ),
    ],
)
def test_record_inventory_problem(record: AssignmentRecord, says: str | None) -> None:
    problem = validation.assignment_problem(record, key=KEY, inventory=node_inventory())
    assert problem == says or (says is not None and problem is not None and says in problem)


def test_a_released_record_is_not_checked_against_the_inventory() -> None:
    gone = assignment(slices(piece(7)), state="released", released_at=NOW + 9)
    assert validation.assignment_problem(gone, key=KEY, inventory=node_inventory()) is None


BOUND = assignment()
ANSWERED = ContainerAllocation(container="main", device_ids=("d0",), allocated_at=NOW + 2)
ALLOCATED = msgspec.structs.replace(
    BOUND, state="allocated", allocated=(ANSWERED,), allocated_at=NOW + 2
)
RELEASED = msgspec.structs.replace(ALLOCATED, state="released", released_at=NOW + 3)


@pytest.mark.parametrize(
    ("before", "after", "says"),
    [
        pytest.param(None, BOUND, None, id="first-version"),
        pytest.param(BOUND, BOUND, None, id="touched"),
        pytest.param(BOUND, ALLOCATED, None, id="allocated"),
        pytest.param(ALLOCATED, RELEASED, None, id="released"),
        pytest.param(ALLOCATED, BOUND, "state moved backwards: allocated -> bound", id="back"),
        pytest.param(RELEASED, BOUND, "state moved backwards: released -> bound", id="revived"),
        # The pod placed on the same node again after a requeue: a new commit takes the key of
        # the released record (the burst hand-off's Failed pods: it was refused as "backwards").
        pytest.param(
            RELEASED,
            msgspec.structs.replace(BOUND, state="reserved", commit="c-2"),
            None,
            id="new-commit-over-released",
        ),
        pytest.param(
            msgspec.structs.replace(BOUND, commit="c-1"),
            msgspec.structs.replace(BOUND, state="reserved", commit="c-2"),
            "a record of commit c-2 over the live bound record of commit c-1",
            id="new-commit-over-live",
        ),
        # A commit released at this key beside another one's fence never takes the key again.
        pytest.param(
            msgspec.structs.replace(RELEASED, commit="c-1", fenced=("c-2",)),
            msgspec.structs.replace(BOUND, state="reserved", commit="c-2"),
            "a record of commit c-2 over the released record of commit c-1, which fences it",
            id="fenced-commit-over-released",
        ),
        pytest.param(
            BOUND,
            msgspec.structs.replace(BOUND, containers=(slices(piece(1, index=1)),)),
            "containers changed",
            id="slices-swapped",
        ),
        pytest.param(
            msgspec.structs.replace(BOUND, allocated=(ANSWERED,)),
            BOUND,
            "dropped or changed containers already allocated",
            id="forgot-an-answer",
        ),
    ],
)
def test_transition_problem(
    before: AssignmentRecord | None, after: AssignmentRecord, says: str | None
) -> None:
    problem = validation.transition_problem(before, after)
    assert problem == says or (says is not None and problem is not None and says in problem)


@pytest.mark.parametrize(
    ("inventory", "says"),
    [
        pytest.param(node_inventory(), None, id="valid"),
        pytest.param(node_inventory(node="other"), "inventory of node 'other'", id="node"),
        pytest.param(node_inventory(observed_at=NOW + 3600), "3600 s ahead", id="future"),
        pytest.param(node_inventory(observed_at=float("nan")), "is not a time", id="nan"),
        pytest.param(node_inventory(sequence=-1), "sequence -1", id="sequence"),
        pytest.param(
            node_inventory(sequence=2**62),
            f"sequence {2**62} outside 0..{2**53 - 1}",
            id="sequence-no-producer-reaches",
        ),
        pytest.param(
            node_inventory(producer="x" * 2000), "producer longer than 1024", id="long-producer"
        ),
        pytest.param(
            node_inventory(gpu(0, model="A" * 2000)), "model longer than 1024", id="long-model"
        ),
        pytest.param(
            node_inventory(gpu(0, power_w=float("nan"))), "power_w nan outside", id="power-nan"
        ),
        pytest.param(
            node_inventory(gpu(0, temperature_c=5000)), "temperature_c 5000", id="temperature"
        ),
        pytest.param(
            node_inventory(gpu(0, sm_clock_mhz=10**9)), "sm_clock_mhz 1000000000", id="clock"
        ),
        pytest.param(
            node_inventory(gpu(0, numa_node=10**6)), "numa_node 1000000 outside -1..1023", id="numa"
        ),
        pytest.param(node_inventory(gpu(0, numa_node=-1)), None, id="numa-unknown"),
        pytest.param(
            node_inventory(gpu(0, processes=(GpuProcess(pid=7, used_memory_mib=10**9),))),
            "process 7 holds 1000000000 MiB of 81920",
            id="process-memory",
        ),
        pytest.param(
            node_inventory(gpu(0, processes=(GpuProcess(pid=7, used_memory_mib=1),) * 5000)),
            "processes 5000 outside 0..4096",
            id="too-many-processes",
        ),
        pytest.param(node_inventory(gpu(0, memory_mib=10**12)), "1000000000000 MiB", id="memory"),
        pytest.param(node_inventory(gpu(0, memory_mib=0)), "0 MiB of memory", id="no-memory"),
        pytest.param(node_inventory(gpu(0, used=90_000)), "memory_used_mib 90000", id="used"),
        pytest.param(node_inventory(gpu(0), gpu(0)), "UUID GPU-0 listed more than once", id="dup"),
        pytest.param(node_inventory(gpu(300)), "index 300 outside", id="index"),
        pytest.param(node_inventory(*(gpu(i) for i in range(257))), "257 GPUs", id="too-many-gpus"),
        pytest.param(
            node_inventory(gpu(0, utilization_pct=250)),
            "utilization_pct 250 outside 0..100",
            id="utilization",
        ),
    ],
)
def test_inventory_problem(inventory: NodeInventory, says: str | None) -> None:
    problem = validation.inventory_problem(inventory, node=NODE, now=NOW)
    assert problem == says or (says is not None and problem is not None and says in problem)


HONEST = "node/1/1.0"


def snapshot(
    sequence: int, at: float, *gpus: GpuTelemetry, producer: str = HONEST
) -> NodeInventory:
    return node_inventory(*gpus, sequence=sequence, observed_at=at, producer=producer)


@pytest.mark.parametrize(
    ("candidate", "held", "taken"),
    [
        pytest.param(snapshot(1, NOW), None, True, id="first"),
        pytest.param(snapshot(5, NOW - 10), snapshot(4, NOW), True, id="next-of-a-clock-set-back"),
        pytest.param(snapshot(4, NOW - 10), snapshot(5, NOW), False, id="late-older-one"),
        pytest.param(snapshot(5, NOW), snapshot(5, NOW), False, id="the-same-again"),
        pytest.param(
            snapshot(1, NOW + 1, producer="node/2/60.0"), snapshot(900, NOW), True, id="restarted"
        ),
        pytest.param(
            snapshot(1, NOW - 1, producer="node/2/60.0"), snapshot(900, NOW), False, id="older"
        ),
        # A snapshot naming the honest producer with a sequence far ahead (a forgery) holds
        # only until the producer's next snapshot, which is fresher: the way back.
        pytest.param(snapshot(901, NOW + 30), snapshot(2**52, NOW), True, id="fresher-wins-back"),
        pytest.param(
            snapshot(3, NOW + 1, producer=""), snapshot(4, NOW, producer=""), True, id="anonymous"
        ),
    ],
)
def test_take_inventory(
    candidate: NodeInventory, held: NodeInventory | None, *, taken: bool
) -> None:
    verdict = validation.take_inventory(candidate, held, node=NODE, now=NOW + 60)
    assert verdict.problem == ""
    assert verdict.take == (candidate if taken else None)


def test_what_is_held_is_never_dated_after_it_arrived() -> None:
    ahead = snapshot(7, NOW + 200, gpu(0, health="unhealthy"))
    verdict = validation.take_inventory(ahead, snapshot(6, NOW - 5), node=NODE, now=NOW)
    assert verdict.take == msgspec.structs.replace(ahead, observed_at=NOW)
    # So the honest snapshot observed a second later is fresher, not 200 s older.
    honest = snapshot(3, NOW + 1, producer="node/2/9.0")
    assert validation.take_inventory(honest, verdict.take, node=NODE, now=NOW + 1).take == honest


def test_a_snapshot_that_cannot_be_believed_is_a_problem_and_takes_nothing() -> None:
    verdict = validation.take_inventory(
        snapshot(2**62, NOW), snapshot(4, NOW - 30), node=NODE, now=NOW
    )
    assert verdict.take is None
    assert verdict.problem == f"sequence {2**62} outside 0..{2**53 - 1}"


# A reader's view over time: the honest producer publishes every HEARTBEAT seconds with its
# sequence; a forger publishes whatever the bounds let through, any producer, any sequence,
# dated anywhere from long ago to as far ahead as the reader believes.
HEARTBEAT = 30.0
forgeries = st.lists(
    st.tuples(
        st.sampled_from([HONEST, "node/2/2.0", ""]),
        st.integers(0, 2**53 - 1),
        st.floats(-10_000, validation.InventoryLimits().max_future_s),
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=200, deadline=None)
@given(before=st.integers(1, 5), forged=forgeries, skew=st.floats(0, 20))
def test_the_honest_producer_always_takes_its_node_back(
    before: int, forged: list[tuple[str, int, float]], skew: float
) -> None:
    """Whatever a forger sent, the honest producer's first snapshot observed after the last
    forgery arrived (its clock ``skew`` s behind the reader's) is held, and so is every one
    after it; nothing held is ever dated after the reader's clock."""
    held: NodeInventory | None = None
    now = NOW
    sequence = 0

    def receive(snap: NodeInventory) -> None:
        nonlocal held
        verdict = validation.take_inventory(snap, held, node=NODE, now=now)
        if verdict.take is not None:
            held = verdict.take
        assert held is None or held.observed_at <= now

    def honest() -> NodeInventory:
        nonlocal sequence
        sequence += 1
        return snapshot(sequence, now - skew)

    for _ in range(before):
        now += HEARTBEAT
        receive(honest())
    for producer, forged_sequence, offset in forged:
        now += 1.0
        receive(snapshot(forged_sequence, now + offset, gpu(9), producer=producer))
    now += skew + 1.0
    for _ in range(3):
        mine = honest()
        receive(mine)
        assert held == mine
        now += HEARTBEAT


@given(
    memory=st.integers(-(2**20), 2**24),
    cores=st.integers(-50, 200),
    index=st.integers(-2, 4),
    uuid_index=st.integers(0, 4),
)
def test_a_record_that_passes_never_exceeds_its_gpu(
    memory: int, cores: int, index: int, uuid_index: int
) -> None:
    inventory = node_inventory(gpu(0, memory_mib=40_960), gpu(1))
    record = assignment(slices(piece(uuid_index, index=index, memory_mib=memory, cores=cores)))
    if validation.assignment_problem(record, key=KEY, inventory=inventory) is None:
        listed = {g.uuid: g for g in inventory.gpus}
        [share] = record.containers[0].gpus
        assert share.uuid in listed and listed[share.uuid].index == share.index
        assert 0 <= share.memory_mib <= listed[share.uuid].memory_total_mib
        assert 0 <= share.cores <= 100
