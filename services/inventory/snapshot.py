"""The inventory's pure core: readings and health events in, the published inventory out.

No I/O and no clock here: the shell (``services.inventory.service``) passes ``now`` (monotonic
seconds, for intervals) and ``observed_at`` (wall seconds, for the wire) into every call, and
carries out what comes back. Three decisions live in this module:

* **Health.** A critical XID or a double-bit ECC event marks a GPU ``unhealthy`` with the reason;
  application XIDs (:data:`APPLICATION_XIDS`, faults of the program on the GPU, not of the GPU)
  change nothing. An unhealthy GPU is probed again at ``probe_at`` (``probe_after_s`` after the
  last bad sign): if it answers normally in the first read at or after that time it is
  ``healthy`` again; if it still fails, the next probe is ``probe_after_s`` later. Readings
  between probes do not change its health, so one good answer right after an XID does not hide
  it. A GPU the backend no longer reports is ``gone`` and stays published as such, with its last
  known telemetry, until it comes back (then it starts healthy, like a new GPU).
* **The snapshot**: one :class:`NodeInventory` with every GPU ever seen by this process, sorted by
  index then uuid.
* **When to publish**: at once when something changed beyond the deadbands (or anything discrete
  changed: the set of GPUs, health, topology, MIG mode, the set of processes), otherwise when the
  heartbeat interval has passed since the last publication. Numbers are compared with the last
  *published* snapshot, not the last reading, so a slow drift still crosses the deadband.
"""

from __future__ import annotations

from typing import Final, Literal

import msgspec

from services.inventory.reader import GpuReading, HealthEvent, NodeReading
from shared.messages.inventory import GpuHealthState, GpuTelemetry, NodeInventory

APPLICATION_XIDS: Final = frozenset({13, 31, 43, 45, 68, 109})
"""XIDs caused by the application on the GPU (illegal address, MMU fault, reset channel...):
the GPU itself is fine, so they never mark it unhealthy (the same list as NVIDIA's plugin)."""

XID_MEANINGS: Final[dict[int, str]] = {
    48: "double-bit ECC error",
    63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapping failed",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}
"""Readable words for common critical XIDs, used only to make the health reason clearer."""

GONE_REASON: Final = "no longer reported by the GPU backend"

PublishReason = Literal["first", "changed", "heartbeat"]


class Deadbands(msgspec.Struct, frozen=True, kw_only=True):
    """Changes up to these sizes are noise: they wait for the heartbeat instead of publishing."""

    memory_mib: int = 256
    utilization_pct: int = 5
    temperature_c: int = 3
    power_w: float = 15.0


class Policy(msgspec.Struct, frozen=True, kw_only=True):
    """The core's tunables (from the service settings)."""

    heartbeat_s: float = 30.0
    probe_after_s: float = 60.0
    deadbands: Deadbands = Deadbands()


class GpuRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What the core remembers about one GPU."""

    uuid: str
    index: int
    last: GpuReading | None = None
    """The last normal reading; None for a GPU that has never answered normally."""
    health: GpuHealthState = "healthy"
    reason: str = ""
    probe_at: float | None = None
    """For an unhealthy GPU: the monotonic time from which a normal reading makes it healthy."""


class InventoryState(msgspec.Struct, frozen=True, kw_only=True):
    """Everything the core carries from one call to the next."""

    gpus: dict[str, GpuRecord] = {}
    driver_version: str = ""
    published: NodeInventory | None = None
    published_at: float | None = None
    sequence: int = 0
    """Sequence number of the last publication (0 before the first)."""


class Publication(msgspec.Struct, frozen=True, kw_only=True):
    """The result of :func:`next_publication`."""

    inventory: NodeInventory
    """The inventory as of now (also what the shell shows in its metrics)."""
    reason: PublishReason | None
    """Why to publish ``inventory`` now; None when it should wait."""
    state: InventoryState
    """The state to keep once ``inventory`` has been published (the input state when nothing is
    due)."""


# --- health --------------------------------------------------------------------------------


def critical_reason(event: HealthEvent) -> str | None:
    """Why ``event`` makes its GPU unhealthy, or None when it does not (an application XID)."""
    if event.kind == "ecc_double_bit":
        return "double-bit ECC error"
    if event.code in APPLICATION_XIDS:
        return None
    meaning = XID_MEANINGS.get(event.code)
    return f"XID {event.code}: {meaning}" if meaning else f"XID {event.code}"


def apply_event(
    state: InventoryState, event: HealthEvent, *, now: float, policy: Policy
) -> InventoryState:
    """Mark the event's GPU unhealthy when the event is critical; otherwise change nothing.

    Events for GPUs the core has not seen, or that are gone, change nothing either: there is no
    GPU to mark (the shell counts them all the same).
    """
    reason = critical_reason(event)
    record = state.gpus.get(event.uuid)
    if reason is None or record is None or record.health == "gone":
        return state
    marked = msgspec.structs.replace(
        record, health="unhealthy", reason=reason, probe_at=now + policy.probe_after_s
    )
    return msgspec.structs.replace(state, gpus={**state.gpus, event.uuid: marked})


def _after_normal_answer(previous: GpuRecord | None, gpu: GpuReading, now: float) -> GpuRecord:
    fresh = GpuRecord(uuid=gpu.uuid, index=gpu.index, last=gpu)
    if previous is None or previous.health != "unhealthy":
        return fresh  # new, healthy, or back after being gone
    if previous.probe_at is not None and now >= previous.probe_at:
        return fresh  # the probe succeeded: recovered
    return msgspec.structs.replace(previous, index=gpu.index, last=gpu)


def _after_fault(
    previous: GpuRecord | None, uuid: str, index: int, reason: str, now: float, policy: Policy
) -> GpuRecord:
    if previous is not None and previous.health == "unhealthy" and previous.probe_at is not None:
        probe_at = previous.probe_at
        if now >= probe_at:  # the probe failed: try again one period later
            probe_at = now + policy.probe_after_s
        return msgspec.structs.replace(previous, index=index, probe_at=probe_at)
    return GpuRecord(
        uuid=uuid,
        index=index,
        last=previous.last if previous is not None else None,
        health="unhealthy",
        reason=reason,
        probe_at=now + policy.probe_after_s,
    )


def apply_reading(
    state: InventoryState, reading: NodeReading, *, now: float, policy: Policy
) -> InventoryState:
    """Fold one read of the node into the state: telemetry, probes, faults and vanished GPUs."""
    gpus: dict[str, GpuRecord] = {}
    for gpu in reading.gpus:
        gpus[gpu.uuid] = _after_normal_answer(state.gpus.get(gpu.uuid), gpu, now)

    # A GPU that cannot say its uuid is matched to the live GPU that last had its index.
    uuid_at_index = {
        record.index: uuid for uuid, record in state.gpus.items() if record.health != "gone"
    }
    for fault in reading.faults:
        uuid = fault.uuid or uuid_at_index.get(fault.index) or unknown_uuid(fault.index)
        gpus[uuid] = _after_fault(
            state.gpus.get(uuid), uuid, fault.index, fault.reason, now, policy
        )

    for uuid, record in state.gpus.items():
        if uuid in gpus:
            continue
        if record.health == "gone":
            gpus[uuid] = record
        else:
            gpus[uuid] = msgspec.structs.replace(
                record, health="gone", reason=GONE_REASON, probe_at=None
            )
    return msgspec.structs.replace(state, gpus=gpus, driver_version=reading.driver_version)


def unknown_uuid(index: int) -> str:
    """Placeholder uuid for a GPU at ``index`` that failed before it ever told its uuid."""
    return f"GPU-unknown-index-{index}"


# --- snapshot ------------------------------------------------------------------------------


def _telemetry(record: GpuRecord) -> GpuTelemetry:
    last = record.last
    if last is None:
        return GpuTelemetry(
            uuid=record.uuid,
            index=record.index,
            model="unknown",
            memory_total_mib=0,
            memory_used_mib=0,
            memory_free_mib=0,
            health=record.health,
            health_reason=record.reason,
        )
    return GpuTelemetry(
        uuid=record.uuid,
        index=record.index,
        model=last.model,
        memory_total_mib=last.memory_total_mib,
        memory_used_mib=last.memory_used_mib,
        memory_free_mib=last.memory_free_mib,
        utilization_pct=last.utilization_pct,
        temperature_c=last.temperature_c,
        power_w=last.power_w,
        sm_clock_mhz=last.sm_clock_mhz,
        sm_clock_max_mhz=last.sm_clock_max_mhz,
        pci_bus_id=last.pci_bus_id,
        numa_node=last.numa_node,
        nvlink_peers=tuple(link.peer_uuid for link in last.links if link.nvlinks > 0),
        links=last.links,
        mig_enabled=last.mig_enabled,
        processes=last.processes,
        health=record.health,
        health_reason=record.reason,
    )


def build_inventory(
    state: InventoryState,
    *,
    node: str,
    backend: str,
    observed_at: float,
    sequence: int,
    producer: str = "",
) -> NodeInventory:
    """The inventory message for the current state, signed with this process's ``producer``."""
    records = sorted(state.gpus.values(), key=lambda record: (record.index, record.uuid))
    return NodeInventory(
        node=node,
        gpus=tuple(_telemetry(record) for record in records),
        observed_at=observed_at,
        sequence=sequence,
        producer=producer,
        backend=backend,
        driver_version=state.driver_version,
    )


# --- publish decision ----------------------------------------------------------------------


def _process_memory(gpu: GpuTelemetry) -> dict[int, int]:
    return {process.pid: process.used_memory_mib for process in gpu.processes}


def gpu_changed(before: GpuTelemetry, after: GpuTelemetry, deadbands: Deadbands) -> bool:
    """True when ``after`` differs from ``before`` by more than noise."""
    discrete = (
        "index",
        "model",
        "memory_total_mib",
        "sm_clock_max_mhz",
        "pci_bus_id",
        "numa_node",
        "nvlink_peers",
        "links",
        "mig_enabled",
        "health",
        "health_reason",
    )
    if any(getattr(before, name) != getattr(after, name) for name in discrete):
        return True
    before_processes, after_processes = _process_memory(before), _process_memory(after)
    if before_processes.keys() != after_processes.keys():
        return True
    if any(
        abs(after_processes[pid] - used) > deadbands.memory_mib
        for pid, used in before_processes.items()
    ):
        return True
    return (
        abs(after.memory_used_mib - before.memory_used_mib) > deadbands.memory_mib
        or abs(after.utilization_pct - before.utilization_pct) > deadbands.utilization_pct
        or abs(after.temperature_c - before.temperature_c) > deadbands.temperature_c
        # Watts are floats (milliwatts / 1000): a difference equal to the band must not count
        # as beyond it through rounding.
        or abs(after.power_w - before.power_w) - deadbands.power_w > 1e-9
    )


def inventory_changed(before: NodeInventory, after: NodeInventory, deadbands: Deadbands) -> bool:
    """True when the node's GPUs differ by more than noise (time and sequence do not count)."""
    if before.driver_version != after.driver_version or before.backend != after.backend:
        return True
    before_gpus = {gpu.uuid: gpu for gpu in before.gpus}
    after_gpus = {gpu.uuid: gpu for gpu in after.gpus}
    if before_gpus.keys() != after_gpus.keys():
        return True
    return any(gpu_changed(gpu, after_gpus[uuid], deadbands) for uuid, gpu in before_gpus.items())


def publish_reason(
    previous: NodeInventory | None,
    published_at: float | None,
    candidate: NodeInventory,
    *,
    now: float,
    policy: Policy,
) -> PublishReason | None:
    """Why ``candidate`` should be published now, or None when it should wait."""
    if previous is None or published_at is None:
        return "first"
    if inventory_changed(previous, candidate, policy.deadbands):
        return "changed"
    if now - published_at >= policy.heartbeat_s:
        return "heartbeat"
    return None


def next_publication(
    state: InventoryState,
    *,
    node: str,
    backend: str,
    observed_at: float,
    now: float,
    policy: Policy,
    producer: str = "",
) -> Publication:
    """Decide whether to publish; when so, the inventory to send and the state to keep after.

    The shell keeps ``Publication.state`` only once the inventory was actually sent, so a failed
    send is simply decided again at the next poll.
    """
    candidate = build_inventory(
        state,
        node=node,
        backend=backend,
        observed_at=observed_at,
        sequence=state.sequence + 1,
        producer=producer,
    )
    reason = publish_reason(state.published, state.published_at, candidate, now=now, policy=policy)
    if reason is None:
        return Publication(inventory=candidate, reason=None, state=state)
    after = msgspec.structs.replace(
        state, published=candidate, published_at=now, sequence=candidate.sequence
    )
    return Publication(inventory=candidate, reason=reason, state=after)
