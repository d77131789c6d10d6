"""How far from the best possible: the offline placement bound per trace, beside FGD and tessera.

For each trace and seed, ``sim/bound.py``'s LP gives a lower bound on the unallocated GPU share at
100 % arrived that no placement, online or offline, can beat. Beside it, FGD with the trace's mix
known in advance (the published method) and the tessera profile with the mix learned online (what
a cluster gets), replayed on the same task lists, and the share of FGD's gap to the bound that
tessera closes: ``(FGD - tessera) / (FGD - bound)``. Asserts nothing.

``--sample F``: how tight the bound is. A stratified sample of the nodes (a fraction F of each
node type, rounded) and the seed's tasks sampled with the same fraction, up to the first task at
which their arrived GPU demand reaches the sample's capacity; on that instance the LP bound and
the exact optimum (``exact_max_allocated``, a MILP per node, ``--sample-time-limit`` seconds;
when it stops early the optimum lies between the best placement found and the solver's bound),
and what the ``--policies`` leave unallocated once they have placed the sample's tasks in order.

Traces are ``openb_pod_list_NAME.csv`` in ``../shared/data``; ``multigpu30``, ``multigpu40`` and
``multigpu50`` (not stored) are built from the default trace as the FGD artifact built them
(``workload.with_multi_gpu_share``). Solve times are wall clock on whatever machine runs it.

    .venv/bin/python benchmarks/placement_bound.py --traces default --seeds 42-51
    .venv/bin/python benchmarks/placement_bound.py --traces all --seeds 47-56 --jobs 2
    .venv/bin/python benchmarks/placement_bound.py --traces default --seeds 42 --policies "" \\
        --sample 0.02 --sample-time-limit 300
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from services.placer.core.fragmentation import TypicalTask
from services.placer.sim import report
from services.placer.sim.bound import exact_max_allocated, max_allocated, unallocated_bound
from services.placer.sim.command import Job, parse_seeds, run_jobs
from services.placer.sim.replay import Mix, replay
from services.placer.sim.trace import TraceNode, TraceTask, load_nodes
from services.placer.sim.workload import (
    cluster_gpu_milli,
    named_trace,
    node_order,
    tuned_tasks,
    typical_tasks,
)

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "alibaba-gpu-v2023" / "csv"
TRACES = ("default", "cpu050", "gpushare40", "gpuspec10", "multigpu20")
VARIANTS = ("multigpu30", "multigpu40", "multigpu50")


def sample_instance(
    nodes: Sequence[TraceNode], tasks: Sequence[TraceTask], fraction: float, seed: int
) -> tuple[list[TraceNode], list[TraceTask]]:
    """A fraction of each node type, and the tasks sampled alike up to 100 % of its capacity."""
    rng = random.Random(seed * 31 + 7)
    by_type: dict[tuple[int, int, int, str], list[TraceNode]] = {}
    for node in nodes:
        by_type.setdefault((node.cpu_milli, node.memory_mib, node.gpus, node.model), []).append(
            node
        )
    sample: list[TraceNode] = []
    for key in sorted(by_type):
        group = by_type[key]
        sample += rng.sample(group, round(fraction * len(group)))
    capacity = cluster_gpu_milli(sample)
    chosen: list[TraceTask] = []
    arrived = 0
    for task in tasks:
        if rng.random() >= fraction:
            continue
        chosen.append(task)
        arrived += task.total_gpu_milli
        if arrived >= capacity:
            break
    return sample, chosen


def tightness(
    nodes: Sequence[TraceNode],
    tasks: Sequence[TraceTask],
    fraction: float,
    seed: int,
    time_limit: float,
    pairs: Sequence[tuple[str, Mix]],
    typical: Sequence[TypicalTask],
) -> dict[str, Any]:
    sample, chosen = sample_instance(nodes, tasks, fraction, seed)
    capacity = cluster_gpu_milli(sample)
    lp = max_allocated(sample, chosen)
    exact = exact_max_allocated(sample, chosen, time_limit=time_limit)
    online = {}
    for policy, mix in pairs:  # what each policy has allocated once the sample's last task came
        result = replay(
            sample,
            chosen,
            policy,
            order=node_order(sample, seed=seed),
            typical=typical,
            seed=seed,
            mix=mix,
        )
        allocated = sum(t.gpu_milli for t in result.tenants.values())
        online[f"{policy}:{mix}"] = round(100 - 100 * allocated / capacity, 4)
    return {
        "nodes": len(sample),
        "gpus": capacity // 1000,
        "tasks": len(chosen),
        "lp_unallocated_pct": round(100 - 100 * lp.allocated / capacity, 4),
        "optimum_unallocated_pct_at_least": round(100 - 100 * exact.allocated / capacity, 4),
        "optimum_unallocated_pct_at_most": round(100 - 100 * exact.found / capacity, 4),
        "optimal": exact.optimal,
        "lp_s": round(lp.seconds, 2),
        "exact_s": round(exact.seconds, 1),
        "exact_variables": exact.variables,
        "policies_unallocated_pct": online,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument(
        "--traces",
        default="all",
        help="comma-separated, or 'all' (the five stored + multigpu30-50)",
    )
    parser.add_argument("--seeds", type=parse_seeds, default=parse_seeds("42-51"))
    parser.add_argument(
        "--policies",
        default="fgd:trace,tessera:online",
        help="POLICY:MIX pairs replayed beside the bound ('' for the bound alone)",
    )
    parser.add_argument("--checkpoints", type=int, default=8, help="LPs per seed (8)")
    parser.add_argument("--jobs", type=int, default=1, help="replays in parallel processes (1)")
    parser.add_argument("--sample", type=float, default=0.0, help="exact solve on this fraction")
    parser.add_argument("--sample-time-limit", type=float, default=300.0)
    parser.add_argument("--json", type=Path, help="also write everything here")
    args = parser.parse_args()
    traces = [*TRACES, *VARIANTS] if args.traces == "all" else args.traces.split(",")
    pairs: list[tuple[str, Mix]] = []
    for pair in filter(None, args.policies.split(",")):
        policy, _, mix = pair.partition(":")
        if mix not in ("trace", "online"):
            parser.error(f"{pair!r}: write POLICY:trace or POLICY:online")
        pairs.append((policy, "online" if mix == "online" else "trace"))
    nodes = tuple(load_nodes(DATA / "openb_node_list_gpu_node.csv"))
    capacity = cluster_gpu_milli(nodes)
    everything: dict[str, Any] = {}
    rows = []
    for trace in traces:
        original = tuple(named_trace(DATA, trace))
        bounds: list[float] = []
        seconds: list[float] = []
        samples = []
        for seed in args.seeds:
            tasks = tuned_tasks(original, capacity, seed=seed)
            found = unallocated_bound(nodes, tasks, checkpoints=args.checkpoints)
            if found is None:
                raise SystemExit(f"{trace} seed {seed}: never reaches 100 % arrived")
            bounds.append(found.unallocated_pct)
            seconds.append(found.seconds)
            if args.sample > 0:
                samples.append(
                    tightness(
                        nodes,
                        tasks,
                        args.sample,
                        seed,
                        args.sample_time_limit,
                        pairs,
                        typical_tasks(original),
                    )
                    | {"seed": seed}
                )
        entry: dict[str, Any] = {
            "bound": report.stat(bounds) | {"per_seed": [round(b, 4) for b in bounds]},
            "bound_solve_s_per_seed": round(statistics.fmean(seconds), 2),
            "checkpoints": args.checkpoints,
            "samples": samples,
            "policies": {},
        }
        for policy, mix in pairs:
            typical = typical_tasks(original)
            jobs = [Job(policy, s, nodes, original, typical, 1.3, mix) for s in args.seeds]
            started = time.perf_counter()
            summary = report.summarize(run_jobs(jobs, args.jobs, show=False))
            (result,) = summary["policies"].values()
            result["mix"] = mix
            result["replay_s"] = round(time.perf_counter() - started, 1)
            entry["policies"][f"{policy}:{mix}"] = result
        everything[trace] = entry
        rows.append((trace, entry))
        print_row(trace, entry, pairs, len(args.seeds))
    print_closed(rows, pairs)
    if args.json:
        args.json.write_text(json.dumps(everything, indent=1), encoding="utf-8")
    return 0


def print_row(
    trace: str, entry: dict[str, Any], pairs: Sequence[tuple[str, Mix]], seeds: int
) -> None:
    bound = entry["bound"]
    line = (
        f"{trace:<11} seeds={seeds:<3} bound {bound['mean']:5.2f} (median {bound['median']:5.2f}, "
        f"{entry['bound_solve_s_per_seed']:5.1f} s per seed)"
    )
    for key, result in entry["policies"].items():
        line += f"  {key} {result['unallocated_pct_at_100']['mean']:5.2f}"
    print(line, flush=True)
    for sample in entry["samples"]:
        exact = (
            f"{sample['optimum_unallocated_pct_at_least']:.2f}"
            if sample["optimal"]
            else f"{sample['optimum_unallocated_pct_at_least']:.2f}.."
            f"{sample['optimum_unallocated_pct_at_most']:.2f}"
        )
        print(
            f"    sample seed {sample['seed']}: {sample['nodes']} nodes, {sample['gpus']} GPUs, "
            f"{sample['tasks']} tasks: LP bound {sample['lp_unallocated_pct']:.2f}, optimum "
            f"{exact} ({sample['exact_s']:.0f} s, {sample['exact_variables']} variables)"
            + "".join(f", {k} {v:.2f}" for k, v in sample["policies_unallocated_pct"].items()),
            flush=True,
        )


def print_closed(
    rows: Sequence[tuple[str, dict[str, Any]]], pairs: Sequence[tuple[str, Mix]]
) -> None:
    """FGD (trace) and tessera (online): the share of FGD's gap to the bound tessera closes."""
    fgd, tessera = "fgd:trace", "tessera:online"
    if not any(fgd in e["policies"] and tessera in e["policies"] for _, e in rows):
        return
    print(
        f"\n{'trace':<11} {'bound':>6} {'FGD':>6} {'tessera':>8} {'tessera-FGD':>11} "
        f"{'gap closed':>10}"
    )
    for trace, entry in rows:
        if fgd not in entry["policies"] or tessera not in entry["policies"]:
            continue
        b = entry["bound"]["mean"]
        f = entry["policies"][fgd]["unallocated_pct_at_100"]["mean"]
        t = entry["policies"][tessera]["unallocated_pct_at_100"]["mean"]
        closed = (f - t) / (f - b) if f > b else 0.0
        print(f"{trace:<11} {b:6.2f} {f:6.2f} {t:8.2f} {t - f:+11.2f} {100 * closed:9.0f}%")


if __name__ == "__main__":
    sys.exit(main())
