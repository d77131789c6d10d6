"""The pods ``tessera up`` submits: a built-in mix, a file of manifests, or a trace sample.

- built-in (default): whole GPUs, multi-GPU, shared slices (memory MiB or percentage, SM
  share), multi-container pods, each GPU policy (binpack, spread, colocate), model include and
  exclude, CPU-only pods (kept off idle GPU nodes) and one pod no GPU can hold (it stays Pending
  with its reasons: the explained-Pending path), dealt in a fixed order and repeated to
  ``count`` pods.
- ``--workload FILE``: manifests, YAML (several documents) or JSON (an object, a list, or a
  ``v1/List``): pods (``schedulerName`` defaults to ``tessera``), and the ResourceClaims and
  ResourceClaimTemplates they name (created first, :func:`in_create_order`).
- DRA (``tessera up --dra``, ``dramix.builtin_dra``): the built-in mix asking through claims, one
  ResourceClaimTemplate of class ``gpu.tessera.dev`` per shape.
- ``--trace FILE``: ``count`` tasks sampled (seeded) from an Alibaba ``openb_pod_list_*.csv``:
  CPU and memory as given, whole GPUs as ``tessera.dev/gpu``, a GPU share as one
  ``tessera.dev/gpu`` with that percentage of the GPU's memory and SMs. The trace's GPU model
  constraints are dropped (the default trace has none). Unless ``--nodes`` or ``--gpus`` say
  otherwise, the nodes are sampled too (:func:`trace_nodes`): from the trace's own node list
  (``openb_node_list_gpu_node.csv`` beside it), as many as it takes for their GPUs to hold the
  sample's GPU demand, so that the sample arrives at 100 % of the cluster's GPU capacity, the
  point at which the FGD methodology compares policies.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from services.placer.sim.trace import TraceError, TraceTask, load_nodes, load_tasks
from shared import annotations as names
from tessera.up.spec import GpuGroup, NodePlan

Obj = dict[str, Any]
SCHEDULER: Final = "tessera"
IMAGE: Final = "registry.k8s.io/pause:3.10"
NAMESPACE: Final = "default"


class WorkloadError(ValueError):
    """A workload that cannot be submitted; the message names the file and the problem."""


def container(
    name: str = "main",
    *,
    gpu: int | None = None,
    memory_mib: int | None = None,
    memory_pct: int | None = None,
    cores: int | None = None,
    cpu: str = "500m",
    memory: str = "1Gi",
) -> Obj:
    limits: dict[str, str] = {}
    if gpu is not None:
        limits[names.GPU] = str(gpu)
    if memory_mib is not None:
        limits[names.GPU_MEMORY] = str(memory_mib)
    if memory_pct is not None:
        limits[names.GPU_MEMORY_PERCENTAGE] = str(memory_pct)
    if cores is not None:
        limits[names.GPU_CORES] = str(cores)
    resources: Obj = {"requests": {"cpu": cpu, "memory": memory}}
    if limits:
        resources["limits"] = limits
    return {"name": name, "image": IMAGE, "resources": resources}


def pod(
    name: str,
    containers: list[Obj],
    *,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    namespace: str = NAMESPACE,
    priority: int | None = None,
) -> Obj:
    spec: Obj = {"schedulerName": SCHEDULER, "containers": containers}
    if priority is not None:
        spec["priority"] = priority
    meta: Obj = {"name": name, "namespace": namespace, "labels": {"app": name.rsplit("-", 1)[0]}}
    if labels:
        meta["labels"].update(labels)
    if annotations:
        meta["annotations"] = dict(annotations)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def _mix_entry(kind: str, n: int) -> Obj:
    name = f"{kind}-{n}"
    if kind == "train":
        return pod(name, [container(gpu=1, cpu="4", memory="16Gi")])
    if kind == "train-2gpu":
        return pod(name, [container(gpu=2, cpu="8", memory="32Gi")])
    if kind == "infer":
        return pod(name, [container(gpu=1, memory_mib=8192, cores=25)])
    if kind == "notebook":
        return pod(
            name,
            [container(gpu=1, memory_pct=20, cores=20)],
            annotations={"tessera.dev/gpu-policy": "binpack"},
        )
    if kind == "spread":
        return pod(
            name,
            [container(gpu=1, memory_mib=4096, cores=10)],
            annotations={"tessera.dev/gpu-policy": "spread"},
        )
    if kind == "pipeline":
        return pod(
            name,
            [
                container("reader", gpu=1, memory_mib=2048, cores=10),
                container("model", gpu=1, memory_mib=6144, cores=30),
                container("sidecar", cpu="100m", memory="128Mi"),
            ],
            annotations={"tessera.dev/gpu-policy": "colocate"},
        )
    if kind == "shard":
        return pod(name, [container(gpu=2, memory_mib=10240, cores=30)])
    if kind == "t4":
        return pod(
            name,
            [container(gpu=1, memory_mib=4096, cores=20)],
            annotations={"tessera.dev/gpu-model": "T4"},
        )
    if kind == "not-a100":
        return pod(
            name,
            [container(gpu=1, memory_mib=4096, cores=20)],
            annotations={"tessera.dev/gpu-model-exclude": "A100"},
        )
    if kind == "cpu":  # seed 002's balanced score keeps it off GPU nodes
        return pod(
            name,
            [container(cpu="2", memory="4Gi")],
            annotations={"tessera.dev/node-policy": "balanced"},
        )
    if kind == "too-big":
        return pod(name, [container(gpu=1, memory_mib=1_000_000, cores=10)])
    raise ValueError(kind)


MIX: Final = (
    "train",
    "infer",
    "notebook",
    "pipeline",
    "infer",
    "spread",
    "train-2gpu",
    "t4",
    "shard",
    "not-a100",
    "cpu",
    "infer",
    "notebook",
)


def dealt(count: int, entry: Callable[[str, int], Obj]) -> list[Obj]:
    """``count`` pods of the mix, each made by ``entry(kind, n)`` (the ``n``-th of its kind),
    the last one no GPU can hold."""
    pods = []
    seen: dict[str, int] = {}
    for i in range(max(0, count - 1)):
        kind = MIX[i % len(MIX)]
        seen[kind] = seen.get(kind, 0) + 1
        pods.append(entry(kind, seen[kind]))
    pods.append(entry("too-big", 1))
    return pods


def builtin(count: int = 40) -> list[Obj]:
    """``count`` pods of the built-in mix, plus one pod no GPU can hold."""
    return dealt(count, _mix_entry)


KINDS: Final = ("ResourceClaimTemplate", "ResourceClaim", "Pod")
"""What ``--workload`` takes, in the order they are created: a pod's claims before the pod."""


def in_create_order(objects: list[Obj]) -> list[Obj]:
    """``objects`` with templates first, then claims, then pods (each kind in file order)."""
    return sorted(objects, key=lambda obj: KINDS.index(obj.get("kind", "Pod")))


def from_file(path: Path) -> list[Obj]:
    """Pods, ResourceClaims and ResourceClaimTemplates from a YAML or JSON file, in file order."""
    try:
        text = path.read_text()
    except OSError as error:
        raise WorkloadError(f"{path}: {error.strerror or error}") from None
    documents: list[Any]
    if path.suffix == ".json":
        try:
            documents = [json.loads(text)]
        except ValueError as error:
            raise WorkloadError(f"{path}: not JSON: {error}") from None
    else:
        import yaml

        try:
            documents = list(yaml.safe_load_all(text))
        except yaml.YAMLError as error:
            raise WorkloadError(f"{path}: not YAML: {error}") from None
    objects: list[Obj] = []
    for document in documents:
        if document is None:
            continue
        items = document if isinstance(document, list) else [document]
        for item in items:
            if isinstance(item, dict) and item.get("kind") == "List":
                items.extend(item.get("items") or [])
                continue
            if not isinstance(item, dict) or item.get("kind", "Pod") not in KINDS:
                kind = item.get("kind") if isinstance(item, dict) else type(item).__name__
                raise WorkloadError(
                    f"{path}: only {', '.join(KINDS)} can be submitted, found {kind}"
                )
            if item.get("kind", "Pod") == "Pod":
                item.setdefault("spec", {}).setdefault("schedulerName", SCHEDULER)
            objects.append(item)
    if not any(obj.get("kind", "Pod") == "Pod" for obj in objects):
        raise WorkloadError(f"{path}: no pod manifests")
    return objects


TRACE_NODES: Final = "openb_node_list_gpu_node.csv"
TRACE_GPU_MEMORY_GB: Final[dict[str, int]] = {
    "T4": 16,
    "P100": 16,
    "V100M16": 16,
    "V100M32": 32,
    "A10": 24,
}
"""GPU memory of the trace's models; the trace gives none, and G2 / G3 are undisclosed (32 GB
assumed: a trace pod asks for a percentage of its GPU, so the figure does not change the fit)."""


def trace_sample(path: Path, count: int, seed: int = 42) -> list[TraceTask]:
    """``count`` tasks of an Alibaba pod CSV, sampled with ``seed``."""
    try:
        tasks = load_tasks(path)
    except TraceError as error:
        raise WorkloadError(str(error)) from None
    return random.Random(seed).sample(tasks, min(count, len(tasks)))


def trace_nodes(path: Path, sample: list[TraceTask], seed: int = 42) -> list[NodePlan]:
    """Nodes drawn (with ``seed``) from the node list beside the pod CSV ``path`` until their GPUs
    hold the GPU demand of ``sample``: the sample then arrives at 100 % of GPU capacity."""
    listing = path.parent / TRACE_NODES
    try:
        nodes = load_nodes(listing)
    except TraceError as error:
        raise WorkloadError(f"{error} (or give the nodes with --nodes / --gpus)") from None
    demand = sum(t.total_gpu_milli for t in sample)
    drawn = random.Random(seed * 7_919 + 1).sample(nodes, len(nodes))
    plans: list[NodePlan] = []
    capacity = 0
    for node in drawn:
        if plans and capacity >= demand:
            break
        capacity += 1000 * node.gpus
        memory_gb = TRACE_GPU_MEMORY_GB.get(node.model, 32)
        plans.append(
            NodePlan(
                name=node.name.lower(),
                gpus=(
                    GpuGroup(
                        count=node.gpus,
                        model=f"{node.model or 'GPU'}-{memory_gb}GB",
                        memory_mib=memory_gb * 1024,
                    ),
                ),
                cpu=f"{node.cpu_milli}m",
                memory=f"{node.memory_mib}Mi",
            )
        )
    return sorted(plans, key=lambda p: p.name)


def trace_pods(sample: list[TraceTask]) -> list[Obj]:
    """Trace tasks as pods (module docstring)."""
    pods = []
    for task in sample:
        cpu = f"{max(task.cpu_milli, 1)}m"
        memory = f"{max(task.memory_mib, 1)}Mi"
        name = "trace-" + "".join(ch if ch.isalnum() else "-" for ch in task.name.lower())
        if task.gpu_count == 0:
            spec = container(cpu=cpu, memory=memory)
        elif task.gpu_milli >= 1000:
            spec = container(gpu=task.gpu_count, cpu=cpu, memory=memory)
        else:
            share = max(1, math.ceil(task.gpu_milli / 10))
            spec = container(gpu=1, memory_pct=share, cores=share, cpu=cpu, memory=memory)
        pods.append(pod(name.strip("-")[:63], [spec]))
    return pods
