"""Summaries of replays: per-policy mean and median over seeds, as a table or one JSON object;
with a tenancy config, each tenant's pods and holdings at the end, mean over seeds."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from services.placer.sim.replay import ReplayResult, TenantResult


def stat(values: Sequence[float]) -> dict[str, float]:
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
            "allocated_pct_at_100": stat(alloc100),
            "unallocated_pct_at_100": stat([100 - a for a in alloc100]),
            "unallocated_pct_at_130": stat([100 - a for a in alloc130]),
            "frag_amount_pct_at_100": stat(frag100),
            "frag_amount_pct_at_130": stat(frag130),
            "seeds": [r.seed for r in runs],
            "per_seed_unallocated_pct_at_100": [round(100 - a, 4) for a in alloc100],
            "tasks": round(statistics.fmean(r.tasks for r in runs)),
            "failed_tasks": round(statistics.fmean(r.failed for r in runs)),
            "wall_s": round(sum(r.wall_s for r in runs), 3),
            "decisions_per_s": round(statistics.fmean(r.decisions_per_s for r in runs), 1),
            "profile_builds": round(statistics.fmean(r.profile_builds for r in runs), 1),
            "tenants": _tenants(runs),
        }
    return {"policies": policies}


def _tenants(runs: Sequence[ReplayResult]) -> dict[str, dict[str, float]]:
    """Each tenant's end state, mean over ``runs`` (a tenant absent from a run counts as 0)."""
    names = sorted({name for r in runs for name in r.tenants})
    found: dict[str, dict[str, float]] = {}
    for name in names:
        held = [r.tenants.get(name, TenantResult()) for r in runs]
        found[name or "(none)"] = {
            what: round(statistics.fmean(getattr(t, what) for t in held), 1)
            for what in ("placed", "waiting", "gpu_milli", "gpus", "gpu_memory_mib")
        }
    return found


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
    found = summary.get("bound")
    if found:
        lines.append(
            f"{'bound (LP)':<12} {'':>10} {found['unallocated_pct_at_100']['mean']:>12.2f} "
            f"{found['unallocated_pct_at_100']['median']:>9.2f} {'':>12} {'':>9} {'':>9} "
            f"{'':>6} {'':>6} {len(found['seeds']):>5} {found['solve_s']:>7.1f}"
        )
    lines.append("(percent of cluster GPU capacity; mean over seeds unless marked median)")
    if found:
        lines.append(
            "(bound: no placement of the seed's tasks, online or offline, leaves less unallocated "
            "at 100 % arrived)"
        )
    if summary.get("tenancy_file"):
        gpus = summary["gpus"]
        for name, p in summary["policies"].items():
            lines.append("")
            lines.append(f"{name}, per tenant at the end (mean over seeds):")
            lines.append(
                f"  {'tenant':<16} {'placed':>7} {'waiting':>7} {'GPU share %':>11} "
                f"{'GPUs held':>9} {'GPU MiB':>10}"
            )
            for tenant, t in p["tenants"].items():
                lines.append(
                    f"  {tenant:<16} {t['placed']:>7.0f} {t['waiting']:>7.0f} "
                    f"{100 * t['gpu_milli'] / (1000 * gpus):>11.2f} {t['gpus']:>9.0f} "
                    f"{t['gpu_memory_mib']:>10.0f}"
                )
    return "\n".join(lines)
