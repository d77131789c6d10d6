"""Fixtures for binder tests: the Kubernetes API test double, a kubeconfig for it, and running
binders (the real service body over real NATS and the real kubernetes-asyncio client)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import kubernetes_validate
import pytest
from prometheus_client import CollectorRegistry

from services.binder.command import BinderSettings, build_config
from services.binder.kube import KubeGateway, RetryPolicy, load_configuration, new_configuration
from services.binder.service import run_binder
from shared import codec, subjects
from shared.clock import SystemClock
from shared.messages.assignments import AssignmentRecord
from shared.runtime.bus import Bus, Delivery
from shared.runtime.health import Readiness
from shared.runtime.lifecycle import run_service
from tessera.devcluster.apiserver import ApiServer
from tests.binder.builders import NODE
from tests.harness.nats import NatsServer
from tests.harness.wait import eventually as shared_eventually

T = TypeVar("T")

FAST_RETRY = RetryPolicy(attempts=4, initial_s=0.05, max_s=0.5)


eventually = functools.partial(shared_eventually, timeout=20.0, interval=0.02)
"""Poll ``condition`` (sync or async) until it is truthy."""


class Collector:
    """Every message published on a subject (core subscription: JetStream publishes too)."""

    def __init__(self) -> None:
        self.deliveries: list[Delivery] = []

    async def __call__(self, delivery: Delivery) -> None:
        self.deliveries.append(delivery)

    def decoded(self, message_type: type[T]) -> list[T]:
        return [codec.decode(d.data, message_type) for d in self.deliveries]


async def collect(bus: Bus, subject: str) -> Collector:
    collector = Collector()
    await bus.subscribe(subject, collector)
    return collector


async def get_record(bus: Bus, uid: str, node: str = NODE) -> AssignmentRecord | None:
    entry = await bus.kv_get(subjects.KV_ASSIGNMENTS, subjects.assignment_key(node, uid))
    return None if entry is None else codec.decode(entry.value, AssignmentRecord)


K8S_VERSION = kubernetes_validate.utils.latest_version()
SAMPLES_PER_KIND = 3


def validate_writes(api: ApiServer) -> int:
    """Validate what clients wrote to ``api`` with ``kubernetes-validate --strict`` against the
    newest Kubernetes it knows: the bodies of creates and updates (what was sent) and the
    objects that patches, creates and bindings produced; a few of each kind of write. Returns
    how many objects were checked."""
    checked: Counter[tuple[str, str]] = Counter()
    total = 0
    for write in api.writes:
        kind = (write.verb, write.resource)
        if write.code >= 300 or checked[kind] >= SAMPLES_PER_KIND:
            continue
        checked[kind] += 1
        objects = [write.result] if write.result is not None else []
        if write.verb in ("create", "update") and isinstance(write.body, dict):
            objects.append(write.body)
        for obj in objects:
            try:
                kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
            except kubernetes_validate.ValidationError as error:
                raise AssertionError(
                    f"{write.verb} {write.resource} wrote an invalid {obj.get('kind')}: "
                    f"{error.message} at {list(error.absolute_path)}"
                ) from None
            total += 1
    return total


@pytest.fixture
async def api() -> AsyncIterator[ApiServer]:
    """The API test double; every object written to it is validated after the test."""
    async with ApiServer(bookmark_interval_s=0.2) as server:
        yield server
    validate_writes(server)


@pytest.fixture
def kubeconfig(api: ApiServer, tmp_path: Path) -> Path:
    return api.write_kubeconfig(tmp_path / "kubeconfig")


@dataclass
class RunningBinder:
    readiness: Readiness
    registry: CollectorRegistry
    stop: asyncio.Event
    task: asyncio.Task[int]

    def metric(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0

    def leading(self) -> bool:
        return self.metric("tessera_binder_leader") == 1.0


BinderFactory = Callable[..., contextlib.AbstractAsyncContextManager[RunningBinder]]


def test_settings(nats_server: NatsServer, kubeconfig: Path, **overrides: Any) -> BinderSettings:
    fields: dict[str, Any] = {
        "nats_url": nats_server.url,
        "http_host": "127.0.0.1",
        "http_port": 0,
        "log_format": "text",
        "kubeconfig": str(kubeconfig),
        # Leadership must not change hands because a loaded machine answered slowly (a leader
        # that cannot renew for 10 s stops): a test that needs a takeover stops the leader,
        # which releases the lease, taken at the standby's next retry.
        "lease_duration_s": 15.0,
        "renew_deadline_s": 10.0,
        "retry_period_s": 0.2,
        "api_timeout_s": 5.0,
        "watch_timeout_s": 60,
    }
    return BinderSettings(**(fields | overrides))


@pytest.fixture
def start_binder(nats_server: NatsServer, kubeconfig: Path) -> BinderFactory:
    """``async with start_binder(**settings) as binder:`` runs the binder's service body
    (run_service + run_binder) in this process; ready (and leading, unless told otherwise)
    on entry, stopped with SIGTERM semantics on exit."""

    @contextlib.asynccontextmanager
    async def running(
        *, wait_leader: bool = True, **overrides: Any
    ) -> AsyncIterator[RunningBinder]:
        settings = test_settings(nats_server, kubeconfig, **overrides)
        config = build_config(settings, environ=os.environ)
        configuration = new_configuration()
        await load_configuration(configuration, kubeconfig=settings.kubeconfig, environ={})
        clock = SystemClock()
        connect = functools.partial(
            KubeGateway.create,
            configuration,
            clock=clock,
            timeout_s=settings.api_timeout_s,
            watch_timeout_s=settings.watch_timeout_s,
            retry=FAST_RETRY,
        )
        binder = RunningBinder(
            readiness=Readiness(),
            registry=CollectorRegistry(),
            stop=asyncio.Event(),
            task=None,  # type: ignore[arg-type]
        )
        binder.task = asyncio.create_task(
            run_service(
                name="binder",
                settings=settings,
                body=functools.partial(run_binder, config=config, connect=connect),
                clock=clock,
                stop=binder.stop,
                readiness=binder.readiness,
                registry=binder.registry,
            )
        )
        try:
            await eventually(
                lambda: binder.readiness.ready or binder.task.done(),
                what=f"binder readiness {binder.readiness.report()}",
            )
            assert not binder.task.done(), "the binder stopped while starting"
            if wait_leader:
                await eventually(binder.leading, what="the binder to lead")
            yield binder
        finally:
            binder.stop.set()
            assert await asyncio.wait_for(binder.task, timeout=20) == 0

    return running


async def wait_for(awaitable: Awaitable[T], timeout: float = 20.0) -> T:
    return await asyncio.wait_for(awaitable, timeout)
