"""Helpers of the end-to-end tests: pods in, settled pods and exact slices out."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from shared import codec, subjects
from shared.messages.assignments import AssignmentRecord
from shared.messages.ledger import TenantLedger
from shared.runtime.bus import Bus
from tessera.devcluster.resources import POD, ApiError
from tessera.up import report
from tessera.up.command import pod_state
from tessera.up.system import LocalSystem, SystemOptions
from tests.harness.wait import eventually

Obj = dict[str, Any]


until = functools.partial(eventually, timeout=60.0, interval=0.1)
"""Poll ``condition`` until it is truthy; its value."""


@contextlib.asynccontextmanager
async def started(options: SystemOptions) -> AsyncIterator[LocalSystem]:
    """The whole system of ``options``, started; stopped on the way out, and then checked: every
    service did its job within its NATS permissions (one identity each, per node for the device
    plugins and inventories), the server refused nothing."""
    async with LocalSystem(options) as local:
        yield local
    assert local.bus_violations() == []


def pods_of(system: LocalSystem, namespace: str) -> list[Obj]:
    return system.cluster.pods(namespace)


async def settle(
    system: LocalSystem, namespace: str, count: int, timeout: float = 90.0
) -> list[Obj]:
    """Wait until ``namespace`` holds ``count`` pods, each settled; the pods."""

    def settled() -> list[Obj] | None:
        pods = pods_of(system, namespace)
        if len(pods) != count or not all(pod_state(p)[1] for p in pods):
            return None
        return pods

    result: list[Obj] = await until(
        settled, timeout=timeout, what=f"{count} settled pods in {namespace}"
    )
    return result


def by_name(pods: Sequence[Obj]) -> dict[str, Obj]:
    return {p["metadata"]["name"]: p for p in pods}


def phase(pod: Obj) -> str:
    return str((pod.get("status") or {}).get("phase", ""))


def pending_message(pod: Obj) -> str:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return str(condition.get("message", ""))
    return ""


async def connected_bus(system: LocalSystem) -> Bus:
    """The system's own bus, once it is connected: checks that run right after a NATS server
    was killed read through it (a chaos seed whose last kill came a second before its checks
    failed on a read made while the bus still reconnected)."""
    bus = system.bus
    assert bus is not None
    await until(lambda: bus.connected, what="the NATS connection of tessera up back")
    return bus


async def record_of(system: LocalSystem, pod: Obj) -> AssignmentRecord | None:
    bus = await connected_bus(system)
    node = pod["spec"]["nodeName"]
    entry = await bus.kv_get(
        subjects.KV_ASSIGNMENTS, subjects.assignment_key(node, pod["metadata"]["uid"])
    )
    return codec.decode(entry.value, AssignmentRecord) if entry is not None else None


def envs_of(system: LocalSystem, pod: Obj) -> dict[str, dict[str, str]]:
    """Container -> the environment the simulated kubelet recorded for it."""
    kubelet = system.cluster.kubelets[pod["spec"]["nodeName"]]
    record = kubelet.pods.get(pod["metadata"]["uid"])
    envs: dict[str, dict[str, str]] = {}
    for container in record.containers if record else ():
        envs.setdefault(container.container, {}).update(container.envs)
    return envs


async def assert_exact(system: LocalSystem, pods: Sequence[Obj]) -> None:
    """Every Running pod: its record is allocated, and each container's recorded environment
    gives exactly that record's slices (and matches the pod's annotation too)."""
    problems: list[str] = []
    for pod in pods:
        if phase(pod) != "Running":
            continue
        record = await record_of(system, pod)
        name = pod["metadata"]["name"]
        if record is None:
            problems.append(f"{name}: Running without an assignment record")
            continue
        if record.state != "allocated" and any(c.gpus for c in record.containers):
            problems.append(f"{name}: record is {record.state}, not allocated")
        envs = envs_of(system, pod)
        decided = {c.container: c.gpus for c in record.containers}
        for container in pod["spec"]["containers"]:
            slices = [
                report.Slice(s.uuid, s.memory_mib, s.cores)
                for s in decided.get(container["name"], ())
            ]
            problem = report.container_problem(envs.get(container["name"], {}), slices)
            if problem:
                problems.append(f"{name}/{container['name']}: {problem}")
        problems.extend(
            report.mismatches(
                system.cluster.api.get(POD, pod["metadata"]["namespace"], name), _seen(system, pod)
            )
        )
    assert not problems, "\n".join(problems)
    assert not system.cluster.overcommits(), system.cluster.overcommits()


def _seen(system: LocalSystem, pod: Obj) -> report.PodSeen | None:
    return system.seen().get(pod["metadata"]["uid"])


def gpus_of(system: LocalSystem, pod: Obj) -> list[str]:
    """The GPU UUIDs the kubelet recorded for the pod, container by container."""
    uuids: list[str] = []
    for envs in envs_of(system, pod).values():
        uuids.extend(u for u in envs.get("NVIDIA_VISIBLE_DEVICES", "").split(",") if u)
    return uuids


async def clear(system: LocalSystem, namespace: str, timeout: float = 60.0) -> None:
    """Delete every pod of ``namespace``; wait until each is gone, its record released and its
    tenant's charge given back (a placer takes the charge off last: a test that came next and
    found it still there saw a pod of the same tenant wait for quota)."""
    pods = pods_of(system, namespace)
    for pod in pods:
        with contextlib.suppress(ApiError):  # gone already
            system.cluster.api.delete(POD, namespace, pod["metadata"]["name"])
    await until(lambda: not pods_of(system, namespace), timeout=timeout, what=f"{namespace} empty")
    for pod in pods:
        if not pod["spec"].get("nodeName"):
            continue

        async def released(pod: Obj = pod) -> bool:
            record = await record_of(system, pod)
            return record is None or record.state == "released"

        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not await released():
            assert loop.time() < deadline, f"record of {pod['metadata']['name']} not released"
            await asyncio.sleep(0.1)
    uids = {pod["metadata"]["uid"] for pod in pods}

    async def uncharged() -> bool:
        bus = await connected_bus(system)
        for key in await bus.kv_keys(subjects.KV_TENANTS):
            entry = await bus.kv_get(subjects.KV_TENANTS, key)
            ledger = codec.decode(entry.value, TenantLedger) if entry is not None else None
            if ledger is not None and any(c.pod_uid in uids for c in ledger.charges):
                return False
        return True

    await until(uncharged, timeout=timeout, what=f"the charges of {namespace}'s pods given back")


KUBECTL = Path(sys.executable).parent / "kubectl"


def kubectl(system: LocalSystem, *args: str, stdin: str | None = None) -> str:
    """The real kubectl against the running system's API; its stdout (it must succeed)."""
    result = subprocess.run(
        [str(KUBECTL), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "KUBECONFIG": str(system.kubeconfig), "NO_PROXY": "127.0.0.1"},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout
