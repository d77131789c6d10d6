"""Builders for device plugin tests: GPUs, inventories and assignment records in one line each."""

from __future__ import annotations

from shared.messages.assignments import AssignmentRecord, AssignmentState, ContainerAllocation
from shared.messages.base import ContainerSlices, GpuSlice
from shared.messages.inventory import GpuHealthState, GpuTelemetry, NodeInventory

NODE = "gpu-node-1.example.com"
GPU_RESOURCE = "tessera.dev/gpu"
MEMORY_RESOURCE = "tessera.dev/gpu-memory"


def uuid(index: int) -> str:
    """A realistic 40-character GPU UUID for GPU ``index``."""
    return f"GPU-{index:08x}-1111-2222-3333-444455556666"


def gpu(
    index: int,
    *,
    memory_mib: int = 16_384,
    health: GpuHealthState = "healthy",
    numa: int | None = 0,
    reason: str = "",
) -> GpuTelemetry:
    return GpuTelemetry(
        uuid=uuid(index),
        index=index,
        model="NVIDIA A100-SXM4-80GB",
        memory_total_mib=memory_mib,
        memory_used_mib=0,
        memory_free_mib=memory_mib,
        numa_node=numa,
        health=health,
        health_reason=reason,
    )


def inventory(*gpus: GpuTelemetry, node: str = NODE, at: float = 1_700_000_000.0) -> NodeInventory:
    return NodeInventory(node=node, gpus=tuple(gpus), observed_at=at, sequence=1)


def share(index: int, *, memory_mib: int = 4096, cores: int = 30) -> GpuSlice:
    return GpuSlice(uuid=uuid(index), index=index, memory_mib=memory_mib, cores=cores)


def container(
    name: str, *shares: GpuSlice, devices: int | None = None, resource: str = GPU_RESOURCE
) -> ContainerSlices:
    """A container holding ``shares``; it asks the kubelet for ``devices`` (default: one per
    share) of ``resource``, or for nothing when it has no shares."""
    count = len(shares) if devices is None else devices
    return ContainerSlices(
        container=name, gpus=tuple(shares), resources={resource: count} if count else {}
    )


def record(
    uid: str,
    *containers: ContainerSlices,
    state: AssignmentState = "bound",
    bound_at: float = 1_700_000_100.0,
    node: str = NODE,
    allocated: tuple[ContainerAllocation, ...] = (),
    commit: str | None = None,
) -> AssignmentRecord:
    """A record of commit ``commit`` (default ``commit-<uid>``; ``tests.harness.commits`` writes
    that commit's claim and booking)."""
    return AssignmentRecord(
        pod_uid=uid,
        namespace="ml",
        name=f"pod-{uid}",
        node=node,
        containers=containers,
        state=state,
        decided_at=bound_at - 1.0,
        placer_id="placer-0",
        bound_at=bound_at if state != "reserved" else None,
        allocated=allocated,
        commit=f"commit-{uid}" if commit is None else commit,
    )
