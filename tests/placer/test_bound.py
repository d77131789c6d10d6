"""The offline placement bound (``sim/bound.py``) against brute force on small instances.

A brute-force search tries every placement of every task (left out, or on each node and each
distinct GPU state); the exact MILP must find its optimum, and the LP bound may never be below
it (the bound on the unallocated share never above the best placement's). Where the relaxation
gives nothing away, the LP equals the optimum; where it splits a task, it says so.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.placer.sim.bound import (
    exact_max_allocated,
    max_allocated,
    node_types,
    task_classes,
    unallocated_bound,
)
from services.placer.sim.replay import replay
from services.placer.sim.trace import TraceNode, TraceTask
from services.placer.sim.workload import node_order, typical_tasks

pytest.importorskip("scipy")

GIB = 1024


def node(
    name: str, gpus: int = 1, cpu: int = 8_000, memory: int = 64 * GIB, model: str = "A"
) -> TraceNode:
    return TraceNode(name=name, cpu_milli=cpu, memory_mib=memory, gpus=gpus, model=model)


def task(
    milli: int = 1000,
    gpus: int = 1,
    cpu: int = 1_000,
    memory: int = GIB,
    models: tuple[str, ...] = (),
    name: str = "t",
) -> TraceTask:
    return TraceTask(
        name=name,
        cpu_milli=cpu,
        memory_mib=memory,
        gpu_count=gpus,
        gpu_milli=milli if gpus else 0,
        models=models,
    )


def brute_force(nodes: Sequence[TraceNode], tasks: Sequence[TraceTask]) -> int:
    """The most GPU milli any placement allocates, by trying every placement."""
    cpu = [n.cpu_milli for n in nodes]
    memory = [n.memory_mib for n in nodes]
    free = [[1000] * n.gpus for n in nodes]

    def best(i: int) -> int:
        if i == len(tasks):
            return 0
        t = tasks[i]
        found = best(i + 1)  # left out
        for j, n in enumerate(nodes):
            if cpu[j] < t.cpu_milli or memory[j] < t.memory_mib:
                continue
            if t.models and n.model not in t.models:
                continue
            if t.gpu_count == 0:
                options: list[list[int]] = [[]]
            elif t.gpu_count == 1 and t.gpu_milli < 1000:
                seen = set()
                options = []
                for g, f in enumerate(free[j]):
                    if f >= t.gpu_milli and f not in seen:
                        seen.add(f)
                        options.append([g])
            else:
                whole = [g for g, f in enumerate(free[j]) if f == 1000]
                options = [whole[: t.gpu_count]] if len(whole) >= t.gpu_count else []
            for gpus in options:
                take = 1000 if t.gpu_count > 1 or t.gpu_milli == 1000 else t.gpu_milli
                cpu[j] -= t.cpu_milli
                memory[j] -= t.memory_mib
                for g in gpus:
                    free[j][g] -= take
                found = max(found, t.total_gpu_milli + best(i + 1))
                for g in gpus:
                    free[j][g] += take
                cpu[j] += t.cpu_milli
                memory[j] += t.memory_mib
        return found

    return best(0)


CASES = [
    # (what, nodes, tasks, optimum, LP bound)
    ("two 0.6 shares on one GPU: one fits", [node("a")], [task(600), task(600)], 600, 600),
    (
        "a 0.19 hole filled exactly",
        [node("a")],
        [task(810), task(190), task(50)],
        1000,
        1000,
    ),
    (
        "0.81 shares leave holes a 0.3 cannot fill; the LP packs a third of a GPU with 0.3s",
        [node("a", gpus=2)],
        [task(810), task(810), task(300)],
        1620,
        1650,
    ),
    (
        "a 2-GPU task fits no 1-GPU node, even with two of them",
        [node("a"), node("b")],
        [task(gpus=2)],
        0,
        0,
    ),
    ("a model no node has", [node("a", model="A")], [task(models=("B",))], 0, 0),
    (
        "everything fits",
        [node("a", gpus=2), node("b", gpus=2, model="B")],
        [task(700), task(300), task(gpus=2, models=("B",)), task(gpus=0, cpu=4_000)],
        3000,
        3000,
    ),
    (
        "CPU for one of two whole GPUs: the LP splits the second task",
        [node("a", gpus=2, cpu=8_000)],
        [task(cpu=6_000), task(cpu=6_000)],
        1000,
        pytest.approx(1000 * 8 / 6),
    ),
    (
        "memory strands a GPU",
        [node("a", gpus=2, memory=10 * GIB)],
        [task(memory=6 * GIB), task(memory=6 * GIB)],
        1000,
        pytest.approx(1000 * 10 / 6),
    ),
]


@pytest.mark.parametrize(
    ("nodes", "tasks", "optimum", "lp"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bound_and_exact_solve_on_hand_checked_instances(
    nodes: list[TraceNode], tasks: list[TraceTask], optimum: int, lp: float
) -> None:
    assert brute_force(nodes, tasks) == optimum
    exact = exact_max_allocated(nodes, tasks)
    assert exact.optimal
    assert exact.allocated == pytest.approx(optimum, abs=1e-6)
    bound = max_allocated(nodes, tasks)
    assert bound.optimal
    assert bound.allocated == lp
    assert bound.allocated >= optimum - 1e-6


small_nodes = st.lists(
    st.builds(
        node,
        name=st.just("n"),
        gpus=st.integers(1, 3),
        cpu=st.sampled_from([4_000, 8_000, 16_000]),
        memory=st.sampled_from([16 * GIB, 32 * GIB]),
        model=st.sampled_from(["A", "B"]),
    ),
    min_size=1,
    max_size=2,
)
small_tasks = st.lists(
    st.one_of(
        st.builds(
            task,
            milli=st.sampled_from([150, 200, 300, 450, 500, 700, 850, 1000]),
            gpus=st.just(1),
            cpu=st.sampled_from([1_000, 2_000, 4_000, 6_000]),
            memory=st.sampled_from([4 * GIB, 8 * GIB, 12 * GIB]),
            models=st.sampled_from([(), ("A",), ("B",)]),
        ),
        st.builds(
            task,
            gpus=st.integers(0, 3),
            cpu=st.sampled_from([1_000, 4_000, 8_000]),
            memory=st.sampled_from([4 * GIB, 16 * GIB]),
            models=st.sampled_from([(), ("A",)]),
        ),
    ),
    min_size=1,
    max_size=5,
)


@settings(max_examples=60, deadline=None)
@given(nodes=small_nodes, tasks=small_tasks)
def test_the_bound_is_never_below_the_best_placement(
    nodes: list[TraceNode], tasks: list[TraceTask]
) -> None:
    nodes = [
        TraceNode(f"n{i}", n.cpu_milli, n.memory_mib, n.gpus, n.model) for i, n in enumerate(nodes)
    ]
    optimum = brute_force(nodes, tasks)
    exact = exact_max_allocated(nodes, tasks)
    assert exact.optimal
    assert exact.allocated == pytest.approx(optimum, abs=1e-6)
    assert max_allocated(nodes, tasks).allocated >= optimum - 1e-6


def test_identical_nodes_and_tasks_are_pooled() -> None:
    nodes = [node(f"n{i}", gpus=2) for i in range(50)] + [node("m", gpus=8, cpu=96_000)]
    tasks = [task(460, name=f"s{i}") for i in range(300)] + [task(gpus=8, cpu=88_000)]
    assert len(node_types(nodes)) == 2
    assert len(task_classes(tasks)) == 2
    bound = max_allocated(nodes, tasks)
    # 108 GPUs: the 8-GPU task on the big node, two 0.46 shares per GPU on the 100 others.
    assert bound.allocated == pytest.approx(8_000 + 200 * 460)
    assert (bound.node_types, bound.task_classes) == (2, 2)


@pytest.mark.parametrize("policy", ["bestfit", "fgd", "tessera", "random"])
def test_no_replay_beats_the_bound_at_100_percent(policy: str) -> None:
    nodes = [
        node(f"n{i}", gpus=g, cpu=c)
        for i, (g, c) in enumerate([(2, 16_000), (4, 24_000), (1, 8_000)] * 3)
    ]
    sizes = [810, 460, 1000, 300, 650, 220, 1000, 500]
    tasks = [
        task(sizes[i % len(sizes)], cpu=2_000 + 500 * (i % 5), name=f"t{i}") for i in range(40)
    ]
    tasks += [task(gpus=2, cpu=6_000, name=f"w{i}") for i in range(4)]
    bound = unallocated_bound(nodes, tasks, checkpoints=3)
    assert bound is not None
    assert bound.events >= 1
    assert len(bound.solves) == min(3, bound.events)
    result = replay(
        nodes, tasks, policy, order=node_order(nodes, seed=1), typical=typical_tasks(tasks), seed=1
    )
    value = result.curves.alloc_at(100)
    assert value is not None
    assert 100 - value >= bound.unallocated_pct - 1e-9
    assert bound.unallocated_pct > 0  # the 0.81 and 0.65 shares leave holes nothing fills


def test_no_bound_when_the_workload_never_reaches_the_bucket() -> None:
    assert unallocated_bound([node("a", gpus=4)], [task(500)]) is None
