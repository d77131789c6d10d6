"""The pure core: health state machine, snapshot building and the publish decision."""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.inventory import snapshot
from services.inventory.reader import GpuFault, HealthEvent, NodeReading
from services.inventory.snapshot import APPLICATION_XIDS, Deadbands, InventoryState, Policy
from shared import validation
from shared.messages.inventory import GpuLink, GpuProcess, GpuTelemetry
from tests.inventory.builders import gpu, node, xid

POLICY = Policy(heartbeat_s=30.0, probe_after_s=60.0, deadbands=Deadbands())


# --- health --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("event", "reason"),
    [
        pytest.param(xid(79), "XID 79: GPU has fallen off the bus", id="xid-79-fell-off-bus"),
        pytest.param(xid(48), "XID 48: double-bit ECC error", id="xid-48-dbe"),
        pytest.param(xid(94), "XID 94: contained ECC error", id="xid-94"),
        pytest.param(xid(999), "XID 999", id="unknown-xid-is-critical"),
        pytest.param(
            HealthEvent(uuid="GPU-a", kind="ecc_double_bit"),
            "double-bit ECC error",
            id="double-bit-ecc",
        ),
        *[
            pytest.param(xid(code), None, id=f"application-xid-{code}")
            for code in (13, 31, 43, 45, 68, 109)
        ],
    ],
)
def test_critical_reason(event: HealthEvent, reason: str | None) -> None:
    assert snapshot.critical_reason(event) == reason


@dataclass(frozen=True)
class Read:
    """A read of the node; ``gpu-a`` answers normally unless ``fault`` or ``absent``."""

    fault: str = ""
    absent: bool = False


@dataclass(frozen=True)
class Event:
    event: HealthEvent


Step = tuple[float, Read | Event, str, str]
"""(time, what happens, expected health of gpu-a, expected reason)."""

OK = Read()
LOST = Read(fault="NVML: GPU is lost")
ABSENT = Read(absent=True)
XID_79 = "XID 79: GPU has fallen off the bus"
GONE = snapshot.GONE_REASON


def run_steps(steps: list[Step]) -> None:
    state = InventoryState()
    for number, (now, action, health, reason) in enumerate(steps):
        if isinstance(action, Event):
            state = snapshot.apply_event(state, action.event, now=now, policy=POLICY)
        elif action.absent:
            state = snapshot.apply_reading(state, node(), now=now, policy=POLICY)
        elif action.fault:
            reading = node(faults=(GpuFault(index=0, uuid="GPU-a", reason=action.fault),))
            state = snapshot.apply_reading(state, reading, now=now, policy=POLICY)
        else:
            state = snapshot.apply_reading(state, node(gpu()), now=now, policy=POLICY)
        record = state.gpus["GPU-a"]
        assert (record.health, record.reason) == (health, reason), f"after step {number}"


@pytest.mark.parametrize(
    "steps",
    [
        pytest.param(
            [(0, OK, "healthy", ""), (5, Event(xid(79)), "unhealthy", XID_79)],
            id="critical-xid-marks-unhealthy",
        ),
        pytest.param(
            [(0, OK, "healthy", ""), (5, Event(xid(13)), "healthy", "")],
            id="application-xid-changes-nothing",
        ),
        pytest.param(
            [
                (0, OK, "healthy", ""),
                (
                    1,
                    Event(HealthEvent(uuid="GPU-a", kind="ecc_double_bit")),
                    "unhealthy",
                    "double-bit ECC error",
                ),
            ],
            id="double-bit-ecc-marks-unhealthy",
        ),
        pytest.param(
            [
                (0, OK, "healthy", ""),
                (5, Event(xid(79)), "unhealthy", XID_79),
                (30, OK, "unhealthy", XID_79),
                (64.9, OK, "unhealthy", XID_79),
            ],
            id="normal-answers-before-the-probe-change-nothing",
        ),
        pytest.param(
            [
                (0, OK, "healthy", ""),
                (5, Event(xid(79)), "unhealthy", XID_79),
                (65, OK, "healthy", ""),
            ],
            id="normal-answer-at-the-probe-recovers",
        ),
        pytest.param(
            [
                (0, OK, "healthy", ""),
                (5, Event(xid(79)), "unhealthy", XID_79),
                (65, LOST, "unhealthy", XID_79),
                (100, OK, "unhealthy", XID_79),
                (125, OK, "healthy", ""),
            ],
            id="failed-probe-tries-again-a-period-later",
        ),
        pytest.param(
            [
                (0, OK, "healthy", ""),
                (10, LOST, "unhealthy", "NVML: GPU is lost"),
                (20, LOST, "unhealthy", "NVML: GPU is lost"),
                (70, OK, "healthy", ""),
            ],
            id="fault-marks-unhealthy-until-the-probe",
        ),
        pytest.param(
            [
                (0, OK, "healthy", ""),
                (5, Event(xid(79)), "unhealthy", XID_79),
                (40, Event(xid(48)), "unhealthy", "XID 48: double-bit ECC error"),
                (65, OK, "unhealthy", "XID 48: double-bit ECC error"),
                (100, OK, "healthy", ""),
            ],
            id="new-critical-event-restarts-the-period",
        ),
        pytest.param(
            [(0, OK, "healthy", ""), (10, ABSENT, "gone", GONE), (11, ABSENT, "gone", GONE)],
            id="vanished-gpu-is-gone",
        ),
        pytest.param(
            [
                (0, OK, "healthy", ""),
                (10, ABSENT, "gone", GONE),
                (11, Event(xid(79)), "gone", GONE),
            ],
            id="event-for-gone-gpu-ignored",
        ),
        pytest.param(
            [
                (0, OK, "healthy", ""),
                (5, Event(xid(79)), "unhealthy", XID_79),
                (10, ABSENT, "gone", GONE),
                (20, OK, "healthy", ""),
            ],
            id="gone-gpu-that-returns-starts-healthy",
        ),
    ],
)
def test_health_transitions(steps: list[Step]) -> None:
    run_steps(steps)


def test_a_fault_without_uuid_is_matched_by_index() -> None:
    state = snapshot.apply_reading(
        InventoryState(), node(gpu("GPU-a", 0), gpu("GPU-b", 1)), now=0, policy=POLICY
    )
    state = snapshot.apply_reading(
        state,
        node(gpu("GPU-a", 0), faults=(GpuFault(index=1, reason="NVML: GPU is lost"),)),
        now=10,
        policy=POLICY,
    )
    assert {uuid: (r.health, r.reason) for uuid, r in state.gpus.items()} == {
        "GPU-a": ("healthy", ""),
        "GPU-b": ("unhealthy", "NVML: GPU is lost"),
    }


def test_a_gpu_failing_before_it_ever_answered_is_published_unhealthy() -> None:
    state = snapshot.apply_reading(
        InventoryState(),
        node(faults=(GpuFault(index=3, reason="NVML: GPU is lost"),)),
        now=0,
        policy=POLICY,
    )
    inventory = snapshot.build_inventory(
        state, node="n1", backend="nvml", observed_at=5.0, sequence=1
    )
    assert inventory.gpus == (
        GpuTelemetry(
            uuid="GPU-unknown-index-3",
            index=3,
            model="unknown",
            memory_total_mib=0,
            memory_used_mib=0,
            memory_free_mib=0,
            health="unhealthy",
            health_reason="NVML: GPU is lost",
        ),
    )


@settings(max_examples=50, deadline=None)
@given(
    codes=st.lists(st.sampled_from(sorted(APPLICATION_XIDS)), max_size=10),
    times=st.lists(st.floats(0, 1e6), min_size=10, max_size=10),
)
def test_application_xids_never_change_the_state(codes: list[int], times: list[float]) -> None:
    state = snapshot.apply_reading(InventoryState(), node(gpu()), now=0, policy=POLICY)
    after = state
    for code, now in zip(codes, times, strict=False):
        after = snapshot.apply_event(after, xid(code), now=now, policy=POLICY)
    assert after == state


# --- snapshot ------------------------------------------------------------------------------


def test_build_inventory_carries_every_field_and_keeps_gone_gpus() -> None:
    busy = gpu(
        "GPU-b",
        1,
        memory_used_mib=4096,
        memory_free_mib=77824,
        utilization_pct=80,
        temperature_c=70,
        power_w=300.5,
        sm_clock_mhz=1410,
        numa_node=1,
        mig_enabled=True,
        processes=(GpuProcess(pid=9, used_memory_mib=4000),),
        links=(
            GpuLink(peer_uuid="GPU-a", level="single", nvlinks=4),
            GpuLink(peer_uuid="GPU-c", level="system", nvlinks=0),
        ),
    )
    state = snapshot.apply_reading(
        InventoryState(), node(gpu("GPU-c", 2), busy), now=0, policy=POLICY
    )
    state = snapshot.apply_reading(state, node(busy, driver="551"), now=1, policy=POLICY)
    inventory = snapshot.build_inventory(
        state, node="n1", backend="fake", observed_at=42.0, sequence=7
    )
    assert (
        inventory.node,
        inventory.observed_at,
        inventory.sequence,
        inventory.backend,
        inventory.driver_version,
    ) == ("n1", 42.0, 7, "fake", "551")
    assert inventory.gpus == (
        GpuTelemetry(
            uuid="GPU-b",
            index=1,
            model="A100-80GB",
            memory_total_mib=81920,
            memory_used_mib=4096,
            memory_free_mib=77824,
            utilization_pct=80,
            temperature_c=70,
            power_w=300.5,
            sm_clock_mhz=1410,
            sm_clock_max_mhz=1410,
            pci_bus_id="00000000:11:00.0",
            numa_node=1,
            nvlink_peers=("GPU-a",),
            links=busy.links,
            mig_enabled=True,
            processes=busy.processes,
        ),
        GpuTelemetry(
            uuid="GPU-c",
            index=2,
            model="A100-80GB",
            memory_total_mib=81920,
            memory_used_mib=0,
            memory_free_mib=81920,
            utilization_pct=0,
            temperature_c=30,
            power_w=60.0,
            sm_clock_mhz=210,
            sm_clock_max_mhz=1410,
            pci_bus_id="00000000:12:00.0",
            numa_node=0,
            health="gone",
            health_reason=snapshot.GONE_REASON,
        ),
    )


# --- publish decision ----------------------------------------------------------------------


def _decide(before: NodeReading, after: NodeReading, *, at: float) -> str | None:
    state = snapshot.apply_reading(InventoryState(), before, now=0, policy=POLICY)
    first = snapshot.next_publication(
        state, node="n1", backend="nvml", observed_at=0, now=0, policy=POLICY
    )
    assert first.reason == "first"
    state = snapshot.apply_reading(first.state, after, now=at, policy=POLICY)
    return snapshot.next_publication(
        state, node="n1", backend="nvml", observed_at=at, now=at, policy=POLICY
    ).reason


BASE = gpu(
    memory_used_mib=1000,
    utilization_pct=50,
    temperature_c=50,
    power_w=200.0,
    processes=(GpuProcess(pid=1, used_memory_mib=900),),
)


@pytest.mark.parametrize(
    ("after", "at", "reason"),
    [
        pytest.param(node(BASE), 1, None, id="unchanged-waits"),
        pytest.param(node(BASE), 30, "heartbeat", id="unchanged-at-heartbeat"),
        pytest.param(
            node(msgspec.structs.replace(BASE, utilization_pct=55)),
            1,
            None,
            id="utilization-within-deadband",
        ),
        pytest.param(
            node(msgspec.structs.replace(BASE, utilization_pct=56)),
            1,
            "changed",
            id="utilization-beyond-deadband",
        ),
        pytest.param(
            node(msgspec.structs.replace(BASE, memory_used_mib=744)),
            1,
            None,
            id="memory-within-deadband",
        ),
        pytest.param(
            node(msgspec.structs.replace(BASE, memory_used_mib=1257)),
            1,
            "changed",
            id="memory-beyond-deadband",
        ),
        pytest.param(
            node(msgspec.structs.replace(BASE, temperature_c=53)),
            1,
            None,
            id="temperature-within-deadband",
        ),
        pytest.param(
            node(msgspec.structs.replace(BASE, temperature_c=46)),
            1,
            "changed",
            id="temperature-beyond-deadband",
        ),
        pytest.param(
            node(msgspec.structs.replace(BASE, power_w=215.0)), 1, None, id="power-within-deadband"
        ),
        pytest.param(
            node(msgspec.structs.replace(BASE, power_w=215.5)),
            1,
            "changed",
            id="power-beyond-deadband",
        ),
        pytest.param(
            node(msgspec.structs.replace(BASE, sm_clock_mhz=1410)),
            1,
            None,
            id="sm-clock-is-not-a-reason",
        ),
        pytest.param(
            node(
                msgspec.structs.replace(
                    BASE,
                    processes=(
                        GpuProcess(pid=1, used_memory_mib=900),
                        GpuProcess(pid=2, used_memory_mib=1),
                    ),
                )
            ),
            1,
            "changed",
            id="new-process",
        ),
        pytest.param(
            node(
                msgspec.structs.replace(BASE, processes=(GpuProcess(pid=1, used_memory_mib=1200),))
            ),
            1,
            "changed",
            id="process-memory-beyond-deadband",
        ),
        pytest.param(
            node(
                msgspec.structs.replace(BASE, processes=(GpuProcess(pid=1, used_memory_mib=1100),))
            ),
            1,
            None,
            id="process-memory-within-deadband",
        ),
        pytest.param(
            node(msgspec.structs.replace(BASE, mig_enabled=True)), 1, "changed", id="mig-mode"
        ),
        pytest.param(node(BASE, gpu("GPU-b", 1)), 1, "changed", id="gpu-added"),
        pytest.param(node(), 1, "changed", id="gpu-gone"),
        pytest.param(
            node(faults=(GpuFault(index=0, uuid="GPU-a", reason="lost"),)),
            1,
            "changed",
            id="gpu-fault",
        ),
        pytest.param(node(BASE, driver="999"), 1, "changed", id="driver-version"),
    ],
)
def test_publish_decision(after: NodeReading, at: float, reason: str | None) -> None:
    assert _decide(node(BASE), after, at=at) == reason


def test_publication_numbers_increase_and_state_is_kept_only_when_published() -> None:
    state = snapshot.apply_reading(InventoryState(), node(BASE), now=0, policy=POLICY)
    first = snapshot.next_publication(
        state, node="n1", backend="nvml", observed_at=100.0, now=0, policy=POLICY
    )
    quiet = snapshot.next_publication(
        first.state, node="n1", backend="nvml", observed_at=101.0, now=1, policy=POLICY
    )
    beat = snapshot.next_publication(
        first.state, node="n1", backend="nvml", observed_at=130.0, now=30, policy=POLICY
    )
    assert (first.reason, first.inventory.sequence, first.state.sequence) == ("first", 1, 1)
    assert (quiet.reason, quiet.state) == (None, first.state)
    assert (
        beat.reason,
        beat.inventory.sequence,
        beat.inventory.observed_at,
        beat.state.published_at,
    ) == ("heartbeat", 2, 130.0, 30)


# --- properties ----------------------------------------------------------------------------

DEADBANDS = Deadbands(memory_mib=256, utilization_pct=5, temperature_c=3, power_w=15.0)
PROPERTY_POLICY = Policy(heartbeat_s=30.0, probe_after_s=60.0, deadbands=DEADBANDS)


@st.composite
def noisy_readings(draw: st.DrawFn) -> tuple[NodeReading, list[tuple[float, NodeReading]]]:
    """A first reading, then later readings within the deadbands of it, before the heartbeat."""
    used = draw(st.integers(300, 80000))
    utilization = draw(st.integers(5, 95))
    temperature = draw(st.integers(30, 90))
    power = draw(st.floats(50, 600, allow_nan=False))
    first = node(
        gpu(
            memory_used_mib=used,
            memory_free_mib=81920 - used,
            utilization_pct=utilization,
            temperature_c=temperature,
            power_w=power,
        )
    )
    times = sorted(draw(st.lists(st.floats(0.001, 29.999), min_size=1, max_size=20)))
    later = []
    for now in times:
        moved = used + draw(st.integers(-256, 256))
        later.append(
            (
                now,
                node(
                    gpu(
                        memory_used_mib=moved,
                        memory_free_mib=81920 - moved,
                        utilization_pct=utilization + draw(st.integers(-5, 5)),
                        temperature_c=temperature + draw(st.integers(-3, 3)),
                        power_w=power + draw(st.floats(-15, 15, allow_nan=False)),
                        sm_clock_mhz=draw(st.integers(0, 2000)),
                    )
                ),
            )
        )
    return first, later


@settings(max_examples=150, deadline=None)
@given(noisy_readings())
def test_noise_within_the_deadbands_never_publishes_before_the_heartbeat(
    readings: tuple[NodeReading, list[tuple[float, NodeReading]]],
) -> None:
    first, later = readings
    state = snapshot.apply_reading(InventoryState(), first, now=0, policy=PROPERTY_POLICY)
    publication = snapshot.next_publication(
        state, node="n1", backend="nvml", observed_at=0, now=0, policy=PROPERTY_POLICY
    )
    state = publication.state
    for now, reading in later:
        state = snapshot.apply_reading(state, reading, now=now, policy=PROPERTY_POLICY)
        publication = snapshot.next_publication(
            state, node="n1", backend="nvml", observed_at=now, now=now, policy=PROPERTY_POLICY
        )
        assert publication.reason is None, (now, reading)
        state = publication.state
    beat = snapshot.next_publication(
        state, node="n1", backend="nvml", observed_at=30, now=30, policy=PROPERTY_POLICY
    )
    assert beat.reason == "heartbeat"


@settings(max_examples=100, deadline=None)
@given(
    field=st.sampled_from(["memory_used_mib", "utilization_pct", "temperature_c", "power_w"]),
    beyond=st.integers(1, 50),
    sign=st.sampled_from([-1, 1]),
    now=st.floats(0.001, 29.999),
)
def test_a_change_beyond_a_deadband_publishes_at_once(
    field: str, beyond: int, sign: int, now: float
) -> None:
    base = gpu(memory_used_mib=10_000, utilization_pct=50, temperature_c=60, power_w=300.0)
    band = getattr(DEADBANDS, {"memory_used_mib": "memory_mib"}.get(field, field))
    moved = msgspec.structs.replace(base, **{field: getattr(base, field) + sign * (band + beyond)})
    state = snapshot.apply_reading(InventoryState(), node(base), now=0, policy=PROPERTY_POLICY)
    state = snapshot.next_publication(
        state, node="n1", backend="nvml", observed_at=0, now=0, policy=PROPERTY_POLICY
    ).state
    state = snapshot.apply_reading(state, node(moved), now=now, policy=PROPERTY_POLICY)
    assert (
        snapshot.next_publication(
            state, node="n1", backend="nvml", observed_at=now, now=now, policy=PROPERTY_POLICY
        ).reason
        == "changed"
    )


def test_every_snapshot_names_its_producer_so_readers_order_it_by_sequence() -> None:
    """Readers take one producer's next sequence whatever its time says
    (``shared.validation.take_inventory``)."""
    state = snapshot.apply_reading(InventoryState(), node(gpu()), now=0, policy=POLICY)
    published = []
    for now in (0.0, 30.0, 60.0):
        publication = snapshot.next_publication(
            state,
            node="n1",
            backend="nvml",
            observed_at=1_700_000_000 - now,  # a clock stepped backwards changes nothing
            now=now,
            policy=POLICY,
            producer="host/42/1.0",
        )
        assert publication.reason is not None
        state = publication.state
        published.append(publication.inventory)
    assert {p.producer for p in published} == {"host/42/1.0"}
    assert [p.sequence for p in published] == [1, 2, 3]
    held = None
    for inventory in published:
        verdict = validation.take_inventory(inventory, held, node="n1", now=1_700_000_000)
        assert verdict.take == inventory
        held = verdict.take
    again = validation.take_inventory(published[2], held, node="n1", now=1_700_000_000)
    assert again.take is None  # the same snapshot again (its KV entry and its subject)
