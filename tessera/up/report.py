"""Pure: the summary of a ``tessera up`` run, from the pods and what the simulated kubelets saw.

Everything here is counted independently of the placer's books:

- **mismatched containers**: a Running pod's container whose recorded environment (what the
  device plugin answered the kubelet's Allocate) does not name exactly the GPUs, MiB and SM
  shares of that container in the pod's ``tessera.dev/assignment`` (``NVIDIA_VISIBLE_DEVICES``,
  ``TESSERA_GPU_MEMORY_LIMIT_MIB``, ``TESSERA_GPU_CORES``, and the isolation variables when
  present); a container with no decided slice must have no GPU at all; a pod asking for Tessera
  devices without an assignment counts each such container. A container that lists DRA claims
  is held to its claims' ``status.allocation`` instead (``drareport``).
- **over-committed GPUs**: GPUs on which the running containers' recorded slices ever held more
  memory than the GPU has, or more than 100 % of its SMs (from the kubelets' observations at
  every allocation, plus the final state), against the real capacities of the fake GPUs; a DRA
  claim several containers or pods share is held once.

Latency per stage, per pod: created (when ``tessera up`` created it, else ``creationTimestamp``)
-> decided (``decided_at`` of the assignment) -> bound (``tessera.dev/bind-time``) -> allocated
(the kubelet's last Allocate answer) -> Running (the kubelet's status write).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from shared import annotations as names
from tessera.up import drareport

ASSIGNMENT: Final = names.ASSIGNMENT
BIND_TIME: Final = names.BIND_TIME
STAGES: Final = (
    "created_to_decided",
    "decided_to_bound",
    "bound_to_allocated",
    "allocated_to_running",
    "created_to_running",
)


@dataclass(frozen=True)
class Slice:
    uuid: str
    memory_mib: int
    cores: int


@dataclass(frozen=True)
class ContainerSeen:
    """One container's environment as the simulated kubelet recorded it."""

    container: str
    envs: Mapping[str, str]
    resource: str = ""
    """What gave it: a device plugin's resource, or ``resourceclaims/<claim>`` (DRA)."""


@dataclass(frozen=True)
class PodSeen:
    """What a simulated kubelet recorded for a pod."""

    uid: str
    node: str
    containers: tuple[ContainerSeen, ...]
    allocated_at: float | None
    running_at: float | None
    failed_reason: str = ""
    failed_message: str = ""


@dataclass(frozen=True)
class GpuSeen:
    """A GPU as it really is (the fake GPU description)."""

    uuid: str
    node: str
    memory_mib: int
    index: int = -1


@dataclass(frozen=True)
class Observed:
    """An over-commit a kubelet observed at an allocation."""

    node: str
    gpu: str
    memory_mib: int
    cores: int


@dataclass
class Summary:
    pods: int = 0
    pods_by_phase: dict[str, int] = field(default_factory=dict)
    running_with_gpu: int = 0
    pending: list[dict[str, str]] = field(default_factory=list)
    failed: list[dict[str, str]] = field(default_factory=list)
    gpu_share_allocated: dict[str, float] = field(default_factory=dict)
    latency_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    mismatched_containers: int = 0
    mismatches: list[str] = field(default_factory=list)
    overcommitted_gpus: int = 0
    overcommits: list[str] = field(default_factory=list)
    claims: dict[str, int] = field(default_factory=dict)
    """Tessera's ResourceClaims (``drareport.claim_counts``); empty without any."""
    settled: bool = False
    wall_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "pods": self.pods,
            "pods_by_phase": self.pods_by_phase,
            "settled": self.settled,
            "mismatched_containers": self.mismatched_containers,
            "overcommitted_gpus": self.overcommitted_gpus,
            "gpu_share_allocated": self.gpu_share_allocated,
            "latency_ms": self.latency_ms,
            "pending": self.pending,
            "failed": self.failed,
            "mismatches": self.mismatches[:50],
            "overcommits": self.overcommits[:50],
            "claims": self.claims,
            "wall_s": round(self.wall_s, 2),
        }


def parse_time(text: str) -> float | None:
    """An RFC 3339 UTC time (seconds or microseconds) as epoch seconds."""
    for pattern in ("%Y-%m-%dT%H:%M:%S.%f%z", "%Y-%m-%dT%H:%M:%S%z"):
        try:
            return datetime.strptime(text.replace("Z", "+0000"), pattern).timestamp()
        except (ValueError, AttributeError):
            continue
    return None


def decided_slices(pod: Mapping[str, Any]) -> tuple[dict[str, list[Slice]], float | None] | None:
    """Container -> decided slices and the decision time, from ``tessera.dev/assignment``."""
    text = ((pod.get("metadata") or {}).get("annotations") or {}).get(ASSIGNMENT)
    if not text:
        return None
    try:
        value = json.loads(text)
        slices = {
            c["container"]: [
                Slice(str(g["uuid"]), int(g["memory_mib"]), int(g["cores"])) for g in c["gpus"]
            ]
            for c in value["containers"]
        }
        decided = value.get("decided_at")
        return slices, float(decided) if decided is not None else None
    except (ValueError, KeyError, TypeError):
        return None


def _joined(values: Iterable[object]) -> str:
    return ",".join(str(v) for v in values)


def container_problem(envs: Mapping[str, str], slices: Sequence[Slice]) -> str:
    """Why ``envs`` does not give exactly ``slices`` ("" when it does)."""
    if not slices:
        visible = envs.get("NVIDIA_VISIBLE_DEVICES", "")
        return f"no GPU decided, but it was given {visible}" if visible else ""
    expected = {
        "NVIDIA_VISIBLE_DEVICES": _joined(s.uuid for s in slices),
        "TESSERA_GPU_MEMORY_LIMIT_MIB": _joined(s.memory_mib for s in slices),
        "TESSERA_GPU_CORES": _joined(s.cores for s in slices),
    }
    if "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" in envs:
        expected["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = _joined(
            f"{s.uuid}={s.memory_mib}M" for s in slices
        )
        expected["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(min(s.cores for s in slices))
    if "CUDA_DEVICE_SM_LIMIT" in envs:
        for position, gpu_slice in enumerate(slices):
            expected[f"CUDA_DEVICE_MEMORY_LIMIT_{position}"] = f"{gpu_slice.memory_mib}m"
        expected["CUDA_DEVICE_SM_LIMIT"] = str(min(s.cores for s in slices))
    wrong = [
        f"{key}={envs.get(key, '<unset>')!s} (decided {value})"
        for key, value in expected.items()
        if envs.get(key) != value
    ]
    return "; ".join(wrong)


def _tessera_devices(container: Mapping[str, Any]) -> bool:
    limits = (container.get("resources") or {}).get("limits") or {}
    return any(k in (names.GPU, names.GPU_MEMORY) for k in limits)


def mismatches(
    pod: Mapping[str, Any],
    seen: PodSeen | None,
    *,
    claims: Mapping[str, Mapping[str, Any]] | None = None,
    uuids: Mapping[tuple[str, int], str] | None = None,
) -> list[str]:
    """Every container of a Running pod whose environment is not its decided slices: for a
    container that lists claims, the slices of their allocations (``drareport``)."""
    meta = pod.get("metadata") or {}
    name = f"{meta.get('namespace')}/{meta.get('name')}"
    containers = (pod.get("spec") or {}).get("containers") or []
    decided = decided_slices(pod)
    envs: dict[str, dict[str, str]] = {}
    for container in seen.containers if seen else ():
        envs.setdefault(container.container, {}).update(container.envs)
    problems = []
    for container in containers:
        cname = container.get("name", "")
        if drareport.uses_claims(container):
            expected = drareport.container_slices(pod, container, claims or {}, uuids or {})
            problem = (
                expected
                if isinstance(expected, str)
                else container_problem(envs.get(cname, {}), [Slice(*s) for s in expected])
            )
            if problem:
                problems.append(f"{name} container {cname}: {problem}")
            continue
        if decided is None:
            if _tessera_devices(container) or envs.get(cname):
                problems.append(f"{name} container {cname}: Running without an assignment")
            continue
        problem = container_problem(envs.get(cname, {}), decided[0].get(cname, []))
        if problem:
            problems.append(f"{name} container {cname}: {problem}")
    return problems


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100) of ``values`` (non-empty)."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def latency_table(samples: Mapping[str, Sequence[float]]) -> dict[str, dict[str, float]]:
    table = {}
    for stage in STAGES:
        values = samples.get(stage) or []
        if values:
            table[stage] = {
                "n": len(values),
                "p50": round(percentile(values, 50) * 1000, 1),
                "p99": round(percentile(values, 99) * 1000, 1),
                "max": round(max(values) * 1000, 1),
            }
    return table


def _pending_reason(pod: Mapping[str, Any]) -> str:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return str(condition.get("message") or condition.get("reason") or "")
    return ""


def summarize(
    pods: Sequence[Mapping[str, Any]],
    seen: Mapping[str, PodSeen],
    *,
    created_at: Mapping[str, float],
    gpus: Sequence[GpuSeen],
    observed: Sequence[Observed],
    claims: Sequence[Mapping[str, Any]] = (),
) -> Summary:
    """The summary of a run (see the module docstring); ``claims``: the API's ResourceClaims."""
    summary = Summary(pods=len(pods))
    by_name = {
        f"{(c.get('metadata') or {}).get('namespace')}/{(c.get('metadata') or {}).get('name')}": c
        for c in claims
    }
    uuids = {(g.node, g.index): g.uuid for g in gpus}
    counted_claims: set[str] = set()
    if any(drareport.is_tessera(c) for c in claims):
        summary.claims = drareport.claim_counts(claims)
    phases: Counter[str] = Counter()
    samples: dict[str, list[float]] = {stage: [] for stage in STAGES}
    capacity = {g.uuid: g for g in gpus}
    held: dict[str, list[int]] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        status = pod.get("status") or {}
        phase = status.get("phase", "Pending")
        phases[phase] += 1
        uid = meta.get("uid", "")
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        record = seen.get(uid)
        if phase == "Pending":
            summary.pending.append(
                {
                    "pod": key,
                    "node": (pod.get("spec") or {}).get("nodeName") or "",
                    "reason": _pending_reason(pod),
                }
            )
        elif phase == "Failed":
            summary.failed.append(
                {
                    "pod": key,
                    "reason": status.get("reason", ""),
                    "message": status.get("message", ""),
                }
            )
        if phase != "Running":
            continue
        summary.mismatches.extend(mismatches(pod, record, claims=by_name, uuids=uuids))
        decided = decided_slices(pod)
        if decided is not None and any(decided[0].values()):
            summary.running_with_gpu += 1
        for container in record.containers if record else ():
            # A claim shared by several containers or pods is one allocation: held once.
            shared = drareport.claim_key(meta.get("namespace", ""), container.resource)
            if shared is not None:
                if shared in counted_claims:
                    continue
                counted_claims.add(shared)
            visible = [u for u in container.envs.get("NVIDIA_VISIBLE_DEVICES", "").split(",") if u]
            memory = container.envs.get("TESSERA_GPU_MEMORY_LIMIT_MIB", "").split(",")
            cores = container.envs.get("TESSERA_GPU_CORES", "").split(",")
            for position, uuid in enumerate(visible):
                entry = held.setdefault(uuid, [0, 0])
                with_default = (memory + ["0"] * len(visible))[position] or "0"
                entry[0] += int(with_default)
                entry[1] += int((cores + ["0"] * len(visible))[position] or "0")
        created = created_at.get(uid) or parse_time(meta.get("creationTimestamp", "")) or None
        decided_at = decided[1] if decided else None
        bound_at = parse_time((meta.get("annotations") or {}).get(BIND_TIME, ""))
        allocated_at = record.allocated_at if record else None
        running_at = record.running_at if record else None
        for stage, start, end in (
            ("created_to_decided", created, decided_at),
            ("decided_to_bound", decided_at, bound_at),
            ("bound_to_allocated", bound_at, allocated_at),
            ("allocated_to_running", allocated_at, running_at),
            ("created_to_running", created, running_at),
        ):
            if start is not None and end is not None:
                samples[stage].append(max(0.0, end - start))
    summary.pods_by_phase = dict(sorted(phases.items()))
    summary.mismatched_containers = len(summary.mismatches)
    summary.latency_ms = latency_table(samples)
    over: dict[str, str] = {}
    for event in observed:
        over.setdefault(
            event.gpu,
            f"{event.node} GPU {event.gpu}: {event.memory_mib} MiB, {event.cores} % of SMs held "
            "(seen at an allocation)",
        )
    for uuid, (mib, pct) in held.items():
        gpu = capacity.get(uuid)
        if gpu is None or mib > gpu.memory_mib or pct > 100:
            total = gpu.memory_mib if gpu else 0
            over.setdefault(uuid, f"GPU {uuid}: {mib} of {total} MiB, {pct} % of SMs held")
    summary.overcommits = sorted(over.values())
    summary.overcommitted_gpus = len(over)
    total_mib = sum(g.memory_mib for g in gpus)
    summary.gpu_share_allocated = {
        "gpus": len(gpus),
        "gpus_in_use": sum(1 for u in held if u in capacity),
        "memory_pct": round(100 * sum(m for m, _ in held.values()) / total_mib, 1)
        if total_mib
        else 0.0,
        "cores_pct": round(sum(c for _, c in held.values()) / len(gpus), 1) if gpus else 0.0,
    }
    return summary
