"""Builders for the seed 001 / 002 tests: nodes, GPUs, pods and a tenancy-aware cluster."""

from __future__ import annotations

from collections.abc import Sequence

from services.placer.core.framework import Profile
from services.placer.core.groups import TenancyConfig
from services.placer.core.index import ClusterIndex
from services.placer.core.model import ContainerRequest, GpuState, NodeState, PodRequest
from services.placer.core.profiles import build_profile
from services.placer.core.tenancy import Tenancy


def node(
    name: str,
    *,
    gpus: int = 4,
    model: str = "A100",
    gpu_mib: int = 40_960,
    cpu_milli: int = 64_000,
    memory_mib: int = 256_000,
    schedulable: bool = True,
) -> NodeState:
    return NodeState(
        name=name,
        cpu_milli_total=cpu_milli,
        memory_mib_total=memory_mib,
        schedulable=schedulable,
        gpus=tuple(
            GpuState(index=i, uuid=f"{name}-gpu{i}", model=model, memory_total_mib=gpu_mib)
            for i in range(gpus)
        ),
    )


def pod(
    uid: str,
    *,
    tenant: str = "research",
    label: str = "",
    shares: int = 1,
    mib: int | None = None,
    pct: int | None = None,
    cores: int | None = None,
    group: str | None = None,
    models: tuple[str, ...] = (),
    gpu_type: str | None = None,
    cpu_milli: int = 1_000,
    memory_mib: int = 1_024,
    priority: int = 0,
) -> PodRequest:
    """A one-container pod in namespace ``tenant`` (its tenant unless the tenancy maps the
    namespace), labelled ``tessera.dev/tenant: label`` when given. ``mib``/``pct``/``cores`` per
    share; none of them = whole GPUs."""
    return PodRequest(
        uid=uid,
        namespace=tenant,
        name=uid,
        tenant=tenant,
        tenant_label=label,
        group=group,
        gpu_models=models,
        gpu_type=gpu_type,  # type: ignore[arg-type]
        priority=priority,
        containers=(
            ContainerRequest(
                name="main",
                shares=shares,
                share_memory_mib=mib,
                share_memory_pct=pct,
                share_core_milli=None if cores is None else cores * 10,
                cpu_milli=cpu_milli,
                memory_mib=memory_mib,
            ),
        ),
    )


def tenant_cluster(
    nodes: Sequence[NodeState],
    config: TenancyConfig,
    *,
    profile: str = "binpack",
    labels: dict[str, dict[str, str]] | None = None,
) -> tuple[ClusterIndex, Tenancy, Profile]:
    """A cluster marked with ``config``, its tenancy, and a profile carrying its plugins."""
    cluster = ClusterIndex(nodes)
    tenancy = Tenancy()
    tenancy.configure(config, cluster, node_labels=labels)
    return cluster, tenancy, build_profile(profile, **tenancy.plugins())
