"""A built-in cluster and workload, so ``tessera simulate`` runs on a fresh machine in seconds.

The shape follows the Alibaba trace in miniature: 8-GPU, 4-GPU and 2-GPU nodes of three models,
and a task mix of CPU-only tasks, GPU shares of several sizes, whole GPUs and a few multi-GPU
tasks. It is generated from a fixed seed, so it is the same everywhere.
"""

from __future__ import annotations

import random

from services.placer.sim.trace import TraceNode, TraceTask

_NODE_KINDS = (
    # count, cpu milli, memory MiB, GPUs, model
    (40, 96_000, 786_432, 8, "A100"),
    (40, 64_000, 393_216, 4, "T4"),
    (40, 64_000, 262_144, 2, "V100"),
)

_TASK_KINDS = (
    # weight, cpu milli, memory MiB, GPUs, milli per GPU
    (14, 8_000, 30_000, 0, 0),
    (10, 4_000, 15_000, 1, 250),
    (12, 6_000, 12_000, 1, 460),
    (6, 8_000, 24_000, 1, 650),
    (12, 8_000, 24_000, 1, 810),
    (40, 12_000, 24_000, 1, 1000),
    (3, 24_000, 98_000, 2, 1000),
    (2, 48_000, 196_000, 4, 1000),
    (1, 88_000, 327_680, 8, 1000),
)


def synthetic_nodes() -> list[TraceNode]:
    nodes: list[TraceNode] = []
    for count, cpu, memory, gpus, model in _NODE_KINDS:
        for _ in range(count):
            nodes.append(
                TraceNode(
                    name=f"syn-node-{len(nodes):04d}",
                    cpu_milli=cpu,
                    memory_mib=memory,
                    gpus=gpus,
                    model=model,
                )
            )
    return nodes


def synthetic_tasks(count: int = 800) -> list[TraceTask]:
    rng = random.Random(2023)
    weights = [k[0] for k in _TASK_KINDS]
    tasks = []
    for i in range(count):
        _, cpu, memory, gpus, milli = rng.choices(_TASK_KINDS, weights=weights)[0]
        models: tuple[str, ...] = (
            ("T4",) if gpus == 1 and milli < 500 and rng.random() < 0.1 else ()
        )
        tasks.append(
            TraceTask(
                name=f"syn-pod-{i:05d}",
                cpu_milli=cpu,
                memory_mib=memory,
                gpu_count=gpus,
                gpu_milli=milli,
                models=models,
            )
        )
    return tasks
