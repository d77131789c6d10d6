"""Chaos in CI (small): SIGKILL a placer, the binder leader, a device plugin and nats-server."""

from __future__ import annotations

from pathlib import Path

import pytest

from tessera.up.spec import plan_nodes
from tessera.up.system import LocalSystem, SystemOptions
from tests.e2e.chaos import chaos_run

pytestmark = [pytest.mark.asyncio(loop_scope="package"), pytest.mark.timeout(300)]
FAST_LEASE = ("--lease-duration-s", "4", "--renew-deadline-s", "3", "--retry-period-s", "1")


async def test_every_pod_runs_with_its_slices_through_kills_of_every_kind(tmp_path: Path) -> None:
    options = SystemOptions(
        nodes=plan_nodes("4xA100-80GB", 3),
        run_dir=tmp_path,
        placers=2,
        binders=2,
        dashboard=False,
        binder_args=FAST_LEASE,
        ready_timeout_s=150.0,
    )
    async with LocalSystem(options) as system:
        report = await chaos_run(system, pods=150, seed=7, window_s=8.0)
    # Through every kill and restart, each service stayed within its NATS permissions.
    assert system.bus_violations() == []
    assert [o.name.split("/")[0] for o in report.outages] != [], report.log
    assert len(report.outages) == 4 and all(o.up_at < float("inf") for o in report.outages)
    # Every replaced pod was explained by an outage (chaos_run asserts it); say how many.
    print(f"{len(report.replaced)} pods replaced: {[f.name for f in report.replaced]}")
