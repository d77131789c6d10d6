"""Seed 002's order across two real ``tessera placer`` processes: the waiting board.

One node with one GPU, held by a blocker. A low-priority pod waits in placer 0 and a high-priority
pod in placer 1 (each made to receive its pod by pausing the other with SIGSTOP while it is
published). Then placer 1 is paused, the blocker deleted, and placer 0, which sees the GPU freed
and tries its own low pod, must place the high pod first, from the board, although another
replica holds it and cannot act. Once placer 1 runs again it finds the high pod placed and lets
its message go; the low pod keeps waiting.
"""

from __future__ import annotations

import asyncio
import functools
import json
import signal
import time
from pathlib import Path

import msgspec

from shared import codec, subjects
from shared.messages.pods import PodPending
from shared.messages.waiting import WaitingPod
from shared.runtime.nats import NatsBus
from tests.harness import kv
from tests.harness.nats import NatsServer
from tests.harness.wait import eventually
from tests.placer import wire
from tests.placer.conftest import http_get
from tests.placer.processes import ready, start, stop_all

PULL_EXPIRY_S = 1.5
"""A paused placer's last pull request expires on the server within its 1 s fetch timeout."""


until = functools.partial(eventually, timeout=45.0, interval=0.05)


async def holder_of(bus: NatsBus, uid: str) -> str | None:
    entry = await bus.kv_get(subjects.KV_WAITING, subjects.waiting_key(uid))
    return None if entry is None else codec.decode(entry.value, WaitingPod).holder


async def live_pods(bus: NatsBus) -> set[str]:
    return {r.pod_uid for r in (await wire.cluster_state(bus)).placements()}


async def test_a_replica_places_a_higher_pod_another_replica_holds_before_its_own(
    nats_server: NatsServer, bus: NatsBus, tmp_path: Path
) -> None:
    now = time.time()
    inventory = wire.inventory("n1", 1, at=now)
    await kv.put_inventory(bus, inventory)
    await kv.put_facts(bus, wire.facts("n1", at=now))

    def whole(uid: str, priority: int = 0) -> PodPending:
        pod = wire.pending(uid, memory_mib=None, cores=None)  # a whole GPU
        return msgspec.structs.replace(pod, priority=priority)

    options = ("--ack-wait-s", "30")
    placers = [await start(nats_server.url, 0, tmp_path, *options)]
    try:
        await until(lambda: ready(placers[0][1]), what="placer 0 ready")
        await wire.publish_pod(bus, whole("blocker"))
        await until(lambda: _has(bus, "blocker"), what="the blocker placed")
        await wire.publish_pod(bus, whole("low"))
        await until(lambda: _held(bus, "low", "placer-0"), what="low waiting in placer 0")

        placers.append(await start(nats_server.url, 1, tmp_path, *options))
        await until(lambda: ready(placers[1][1]), what="placer 1 ready")
        first, second = (process for process, _ in placers)
        first.send_signal(signal.SIGSTOP)
        await asyncio.sleep(PULL_EXPIRY_S)
        await wire.publish_pod(bus, whole("high", priority=1000))
        await until(lambda: _held(bus, "high", "placer-1"), what="high waiting in placer 1")

        second.send_signal(signal.SIGSTOP)
        first.send_signal(signal.SIGCONT)
        await asyncio.sleep(PULL_EXPIRY_S)
        await wire.delete_pod(bus, "blocker")
        await until(
            lambda: _placed_one_of(bus, {"high", "low"}), what="the freed GPU taken by a pod"
        )
        assert await live_pods(bus) == {"high"}, "the low pod took the GPU the high one waits for"
        second.send_signal(signal.SIGCONT)

        # Placer 1 sees the high pod placed and lets its message go; the board forgets it.
        async def released_by_its_holder() -> bool:
            _, answer = await http_get(placers[1][1], "/v1/pods/high")
            return "held_here" not in answer

        await until(released_by_its_holder, what="placer 1 letting the high pod go")
        await until(lambda: _gone(bus, "high"), what="the high pod off the board")
        assert await holder_of(bus, "low") == "placer-0"
        assert await live_pods(bus) == {"high"}
        state = await wire.cluster_state(bus)
        wire.check_invariants(state, {"n1": inventory})
        lines = [
            json.loads(line)
            for line in (tmp_path / "placer-0.log").read_text().splitlines()
            if '"placing a waiting pod first"' in line
        ]
        assert [(e["pod_uid"], e["holder"], e["ahead_of"]) for e in lines] == [
            ("high", "placer-1", "low")
        ]
    finally:
        await stop_all([process for process, _ in placers])


async def _has(bus: NatsBus, uid: str) -> bool:
    return uid in await live_pods(bus)


async def _held(bus: NatsBus, uid: str, holder: str) -> bool:
    found = await holder_of(bus, uid)
    assert found in (None, holder), f"{uid} is held by {found}, not {holder}"
    return found == holder


async def _placed_one_of(bus: NatsBus, uids: set[str]) -> bool:
    return bool(await live_pods(bus) & uids)


async def _gone(bus: NatsBus, uid: str) -> bool:
    return await holder_of(bus, uid) is None
