"""Lease election: one leader; a leader that cannot renew stops first; a standby takes over."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from services.binder.gateway import ApiUnavailableError
from services.binder.kube import KubeGateway, RetryPolicy, load_configuration, new_configuration
from services.binder.leader import LeaderElector
from services.binder.metrics import BinderMetrics
from shared.clock import SystemClock
from tessera.devcluster.apiserver import ApiServer
from tessera.devcluster.resources import LEASE
from tests.binder.conftest import eventually

DURATION, DEADLINE, RETRY = 1.0, 0.7, 0.1


class Cuttable:
    """A real gateway whose lease calls can be made to fail for this client only."""

    def __init__(self, gateway: KubeGateway) -> None:
        self._gateway = gateway
        self.cut = False

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._gateway, name)
        if "lease" not in name:
            return method

        async def call(*args: Any, **kwargs: Any) -> Any:
            if self.cut:
                raise ApiUnavailableError(name, "cut off from the API server")
            return await method(*args, **kwargs)

        return call


@contextlib.asynccontextmanager
async def electors(
    kubeconfig: Path, count: int
) -> AsyncIterator[list[tuple[LeaderElector, Cuttable, asyncio.Task[None]]]]:
    configuration = new_configuration()
    await load_configuration(configuration, kubeconfig=str(kubeconfig), environ={})
    clock = SystemClock()
    made = []
    for i in range(count):
        gateway = Cuttable(
            KubeGateway.create(
                configuration,
                BinderMetrics.create(CollectorRegistry()),
                clock=clock,
                timeout_s=0.5,
                retry=RetryPolicy(attempts=1),
            )
        )
        elector = LeaderElector(
            gateway=gateway,  # type: ignore[arg-type]
            clock=clock,
            namespace="tessera",
            name="binder",
            identity=f"binder-{i}",
            lease_duration_s=DURATION,
            renew_deadline_s=DEADLINE,
            retry_period_s=RETRY,
        )
        made.append((elector, gateway, asyncio.create_task(elector.run())))
    try:
        yield made
    finally:
        for _, gateway, task in made:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await gateway.close()


async def test_one_leader_then_a_standby_takes_over_from_one_that_cannot_renew(
    api: ApiServer, kubeconfig: Path
) -> None:
    async with electors(kubeconfig, 2) as made:
        await eventually(lambda: any(e.is_leader() for e, _, _ in made), what="a leader")
        leader, cut, _ = next(m for m in made if m[0].is_leader())
        standby = next(m[0] for m in made if m[0] is not leader)
        await eventually(lambda: standby.holder == leader.identity, what="standby sees holder")
        await asyncio.sleep(3 * RETRY)
        assert [e.is_leader() for e, _, _ in made].count(True) == 1
        lease = api.get(LEASE, "tessera", "binder")["spec"]
        assert lease["holderIdentity"] == leader.identity
        assert lease["leaseDurationSeconds"] == 1

        loop = asyncio.get_running_loop()
        cut.cut = True
        cut_at = loop.time()
        stopped_at = taken_at = None
        overlap = False
        while taken_at is None:
            if loop.time() - cut_at > 10:
                raise AssertionError("the standby never took over")
            both = leader.is_leader() and standby.is_leader()
            overlap = overlap or both
            if stopped_at is None and not leader.is_leader():
                stopped_at = loop.time()
            if standby.is_leader():
                taken_at = loop.time()
            await asyncio.sleep(0.005)
        assert not overlap, "two binders wrote at once"
        assert stopped_at is not None and stopped_at - cut_at <= DEADLINE + 0.5
        # From the leader's last renew (at most one retry period before the cut): one lease
        # duration, plus a retry period to notice, plus scheduling slack on a loaded machine.
        assert taken_at - cut_at <= DURATION + 2 * RETRY + 1.0
        assert api.get(LEASE, "tessera", "binder")["spec"]["holderIdentity"] == standby.identity
        assert api.get(LEASE, "tessera", "binder")["spec"]["leaseTransitions"] == 1


async def test_a_released_lease_is_taken_at_once(api: ApiServer, kubeconfig: Path) -> None:
    async with electors(kubeconfig, 2) as made:
        await eventually(lambda: any(e.is_leader() for e, _, _ in made), what="a leader")
        leader, _, task = next(m for m in made if m[0].is_leader())
        standby = next(m[0] for m in made if m[0] is not leader)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await leader.release()
        assert not leader.is_leader()
        assert api.get(LEASE, "tessera", "binder")["spec"]["holderIdentity"] == ""
        loop = asyncio.get_running_loop()
        released_at = loop.time()
        await eventually(standby.is_leader, what="the standby to lead", timeout=5)
        assert loop.time() - released_at < DURATION, "well before the lease would expire"
