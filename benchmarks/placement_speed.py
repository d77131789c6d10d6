"""Placement speed: decisions per second per policy, a full FGD replay, peak memory, and what
Kubernetes' scheduling constraints cost.

Prints figures; asserts nothing. Each section runs in its own child process so that its peak
resident memory (``ru_maxrss``) is its own.

    .venv/bin/python benchmarks/placement_speed.py                 # everything
    .venv/bin/python benchmarks/placement_speed.py --only synthetic --nodes 10000 --decisions 20000
    .venv/bin/python benchmarks/placement_speed.py --only constraints --constraint-nodes 1000

The ``constraints`` section places :data:`SPEED_MIX` on ``--constraint-nodes`` labelled nodes
(``kubernetes.io/hostname``, a zone of three) with the ``--constraint-policy`` profile, every pod
carrying the same constraint: none (what a pod the node-aware rules leave alone costs; compare
with the same run on unlabelled nodes, ``unlabelled``), none with three tainted nodes in the
cluster (ranked by shape, those nodes avoided), a ``nodeSelector`` on one zone, and a topology
spread constraint (``maxSkew`` 1, ``DoNotSchedule``) over the hostname and over the zone, which
count the pods already placed node by node.
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import resource
import sys
import time
from pathlib import Path

import msgspec

from services.placer.core.cycle import decide
from services.placer.core.index import ClusterIndex
from services.placer.core.model import Decision, NodeState
from services.placer.core.profiles import build_profile
from services.placer.sim.replay import node_state, pod_request
from services.placer.sim.trace import TraceNode, TraceTask, load_nodes, load_tasks
from services.placer.sim.workload import cluster_gpu_milli, node_order, tuned_tasks, typical_tasks
from shared.messages.constraints import Constraints, LabelSelector, SpreadConstraint, Taint

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "alibaba-gpu-v2023" / "csv"
TRACE_POLICIES = ("random", "dotprod", "clustering", "packing", "bestfit", "fgd", "tessera")


# The synthetic section's task mix (what ``tessera simulate`` built in before its workload was
# drawn from the trace): kept here so the figures stay comparable with the earlier runs.
SPEED_MIX = (
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


def speed_mix(count: int) -> list[TraceTask]:
    """``count`` tasks of :data:`SPEED_MIX` (a tenth of the small shares ask for T4 GPUs, which
    the A100 cluster rejects: a decision too)."""
    rng = random.Random(2023)
    weights = [k[0] for k in SPEED_MIX]
    tasks = []
    for i in range(count):
        _, cpu, memory, gpus, milli = rng.choices(SPEED_MIX, weights=weights)[0]
        models: tuple[str, ...] = (
            ("T4",) if gpus == 1 and milli < 500 and rng.random() < 0.1 else ()
        )
        tasks.append(TraceTask(f"syn-pod-{i:05d}", cpu, memory, gpus, milli, models))
    return tasks


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def trace_cluster(policy: str, seed: int) -> str:
    """One replay of the default trace: decisions/s over decide() alone and the whole wall time."""
    started = time.perf_counter()
    nodes = load_nodes(DATA / "openb_node_list_gpu_node.csv")
    original = load_tasks(DATA / "openb_pod_list_default.csv")
    typical = typical_tasks(original)
    tasks = tuned_tasks(original, cluster_gpu_milli(nodes), seed=seed)
    from services.placer.sim.replay import replay

    result = replay(
        nodes,
        tasks,
        policy,
        order=node_order(nodes, seed=seed),
        typical=typical,
        seed=seed,
    )
    wall = time.perf_counter() - started
    return (
        f"trace  {policy:<11} nodes={len(nodes):>6} tasks={result.tasks:>6} "
        f"decide/s={result.decisions_per_s:>8.0f} replay_wall_s={wall:6.1f} "
        f"peak_rss_mib={_peak_mib():6.0f}"
    )


def synthetic_cluster(policy: str, nodes: int, decisions: int) -> str:
    """``nodes`` x 8 GPUs, identical hardware, :data:`SPEED_MIX`: decide() + reserve()."""
    states = [
        node_state(
            TraceNode(
                name=f"n{i:05d}", cpu_milli=128_000, memory_mib=1_048_576, gpus=8, model="A100"
            )
        )
        for i in range(nodes)
    ]
    build_start = time.perf_counter()
    cluster = ClusterIndex(states)
    build_s = time.perf_counter() - build_start
    mix = speed_mix(2_000)
    profile = build_profile(policy, typical_tasks=typical_tasks(mix))
    rng = random.Random(5)
    placed = failed = 0
    started = time.perf_counter()
    for i in range(decisions):
        task = mix[i % len(mix)]
        outcome = decide(pod_request(task, f"p{i}"), cluster, profile, now=float(i), rng=rng)
        if isinstance(outcome, Decision):
            cluster.reserve(outcome.reservation)
            placed += 1
        else:
            failed += 1
    elapsed = time.perf_counter() - started
    return (
        f"synth  {policy:<11} nodes={nodes:>6} gpus={8 * nodes:>6} decisions={decisions:>6} "
        f"placed={placed:>6} decide+reserve/s={decisions / elapsed:>8.0f} "
        f"index_build_s={build_s:5.2f} shapes={len(cluster.groups):>5} "
        f"peak_rss_mib={_peak_mib():6.0f}"
    )


HOSTNAME = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"
APP = {"app": "web"}


def _spread(key: str) -> Constraints:
    return Constraints(
        spread=(
            SpreadConstraint(
                max_skew=1,
                topology_key=key,
                when_unsatisfiable="DoNotSchedule",
                selector=LabelSelector(match_labels=tuple(APP.items())),
            ),
        )
    )


CONSTRAINTS: dict[str, Constraints | None] = {
    "unlabelled": None,
    "none": None,
    "tainted": None,
    "selector": Constraints(node_selector=((ZONE, "zone-1"),)),
    "spread-host": _spread(HOSTNAME),
    "spread-zone": _spread(ZONE),
}


def constrained_cluster(case: str, policy: str, nodes: int, decisions: int) -> str:
    """:data:`SPEED_MIX` on ``nodes`` labelled nodes, every pod with ``case``'s constraint."""
    states: list[NodeState] = []
    for i in range(nodes):
        name = f"n{i:05d}"
        state = node_state(
            TraceNode(name=name, cpu_milli=128_000, memory_mib=1_048_576, gpus=8, model="A100")
        )
        if case != "unlabelled":
            tainted = case == "tainted" and i < 3
            state = msgspec.structs.replace(
                state,
                labels={HOSTNAME: name, ZONE: f"zone-{i % 3}"},
                taints=(Taint(key="node-role.kubernetes.io/control-plane", effect="NoSchedule"),)
                if tainted
                else (),
            )
        states.append(state)
    cluster = ClusterIndex(states)
    mix = speed_mix(2_000)
    profile = build_profile(policy, typical_tasks=typical_tasks(mix))
    constraints = CONSTRAINTS[case]
    rng = random.Random(5)
    placed = 0
    started = time.perf_counter()
    for i in range(decisions):
        request = pod_request(mix[i % len(mix)], f"p{i}")
        request = msgspec.structs.replace(
            request, namespace="bench", labels=tuple(APP.items()), constraints=constraints
        )
        outcome = decide(request, cluster, profile, now=float(i), rng=rng)
        if isinstance(outcome, Decision):
            cluster.reserve(outcome.reservation)
            placed += 1
    elapsed = time.perf_counter() - started
    return (
        f"constr {case:<11} {policy:<8} nodes={nodes:>6} decisions={decisions:>6} "
        f"placed={placed:>6} decide+reserve/s={decisions / elapsed:>8.0f} "
        f"us/decision={elapsed / decisions * 1e6:>7.0f} peak_rss_mib={_peak_mib():6.0f}"
    )


def _child(kind: str, args: tuple[object, ...], queue: multiprocessing.Queue[str]) -> None:
    if kind == "trace":
        queue.put(trace_cluster(*args))  # type: ignore[arg-type]
    elif kind == "constraints":
        queue.put(constrained_cluster(*args))  # type: ignore[arg-type]
    else:
        queue.put(synthetic_cluster(*args))  # type: ignore[arg-type]


def run_isolated(kind: str, *args: object) -> str:
    context = multiprocessing.get_context("spawn")
    queue: multiprocessing.Queue[str] = context.Queue()
    child = context.Process(target=_child, args=(kind, args, queue))
    child.start()
    line = queue.get()
    child.join()
    return line


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument(
        "--only", choices=("trace", "synthetic", "constraints"), help="run one section"
    )
    parser.add_argument("--policies", default=",".join(TRACE_POLICIES))
    parser.add_argument("--synthetic-policies", default="binpack,spread,fgd,tessera")
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--decisions", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--constraint-nodes", type=int, default=1_000)
    parser.add_argument("--constraint-decisions", type=int, default=3_000)
    parser.add_argument("--constraint-policy", default="tessera")
    parser.add_argument("--constraint-cases", default=",".join(CONSTRAINTS))
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}; cores {multiprocessing.cpu_count()}", flush=True)
    if args.only in (None, "trace"):
        for policy in args.policies.split(","):
            print(run_isolated("trace", policy, args.seed), flush=True)
    if args.only in (None, "synthetic"):
        for policy in args.synthetic_policies.split(","):
            print(run_isolated("synthetic", policy, args.nodes, args.decisions), flush=True)
    if args.only in (None, "constraints"):
        for case in args.constraint_cases.split(","):
            print(
                run_isolated(
                    "constraints",
                    case,
                    args.constraint_policy,
                    args.constraint_nodes,
                    args.constraint_decisions,
                ),
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
