"""A chaos run: pods through the whole system while services and NATS are SIGKILLed and restarted.

Shared by the CI tests (small) and ``benchmarks/chaos.py`` (longer: more pods, more kills). Kill
moments are drawn from a seeded random generator and logged; each killed process is started again
after a short pause.
Targets: a placer, the binder leader, a device plugin, nats-server (one of three on a cluster),
and ``nats-store``: nats-server SIGKILLed and started again with an empty store (an ``emptyDir``
NATS pod restarting), after which what is bound is restored from the Kubernetes API.

A pod the kubelet rejects is replaced at once, as its ReplicaSet would, and counted; each must be
explained by the scenario: ``UnexpectedAdmissionError`` while its node's device plugin or NATS was
down (or had just come back: ``RECOVERY_S``, longer for a lost store). Any other failed pod (one
lost at admission for another reason) fails the run. At the end every pod must be Running with
exactly its record's slices, no GPU over-committed at any allocation, no record left
``reserved`` or ``bound``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from shared import codec, subjects
from shared.messages.assignments import AssignmentRecord
from shared.runtime.tasks import cancel_and_wait
from tessera.devcluster.resources import POD, ApiError
from tessera.up import workload as w
from tessera.up.system import LocalSystem
from tests.e2e.helpers import assert_exact, connected_bus, pending_message, phase, until

NAMESPACE = "chaos"
TARGETS = ("placer", "binder-leader", "deviceplugin", "nats-server")
REPLACE_POLL_S = 0.2
RECOVERY_S = 10.0
"""After a restart, how long a device plugin (registering, loading records) or the services
(reconnecting to NATS) may still fail an Allocate."""
STORE_RECOVERY_S = 30.0
"""After NATS came back with an empty store: the binder restores what is bound, then pods
waiting for Allocate find their records again."""


@dataclass(frozen=True)
class Outage:
    """A process the run killed: from the kill to its restart."""

    name: str
    down_at: float
    up_at: float = float("inf")
    store_lost: bool = False

    def explains(self, failure: Failure) -> bool:
        """Whether this outage can have failed ``failure``'s Allocate."""
        if failure.reason != "UnexpectedAdmissionError":
            return False
        if not self.name.startswith("nats-server") and self.name != f"deviceplugin/{failure.node}":
            return False
        recovery = STORE_RECOVERY_S if self.store_lost else RECOVERY_S
        return self.down_at <= failure.seen_at <= self.up_at + recovery


@dataclass(frozen=True)
class Failure:
    """A pod the kubelet rejected, as the replacer saw it (within its polling interval)."""

    name: str
    node: str
    reason: str
    message: str
    seen_at: float


PodMaker = Callable[[int, int], dict[str, Any]]
"""(pod number, generation) -> the pod: ``c-<number>``, ``-r<generation>`` once replaced."""


class ReplicaSet:
    """Replaces each pod of the namespace the kubelet failed at once, as its ReplicaSet would,
    noting the failure (:class:`Failure`, seen within :data:`REPLACE_POLL_S`)."""

    def __init__(
        self,
        system: LocalSystem,
        make: PodMaker,
        *,
        clock: Callable[[], float],
        note: Callable[[str], None],
    ) -> None:
        self._system = system
        self._make = make
        self._clock = clock
        self._note = note
        self.generations: dict[int, int] = {}
        self.replaced: list[Failure] = []

    def create(self, n: int) -> None:
        self._system.cluster.create_pod(self._make(n, self.generations.get(n, 0)))

    def delete(self, n: int) -> None:
        """Delete pod number ``n`` (its current generation), if it is still there."""
        name = self._make(n, self.generations.get(n, 0))["metadata"]["name"]
        with contextlib.suppress(ApiError):
            self._system.cluster.api.delete(POD, NAMESPACE, name)

    def replace_failed(self) -> None:
        for current in self._system.cluster.pods(NAMESPACE):
            if phase(current) != "Failed" or current["metadata"].get("deletionTimestamp"):
                continue
            name = current["metadata"]["name"]
            n = int(name.split("-")[1])
            status = current.get("status") or {}
            failure = Failure(
                name=name,
                node=current["spec"].get("nodeName") or "",
                reason=str(status.get("reason")),
                message=str(status.get("message", "")),
                seen_at=self._clock(),
            )
            self._note(
                f"replacing {name} on {failure.node}: {failure.reason}: {failure.message[:160]}"
            )
            self.replaced.append(failure)
            self._system.cluster.api.delete(POD, NAMESPACE, name)
            self.generations[n] = self.generations.get(n, 0) + 1
            self.create(n)

    async def run(self) -> None:
        """Replace failed pods as they fail, so that each is seen (and timed) at its failure."""
        while True:
            self.replace_failed()
            await asyncio.sleep(REPLACE_POLL_S)


def chaos_pod(n: int, generation: int = 0) -> dict[str, Any]:
    """Pod ``c-<n>``: one GPU container, 8,192 MiB and 10 % of the SMs every third pod, else
    4,096 MiB and 5 %."""
    suffix = f"-r{generation}" if generation else ""
    container = (
        w.container(gpu=1, memory_mib=4096, cores=5, cpu="100m", memory="128Mi")
        if n % 3
        else w.container(gpu=1, memory_mib=8192, cores=10, cpu="100m", memory="128Mi")
    )
    return w.pod(f"c-{n}{suffix}", [container], namespace=NAMESPACE)


@dataclass
class ChaosReport:
    log: list[str] = field(default_factory=list)
    replaced: list[Failure] = field(default_factory=list)
    outages: list[Outage] = field(default_factory=list)
    pods: int = 0
    wall_s: float = 0.0

    def unexplained(self) -> list[Failure]:
        return [f for f in self.replaced if not any(o.explains(f) for o in self.outages)]


async def chaos_run(
    system: LocalSystem,
    *,
    pods: int,
    seed: int,
    window_s: float,
    say: Callable[[str], None] = print,
    settle_timeout_s: float = 150.0,
    targets: Sequence[str] = TARGETS,
) -> ChaosReport:
    rng = random.Random(seed)
    result = ChaosReport(pods=pods)
    started = time.monotonic()

    def clock() -> float:
        return time.monotonic() - started

    def note(text: str) -> None:
        line = f"{clock():7.2f} s  {text}"
        result.log.append(line)
        say(line)

    gpu_nodes = [plan.name for plan in system.gpu_nodes]
    plan = sorted((rng.uniform(0.3, window_s), target) for target in targets)
    busy: dict[str, asyncio.Lock] = {}

    async def strike(at: float, target: str) -> None:
        await asyncio.sleep(max(0.0, at - (time.monotonic() - started)))
        if target == "placer":
            name = rng.choice(system.placer_names())
        elif target == "binder-leader":
            name = await system.leader()
        elif target == "deviceplugin":
            name = f"deviceplugin/{rng.choice(gpu_nodes)}"
        else:
            name = rng.choice(system.nats_names())
        lost = target == "nats-store"
        pause = rng.uniform(0.5, 2.5)
        # Two strikes on one process (longer runs draw several per target) take turns: the
        # second kills it once it is back, never while it is down.
        async with busy.setdefault(name, asyncio.Lock()):
            wiped = " and wipe its store" if lost else ""
            note(f"SIGKILL {name}{wiped} (restart in {pause:.1f} s)")
            down = len(result.outages)
            result.outages.append(Outage(name, down_at=clock(), store_lost=lost))
            await asyncio.to_thread(system.wipe_nats_store if lost else system.kill, name)
            await asyncio.sleep(pause)
            system.restart(name)
            result.outages[down] = dataclasses.replace(result.outages[down], up_at=clock())
            note(f"restarted {name}")

    replicas = ReplicaSet(system, chaos_pod, clock=clock, note=note)
    result.replaced = replicas.replaced

    async def submit() -> None:
        batches = 8
        for batch in range(batches):
            for n in range(batch * pods // batches, (batch + 1) * pods // batches):
                replicas.create(n)
            await asyncio.sleep(window_s / batches)

    replacer = asyncio.create_task(replicas.run())
    try:
        await asyncio.gather(submit(), *(strike(at, target) for at, target in plan))
        note("chaos over; waiting for every pod")

        def all_running() -> bool:
            current = system.cluster.pods(NAMESPACE)
            return len(current) == pods and all(phase(p) == "Running" for p in current)

        try:
            await until(
                all_running, timeout=settle_timeout_s, what="every chaos pod Running", interval=0.2
            )
        except AssertionError:
            stuck = [
                (p["metadata"]["name"], phase(p), p["spec"].get("nodeName"), pending_message(p))
                for p in system.cluster.pods(NAMESPACE)
                if phase(p) != "Running"
            ]
            raise AssertionError(f"not every pod Running: {stuck[:20]} ({len(stuck)})") from None
    finally:
        await cancel_and_wait(replacer)
    note(f"every pod Running; {len(result.replaced)} replaced")
    unexplained = result.unexplained()
    assert not unexplained, f"pods failed that no outage explains: {unexplained}"
    final = system.cluster.pods(NAMESPACE)
    await assert_exact(system, final)
    await assert_no_record_stuck(
        system, {p["metadata"]["uid"]: p["spec"].get("nodeName") or "" for p in final}
    )
    result.wall_s = time.monotonic() - started
    return result


async def assert_no_record_stuck(system: LocalSystem, running: dict[str, str]) -> None:
    """Once things settle, each Running pod's record on its node is allocated and every other
    record is released. ``running``: the Running pods' nodes by pod UID.

    A Running pod may also have a released record on another node: the fence of a commit that
    lost (two replicas decided the pod at once after a placer died mid-commit; seen in a
    three-server run, where the loser's fence stayed as it should)."""

    async def stuck() -> list[str]:
        bus = await connected_bus(system)
        problems = []
        for key in await bus.kv_keys(subjects.KV_ASSIGNMENTS):
            entry = await bus.kv_get(subjects.KV_ASSIGNMENTS, key)
            if entry is None:
                continue
            record = codec.decode(entry.value, AssignmentRecord)
            node = running.get(record.pod_uid)
            if node == record.node:
                if record.state != "allocated":
                    problems.append(f"{record.name}: {record.state} while Running here")
            elif record.state != "released":
                where = "Running elsewhere" if node else "pod not Running"
                problems.append(f"{record.name}: {record.state} on {record.node}, {where}")
        return problems

    deadline = time.monotonic() + 60
    problems = await stuck()
    while problems and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        problems = await stuck()
    assert not problems, problems
