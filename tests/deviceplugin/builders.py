"""Builders for device plugin tests: ``tests.harness.wire`` with this directory's defaults (its
node, an A100 on NUMA node 0, inventories of sequence 1, records bound by default)."""

from __future__ import annotations

import functools

from shared.messages.assignments import AssignmentRecord, AssignmentState, ContainerAllocation
from shared.messages.base import ContainerSlices
from tests.harness import wire

NODE = "gpu-node-1.example.com"
GPU_RESOURCE = wire.GPU_RESOURCE
MEMORY_RESOURCE = "tessera.dev/gpu-memory"


uuid = wire.uuid_of
"""A realistic 40-character GPU UUID for GPU ``index``."""

gpu = functools.partial(wire.gpu, model="NVIDIA A100-SXM4-80GB", numa=0)
inventory = functools.partial(wire.inventory, node=NODE, sequence=1)
share = wire.share
container = wire.container


def record(
    uid: str,
    *containers: ContainerSlices,
    state: AssignmentState = "bound",
    bound_at: float = 1_700_000_100.0,
    node: str = NODE,
    allocated: tuple[ContainerAllocation, ...] = (),
    commit: str | None = None,
) -> AssignmentRecord:
    """A record decided a second before ``bound_at`` (bound then unless ``reserved``), of commit
    ``commit`` (default ``commit-<uid>``; ``tests.harness.commits`` writes that commit's claim and
    booking)."""
    return wire.record(
        uid,
        *containers,
        node=node,
        state=state,
        decided_at=bound_at - 1.0,
        bound_at=bound_at if state != "reserved" else None,
        allocated=allocated,
        commit=commit,
    )
