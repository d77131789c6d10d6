"""The one set of wire-message builders for tests: a GPU's telemetry, a node's inventory, a slice
of a GPU, a container's slices and an assignment record, each from keyword arguments with plain
defaults.

A test directory keeps its own defaults (its node, its GPU model, its UUIDs, the positional order
its tests call with) in its ``builders.py`` as a ``functools.partial`` of these or an adapter of a
few lines that calls them, never as a copy: what a message holds is decided here.
"""

from __future__ import annotations

from typing import TypedDict, Unpack

from shared.messages.assignments import AssignmentRecord, AssignmentState, ContainerAllocation
from shared.messages.base import ContainerSlices, GpuSlice
from shared.messages.inventory import GpuHealthState, GpuTelemetry, NodeInventory

NOW = 1_700_000_000.0
GPU_RESOURCE = "tessera.dev/gpu"


def uuid_of(index: int) -> str:
    """A realistic 40-character UUID for GPU ``index``: what :func:`gpu` and :func:`share` use
    unless told another."""
    return f"GPU-{index:08x}-1111-2222-3333-444455556666"


def gpu(
    index: int = 0,
    *,
    uuid: str | None = None,
    model: str = "A100",
    memory_mib: int = 16_384,
    used_mib: int = 0,
    utilization: int = 0,
    temperature_c: int = 0,
    power_w: float = 0.0,
    numa: int | None = None,
    health: GpuHealthState = "healthy",
    reason: str = "",
) -> GpuTelemetry:
    """GPU ``index`` (UUID :func:`uuid_of` unless ``uuid``) of ``memory_mib``, ``used_mib`` of it
    in use and the rest free, on NUMA node ``numa``."""
    return GpuTelemetry(
        uuid=uuid_of(index) if uuid is None else uuid,
        index=index,
        model=model,
        memory_total_mib=memory_mib,
        memory_used_mib=used_mib,
        memory_free_mib=memory_mib - used_mib,
        utilization_pct=utilization,
        temperature_c=temperature_c,
        power_w=power_w,
        numa_node=numa,
        health=health,
        health_reason=reason,
    )


class InventoryFields(TypedDict, total=False):
    """What else an inventory may say (``NodeInventory``'s defaults otherwise)."""

    sequence: int
    producer: str
    backend: str
    driver_version: str


def inventory(
    *gpus: GpuTelemetry, node: str, at: float = NOW, **fields: Unpack[InventoryFields]
) -> NodeInventory:
    """``node``'s inventory of ``gpus``, observed ``at``."""
    return NodeInventory(node=node, gpus=gpus, observed_at=at, **fields)


def share(
    index: int = 0, *, uuid: str | None = None, memory_mib: int = 4096, cores: int = 30
) -> GpuSlice:
    """A slice of GPU ``index`` (UUID :func:`uuid_of` unless ``uuid``): MiB and percent of SMs."""
    return GpuSlice(
        uuid=uuid_of(index) if uuid is None else uuid,
        index=index,
        memory_mib=memory_mib,
        cores=cores,
    )


def container(
    name: str = "main",
    *shares: GpuSlice,
    devices: int | None = None,
    resource: str = GPU_RESOURCE,
) -> ContainerSlices:
    """Container ``name`` holding ``shares``; it asks the kubelet for ``devices`` (default: one
    per share) of ``resource``, or for nothing when that is 0."""
    count = len(shares) if devices is None else devices
    return ContainerSlices(
        container=name, gpus=shares, resources={resource: count} if count else {}
    )


class RecordFields(TypedDict, total=False):
    """What else a record may say (``AssignmentRecord``'s defaults otherwise)."""

    bound_at: float | None
    allocated: tuple[ContainerAllocation, ...]
    allocated_at: float | None
    released_at: float | None


def record(
    uid: str,
    *containers: ContainerSlices,
    node: str,
    commit: str | None = None,
    name: str = "",
    namespace: str = "ml",
    state: AssignmentState = "reserved",
    decided_at: float = NOW,
    placer_id: str = "placer-0",
    **fields: Unpack[RecordFields],
) -> AssignmentRecord:
    """Pod ``uid``'s record on ``node`` of commit ``commit`` (default ``commit-<uid>``:
    ``tests.harness.commits`` writes that commit's claim and booking), for pod ``name`` (default
    ``pod-<uid>``)."""
    return AssignmentRecord(
        pod_uid=uid,
        namespace=namespace,
        name=name or f"pod-{uid}",
        node=node,
        containers=containers,
        state=state,
        decided_at=decided_at,
        placer_id=placer_id,
        commit=f"commit-{uid}" if commit is None else commit,
        **fields,
    )
