"""Summaries of replays: per-policy mean and median over seeds, as a table or one JSON object."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from services.placer.sim.replay import ReplayResult


def _stat(values: Sequence[float]) -> dict[str, float]:
    return {
        "mean": round(statistics.fmean(values), 4),
        "median": round(statistics.median(values), 4),
    }


def _point(result: ReplayResult, bucket: int, what: str) -> float:
    value = result.curves.alloc_at(bucket) if what == "alloc" else result.curves.frag_at(bucket)
    if value is None:
        raise ValueError(f"the replay never reached {bucket} % arrived workload")
    return value


def summarize(results: Sequence[ReplayResult]) -> dict[str, Any]:
    """``{"policies": {name: {...}}}`` in the order policies first appear in ``results``."""
    by_policy: dict[str, list[ReplayResult]] = {}
    for result in results:
        by_policy.setdefault(result.policy, []).append(result)
    policies: dict[str, Any] = {}
    for name, runs in by_policy.items():
        runs = sorted(runs, key=lambda r: r.seed)
        alloc100 = [_point(r, 100, "alloc") for r in runs]
        alloc130 = [_point(r, 130, "alloc") for r in runs]
        frag100 = [_point(r, 100, "frag") for r in runs]
        frag130 = [_point(r, 130, "frag") for r in runs]
        policies[name] = {
            "allocated_pct_at_100": _stat(alloc100),
            "unallocated_pct_at_100": _stat([100 - a for a in alloc100]),
            "unallocated_pct_at_130": _stat([100 - a for a in alloc130]),
            "frag_amount_pct_at_100": _stat(frag100),
            "frag_amount_pct_at_130": _stat(frag130),
            "seeds": [r.seed for r in runs],
            "per_seed_unallocated_pct_at_100": [round(100 - a, 4) for a in alloc100],
            "tasks": round(statistics.fmean(r.tasks for r in runs)),
            "failed_tasks": round(statistics.fmean(r.failed for r in runs)),
            "wall_s": round(sum(r.wall_s for r in runs), 3),
            "decisions_per_s": round(statistics.fmean(r.decisions_per_s for r in runs), 1),
        }
    return {"policies": policies}


def curve(results: Sequence[ReplayResult], policy: str) -> list[tuple[int, float]]:
    """Mean unallocated GPU % per arrived bucket over the policy's seeds."""
    runs = [r for r in results if r.policy == policy]
    buckets = sorted(set.intersection(*(set(r.curves.buckets()) for r in runs))) if runs else []
    points = []
    for bucket in buckets:
        values = [r.curves.alloc_at(bucket) for r in runs]
        present = [v for v in values if v is not None]
        if len(present) == len(runs):
            points.append((bucket, 100 - statistics.fmean(present)))
    return points


def table(summary: dict[str, Any]) -> str:
    """A fixed-width table: allocated / unallocated / fragmentation at 100 % and 130 % arrived."""
    header = (
        f"{'policy':<12} {'alloc@100':>10} {'unalloc@100':>12} {'(median)':>9} "
        f"{'unalloc@130':>12} {'frag@100':>9} {'frag@130':>9} {'tasks':>6} {'failed':>6} "
        f"{'seeds':>5} {'wall s':>7}"
    )
    lines = [header, "-" * len(header)]
    for name, p in summary["policies"].items():
        lines.append(
            f"{name:<12} {p['allocated_pct_at_100']['mean']:>10.2f} "
            f"{p['unallocated_pct_at_100']['mean']:>12.2f} "
            f"{p['unallocated_pct_at_100']['median']:>9.2f} "
            f"{p['unallocated_pct_at_130']['mean']:>12.2f} "
            f"{p['frag_amount_pct_at_100']['mean']:>9.2f} "
            f"{p['frag_amount_pct_at_130']['mean']:>9.2f} {p['tasks']:>6} {p['failed_tasks']:>6} "
            f"{len(p['seeds']):>5} {p['wall_s']:>7.1f}"
        )
    lines.append("(percent of cluster GPU capacity; mean over seeds unless marked median)")
    return "\n".join(lines)
