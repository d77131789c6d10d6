"""Fluent builders for placement tests: ``node("n1").cpu(64_000).gpu(model="A100", used=400)``."""

from __future__ import annotations

import msgspec

from services.placer.core.model import (
    ContainerRequest,
    GpuState,
    NodeState,
    PodRequest,
)

GPU_MIB = 16_000


class NodeBuilder:
    def __init__(self, name: str) -> None:
        self._name = name
        self._cpu = 64_000
        self._memory = 262_144
        self._cpu_used = 0
        self._memory_used = 0
        self._gpus: list[GpuState] = []
        self._schedulable = True
        self._groups: frozenset[str] = frozenset()
        self._kinds: tuple[tuple[str, int], ...] = ()

    def cpu(self, total: int, used: int = 0) -> NodeBuilder:
        self._cpu, self._cpu_used = total, used
        return self

    def memory(self, total: int, used: int = 0) -> NodeBuilder:
        self._memory, self._memory_used = total, used
        return self

    def gpu(
        self,
        *,
        model: str = "A100",
        mib: int = GPU_MIB,
        used: int = 0,
        foreign_mib: int = 0,
        cores_used: int | None = None,
        healthy: bool = True,
        exclusive: bool = False,
        utilization: int = 0,
        numa: int = -1,
        nvlink: tuple[int, ...] = (),
        slots: int = 0,
        slots_used: int = 0,
        groups: frozenset[str] = frozenset(),
        holders: tuple[str, ...] = (),
    ) -> NodeBuilder:
        """Add a GPU; ``used`` is GPU milli reserved by Tessera (memory and cores alike)."""
        index = len(self._gpus)
        self._gpus.append(
            GpuState(
                index=index,
                uuid=f"{self._name}-GPU-{index}",
                model=model,
                memory_total_mib=mib,
                memory_reserved_mib=used * mib // 1000,
                memory_foreign_mib=foreign_mib,
                core_milli_reserved=used if cores_used is None else cores_used,
                healthy=healthy,
                exclusive=exclusive,
                utilization_pct=utilization,
                numa_node=numa,
                nvlink_peers=nvlink,
                slots_total=slots,
                slots_reserved=slots_used,
                groups=groups,
                holders=holders,
            )
        )
        return self

    def gpus(self, count: int, **kwargs: object) -> NodeBuilder:
        for _ in range(count):
            self.gpu(**kwargs)  # type: ignore[arg-type]
        return self

    def cordoned(self) -> NodeBuilder:
        self._schedulable = False
        return self

    def groups(self, *names: str) -> NodeBuilder:
        self._groups = frozenset(names)
        return self

    def kinds(self, **counts: int) -> NodeBuilder:
        self._kinds = tuple(sorted((k.replace("_", "-"), n) for k, n in counts.items()))
        return self

    def build(self) -> NodeState:
        return NodeState(
            name=self._name,
            cpu_milli_total=self._cpu,
            memory_mib_total=self._memory,
            cpu_milli_reserved=self._cpu_used,
            memory_mib_reserved=self._memory_used,
            gpus=tuple(self._gpus),
            schedulable=self._schedulable,
            groups=self._groups,
            gpu_task_kinds=self._kinds,
        )


def node(name: str) -> NodeBuilder:
    return NodeBuilder(name)


class PodBuilder:
    def __init__(self, uid: str) -> None:
        self._uid = uid
        self._containers: list[ContainerRequest] = []
        self._fields: dict[str, object] = {}

    def container(
        self,
        name: str = "main",
        *,
        cpu: int = 1_000,
        memory: int = 1_024,
        shares: int = 0,
        mib: int | None = None,
        pct: int | None = None,
        cores: int | None = None,
    ) -> PodBuilder:
        """``cores`` in percent as on the wire (30 = 300 core milli)."""
        self._containers.append(
            ContainerRequest(
                name=name,
                shares=shares,
                share_memory_mib=mib,
                share_memory_pct=pct,
                share_core_milli=None if cores is None else cores * 10,
                cpu_milli=cpu,
                memory_mib=memory,
            )
        )
        return self

    def share(self, milli: int, *, cpu: int = 1_000, memory: int = 1_024) -> PodBuilder:
        """One container with one share of ``milli`` thousandths of a 16,000 MiB GPU."""
        self._containers.append(
            ContainerRequest(
                name=f"c{len(self._containers)}",
                shares=1,
                share_memory_mib=milli * GPU_MIB // 1000,
                share_core_milli=milli,
                cpu_milli=cpu,
                memory_mib=memory,
            )
        )
        return self

    def whole(self, count: int, *, cpu: int = 1_000, memory: int = 1_024) -> PodBuilder:
        return self.container(f"c{len(self._containers)}", cpu=cpu, memory=memory, shares=count)

    def cpu_only(self, cpu: int, memory: int = 1_024) -> PodBuilder:
        return self.container(f"c{len(self._containers)}", cpu=cpu, memory=memory)

    def with_(self, **fields: object) -> PodBuilder:
        self._fields.update(fields)
        return self

    def build(self) -> PodRequest:
        pod = PodRequest(
            uid=self._uid, namespace="ns", name=self._uid, containers=tuple(self._containers)
        )
        return msgspec.structs.replace(pod, **self._fields) if self._fields else pod


def pod(uid: str = "pod-1") -> PodBuilder:
    return PodBuilder(uid)
