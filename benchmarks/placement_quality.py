"""Placement quality on the Alibaba 2023 GPU traces, FGD methodology, against the published figures.

Runs ``tessera simulate``'s replay for every (trace, task mix, policy, seed) and prints, per trace
and mix, the unallocated GPU share at 100 % arrived (mean and median over seeds), the published
mean where the perf-anchor note gives one, and the gap. Asserts nothing.

``--mixes trace`` (default) gives FGD and tessera the whole trace's typical task mix in advance,
as the FGD artifact does (the published figures are measured so); ``online`` the mix the placer
service learns from the pods placed so far; ``trace,online`` runs both.

    .venv/bin/python benchmarks/placement_quality.py --traces default --seeds 42-51 --jobs 2
    .venv/bin/python benchmarks/placement_quality.py --traces all --mixes trace,online --jobs 2
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from services.placer.sim import report
from services.placer.sim.command import Job, parse_seeds, run_jobs
from services.placer.sim.replay import Mix
from services.placer.sim.trace import load_nodes, load_tasks
from services.placer.sim.workload import typical_tasks

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "alibaba-gpu-v2023" / "csv"
POLICIES = ("random", "dotprod", "clustering", "packing", "bestfit", "fgd", "tessera")

# Unallocated GPU % at 100 % arrived, mean of seeds 42..51 (research/perf-anchor.md, section 1b).
PUBLISHED: dict[str, dict[str, float]] = {
    "default": {
        "random": 13.70,
        "dotprod": 9.38,
        "clustering": 8.35,
        "packing": 8.22,
        "bestfit": 7.14,
        "fgd": 4.77,
    },
    "cpu050": {
        "random": 10.98,
        "dotprod": 6.97,
        "clustering": 6.48,
        "packing": 6.54,
        "bestfit": 6.44,
        "fgd": 5.00,
    },
    "gpushare40": {
        "random": 15.14,
        "dotprod": 10.70,
        "clustering": 10.24,
        "packing": 10.23,
        "bestfit": 8.56,
        "fgd": 6.04,
    },
    "gpuspec10": {
        "random": 13.74,
        "dotprod": 9.83,
        "clustering": 8.04,
        "packing": 7.76,
        "bestfit": 6.90,
        "fgd": 5.34,
    },
    "multigpu20": {
        "random": 13.08,
        "dotprod": 8.15,
        "clustering": 6.66,
        "packing": 6.50,
        "bestfit": 6.27,
        "fgd": 4.47,
    },
}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--traces", default="default", help="comma-separated, or 'all'")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--seeds", type=parse_seeds, default=parse_seeds("42-51"))
    parser.add_argument("--mixes", default="trace", help="trace, online, or trace,online")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--json", type=Path, help="also write the full summaries here")
    args = parser.parse_args()
    traces = sorted(PUBLISHED) if args.traces == "all" else args.traces.split(",")
    mixes: list[Mix] = []
    for mix in args.mixes.split(","):
        if mix not in ("trace", "online"):
            parser.error(f"unknown task mix {mix!r} (known: trace, online)")
        mixes.append("online" if mix == "online" else "trace")
    nodes = tuple(load_nodes(DATA / "openb_node_list_gpu_node.csv"))
    everything: dict[str, dict[str, object]] = {}
    for trace, mix in ((trace, mix) for trace in traces for mix in mixes):
        original = tuple(load_tasks(DATA / f"openb_pod_list_{trace}.csv"))
        typical = typical_tasks(original)
        jobs = [
            Job(policy, seed, nodes, original, typical, 1.3, mix)
            for policy in args.policies.split(",")
            for seed in args.seeds
        ]
        started = time.perf_counter()
        summary = report.summarize(run_jobs(jobs, args.jobs, show=False))
        elapsed = time.perf_counter() - started
        everything[f"{trace}/{mix}"] = summary
        print(
            f"\n== {trace}, {mix} task mix: {len(args.seeds)} seeds, {elapsed:.0f} s wall, "
            f"--jobs {args.jobs}"
        )
        print(
            f"{'policy':<11} {'unalloc@100 mean':>17} {'median':>7} {'published':>9} {'gap':>6} "
            f"{'unalloc@130':>11} {'frag@100':>8}"
        )
        for policy, p in summary["policies"].items():
            mean = p["unallocated_pct_at_100"]["mean"]
            published = PUBLISHED.get(trace, {}).get(policy)
            gap = f"{mean - published:+6.2f}" if published is not None else "     -"
            shown = f"{published:9.2f}" if published is not None else "        -"
            print(
                f"{policy:<11} {mean:>17.2f} {p['unallocated_pct_at_100']['median']:>7.2f} "
                f"{shown} {gap} {p['unallocated_pct_at_130']['mean']:>11.2f} "
                f"{p['frag_amount_pct_at_100']['mean']:>8.2f}",
                flush=True,
            )
    if args.json:
        args.json.write_text(json.dumps(everything, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
