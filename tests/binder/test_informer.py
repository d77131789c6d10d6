"""The informer loses nothing and repeats nothing across dropped watches and 410 Gone."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

from prometheus_client import CollectorRegistry

from services.binder.informer import Informer
from services.binder.kube import KubeGateway, RetryPolicy, load_configuration, new_configuration
from services.binder.metrics import BinderMetrics
from services.binder.sync import NON_TERMINATED
from shared.clock import SystemClock
from shared.kubeobjects import Pod
from tessera.devcluster.apiserver import ApiServer
from tessera.devcluster.resources import NODE, POD
from tests.binder.builders import node, pod
from tests.binder.conftest import eventually


class Mirror:
    """What a handler learns from on_change: the informer's view, rebuilt from events only."""

    def __init__(self) -> None:
        self.state: dict[str, str] = {}
        self.reported: Counter[tuple[str, str, str]] = Counter()

    def __call__(self, old: Pod | None, new: Pod | None) -> None:
        if new is None:
            assert old is not None
            assert self.state.pop(old.metadata.key) == old.metadata.resource_version
            self.reported[("deleted", old.metadata.key, old.metadata.uid)] += 1
        else:
            self.state[new.metadata.key] = new.metadata.resource_version
            self.reported[("seen", new.metadata.key, new.metadata.resource_version)] += 1


def live(api: ApiServer) -> dict[str, str]:
    """What the informer must end up with: non-terminated pods, by key."""
    return {
        f"{p['metadata']['namespace']}/{p['metadata']['name']}": p["metadata"]["resourceVersion"]
        for p in api.objects(POD)
        if p["status"].get("phase") not in ("Succeeded", "Failed")
    }


@contextlib.asynccontextmanager
async def informing(
    api: ApiServer, kubeconfig: Path
) -> AsyncIterator[tuple[Informer[Pod], Mirror, BinderMetrics]]:
    configuration = new_configuration()
    await load_configuration(configuration, kubeconfig=str(kubeconfig), environ={})
    metrics = BinderMetrics.create(CollectorRegistry())
    clock = SystemClock()
    gateway = KubeGateway.create(
        configuration,
        metrics,
        clock=clock,
        timeout_s=5.0,
        watch_timeout_s=30,
        retry=RetryPolicy(attempts=2, initial_s=0.02, max_s=0.05),
    )
    mirror = Mirror()
    informer = Informer(
        name="pods",
        kind=Pod,
        gateway=gateway,
        on_change=mirror,
        clock=clock,
        metrics=metrics,
        field_selector=NON_TERMINATED,
    )
    task = asyncio.create_task(informer.run())
    try:
        await eventually(lambda: informer.synced, what="informer synced")
        yield informer, mirror, metrics
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await gateway.close()


def restarts(metrics: BinderMetrics, reason: str) -> float:
    return float(metrics.watch_restarts.labels(resource="pods", reason=reason)._value.get())


def churn(api: ApiServer, round_: int) -> None:
    """Create, change, finish and delete pods."""
    api.create(POD, pod(f"new-{round_}"))
    api.create(POD, pod(f"brief-{round_}"))
    api.delete(POD, "default", f"brief-{round_}")
    api.patch(
        POD,
        "default",
        "steady",
        {"metadata": {"labels": {"round": str(round_)}}},
        "application/merge-patch+json",
    )
    api.patch(
        POD,
        "default",
        f"new-{round_}",
        {"status": {"phase": "Succeeded"}},
        "application/merge-patch+json",
        "status",
    )
    if round_:
        api.delete(POD, "default", f"keep-{round_}")


async def test_dropped_watches_and_410_lose_and_repeat_nothing(
    api: ApiServer, kubeconfig: Path
) -> None:
    api.create(POD, pod("steady"))
    for i in range(1, 4):
        api.create(POD, pod(f"keep-{i}"))
    async with informing(api, kubeconfig) as (informer, mirror, metrics):
        await eventually(lambda: mirror.state == live(api), what="initial list")
        for round_, (abrupt, compact) in enumerate(
            [(False, False), (True, False), (False, True), (True, True)]
        ):
            # Keep the informer from watching again while the cluster changes.
            api.faults.add(verb="watch", resource="pods", status=503, times=None)
            api.drop_watches(POD, abrupt=abrupt)
            churn(api, round_)
            if compact:
                api.compact()
            api.faults.clear()
            await eventually(
                lambda: mirror.state == live(api),
                what=f"round {round_}: informer {mirror.state} vs API {live(api)}",
            )
        assert informer.cache.keys() == live(api).keys()
        repeated = {k: n for k, n in mirror.reported.items() if n > 1}
        assert not repeated, f"reported more than once: {repeated}"
        assert informer.lists == 3, "listed at start and after each 410"
        assert restarts(metrics, "expired") == 2
        assert restarts(metrics, "closed") + restarts(metrics, "error") >= 2


async def test_bookmarks_keep_the_resource_version_current(
    api: ApiServer, kubeconfig: Path
) -> None:
    api.create(POD, pod("a"))
    async with informing(api, kubeconfig) as (informer, _, _):
        before = informer.resource_version
        api.create(NODE, node("n1"))  # no pod event follows: only a bookmark carries this
        await eventually(
            lambda: informer.resource_version == str(api.store.revision),
            what="a bookmark at the latest revision",
        )
        assert int(informer.resource_version) > int(before)
