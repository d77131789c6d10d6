"""Chaos in CI (small): SIGKILL a placer, the binder leader, a device plugin and nats-server; NATS
losing its whole store; one of three NATS servers of a JetStream cluster killed."""

from __future__ import annotations

from pathlib import Path

import pytest

from tessera.up.spec import plan_nodes
from tessera.up.system import LocalSystem, SystemOptions
from tests.e2e.chaos import ChaosReport, chaos_run

pytestmark = [pytest.mark.asyncio(loop_scope="package"), pytest.mark.timeout(300)]
FAST_LEASE = ("--lease-duration-s", "4", "--renew-deadline-s", "3", "--retry-period-s", "1")


def options(tmp_path: Path, **overrides: object) -> SystemOptions:
    fields: dict[str, object] = {
        "nodes": plan_nodes("4xA100-80GB", 3),
        "run_dir": tmp_path,
        "placers": 2,
        "binders": 2,
        "dashboard": False,
        "binder_args": FAST_LEASE,
        "ready_timeout_s": 150.0,
    }
    return SystemOptions(**(fields | overrides))  # type: ignore[arg-type]


def each_outage_ended(system: LocalSystem, report: ChaosReport, count: int) -> None:
    assert len(report.outages) == count, report.log
    assert all(o.up_at < float("inf") for o in report.outages), report.log
    # Through every kill and restart, each service stayed within its NATS permissions.
    assert system.bus_violations() == []
    # Every replaced pod was explained by an outage (chaos_run asserts it); say how many.
    print(f"{len(report.replaced)} pods replaced: {[f.name for f in report.replaced]}")


async def test_every_pod_runs_with_its_slices_through_kills_of_every_kind(tmp_path: Path) -> None:
    async with LocalSystem(options(tmp_path)) as system:
        report = await chaos_run(system, pods=150, seed=7, window_s=8.0)
    each_outage_ended(system, report, 4)


async def test_nats_losing_its_whole_store_loses_no_pod_and_over_commits_nothing(
    tmp_path: Path,
) -> None:
    """nats-server SIGKILLed and started empty mid-run (an emptyDir NATS pod restarting), with
    a placer killed too: what is bound is restored from the pods' annotations before any new
    decision, so every pod ends Running with its slices and no GPU is over-committed."""
    async with LocalSystem(options(tmp_path)) as system:
        report = await chaos_run(
            system, pods=120, seed=11, window_s=8.0, targets=("nats-store", "placer")
        )
    each_outage_ended(system, report, 2)


async def test_one_of_three_nats_servers_killed_loses_nothing(tmp_path: Path) -> None:
    """A 3-server JetStream cluster, three replicas of everything: a server SIGKILLed under
    load (and a placer) loses no pod and no record."""
    async with LocalSystem(options(tmp_path, nats_servers=3)) as system:
        report = await chaos_run(
            system, pods=120, seed=5, window_s=8.0, targets=("nats-server", "placer")
        )
    each_outage_ended(system, report, 2)
