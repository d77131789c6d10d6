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
from services.binder.leader import JITTER, LeaderElector
from services.binder.metrics import BinderMetrics
from tessera.devcluster.apiserver import ApiServer
from tessera.devcluster.resources import LEASE
from tests.binder.conftest import eventually
from tests.harness.clock import FakeClock

DURATION, DEADLINE, RETRY = 15.0, 10.0, 2.0
"""client-go's defaults, on a fake clock: every step is decided by the clock the test moves, not
by how fast a loaded machine answers (a 1 s lease on the real clock changed hands under load)."""
STEP = 0.25


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
    kubeconfig: Path, count: int, clock: FakeClock
) -> AsyncIterator[list[tuple[LeaderElector, Cuttable, asyncio.Task[None]]]]:
    configuration = new_configuration()
    await load_configuration(configuration, kubeconfig=str(kubeconfig), environ={})
    made = []
    for i in range(count):
        gateway = Cuttable(
            KubeGateway.create(
                configuration,
                BinderMetrics.create(CollectorRegistry()),
                clock=clock,
                timeout_s=10.0,
                retry=RetryPolicy(attempts=1),
            )
        )
        elector = LeaderElector(
            gateway=gateway,
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


async def idle(clock: FakeClock, electors: int) -> None:
    """Until every elector has finished its API calls and waits for the clock again."""
    await eventually(lambda: clock.sleepers == electors, what=f"{electors} electors waiting")


async def test_one_leader_then_a_standby_takes_over_from_one_that_cannot_renew(
    api: ApiServer, kubeconfig: Path
) -> None:
    clock = FakeClock()
    async with electors(kubeconfig, 2, clock) as made:
        await idle(clock, 2)
        leaders = [e for e, _, _ in made if e.is_leader()]
        assert len(leaders) == 1, "the first to create the Lease leads"
        (leader,) = leaders
        cut = next(g for e, g, _ in made if e is leader)
        standby = next(e for e, _, _ in made if e is not leader)
        for _ in range(round(3 * RETRY / STEP)):
            await clock.advance(STEP)
            await idle(clock, 2)
            assert leader.is_leader() and not standby.is_leader()
        assert standby.holder == leader.identity
        lease = api.get(LEASE, "tessera", "binder")["spec"]
        assert lease["holderIdentity"] == leader.identity
        assert lease["leaseDurationSeconds"] == DURATION

        cut.cut = True
        cut_at = clock.monotonic()
        stopped_at = taken_at = None
        while taken_at is None:
            await clock.advance(STEP)
            await idle(clock, 2)
            assert not (leader.is_leader() and standby.is_leader()), "two binders wrote at once"
            if stopped_at is None and not leader.is_leader():
                stopped_at = clock.monotonic()
            if standby.is_leader():
                taken_at = clock.monotonic()
            assert clock.monotonic() - cut_at <= 3 * DURATION, "the standby never took over"
        # The leader stops within the renew deadline of its last renew (at most one retry period
        # before the cut); the standby takes over one lease duration after it last saw the lease
        # change, noticed at its next (jittered) retry.
        assert stopped_at is not None and stopped_at - cut_at <= DEADLINE
        assert taken_at - cut_at <= DURATION + 2 * RETRY * JITTER
        assert taken_at - cut_at >= DURATION - RETRY, "not before the lease could have expired"
        spec = api.get(LEASE, "tessera", "binder")["spec"]
        assert spec["holderIdentity"] == standby.identity
        assert spec["leaseTransitions"] == 1


async def test_a_released_lease_is_taken_at_once(api: ApiServer, kubeconfig: Path) -> None:
    clock = FakeClock()
    async with electors(kubeconfig, 2, clock) as made:
        await idle(clock, 2)
        leader, _, task = next(m for m in made if m[0].is_leader())
        standby = next(m[0] for m in made if m[0] is not leader)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await leader.release()
        assert not leader.is_leader()
        assert api.get(LEASE, "tessera", "binder")["spec"]["holderIdentity"] == ""
        released_at = clock.monotonic()
        while not standby.is_leader():
            await clock.advance(STEP)
            await idle(clock, 1)
            # At the standby's next (jittered) retry, seen within one step of the clock.
            assert clock.monotonic() - released_at <= RETRY * JITTER + STEP, "at the next retry"
