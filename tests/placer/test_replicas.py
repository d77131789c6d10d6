"""Three real ``tessera placer`` processes share the work; one is SIGKILLed; nothing is lost.

The test plays the inventory and the binder: it writes 100 nodes' inventory and node facts into KV
and publishes 1,000 pending pods (more than fit) into the stream. While the placers work, one of
them is killed with SIGKILL. Afterwards, read from KV and the placements stream: every pod has
exactly one live assignment record or was rejected, no GPU is over-committed (memory, cores,
logical devices, exclusivity), every record is booked and every booking recorded.

A tenth of the pods belong to tenant ``capped``, whose quota (``CAPPED_GPUS`` shares) is far below
what it asks for: the three replicas decide its pods at the same moment, each on its own view, and
its live records must still never hold more than the quota, exactly as its usage entry in
``tessera-tenants`` (every charge booked, every live record charged) says. Once settled nothing is
left over: the tenant's charges are exactly what its live records hold (the killed replica's
unfinished charges given back), and no pod waits that fits somewhere now.

The same runs with the nodes in three pools (``--pools 3``), one per replica: the killed
replica's pool must be taken over by a survivor within seconds, and the guarantees above are the
same, since a pool only says where a replica looks first.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import random
import signal
import time
from pathlib import Path

import aiohttp
import msgspec
import nats
import pytest
from nats.aio.msg import Msg as NatsMsg

from shared import codec, subjects
from shared.messages.pods import PodPending
from shared.messages.pools import PoolLease
from shared.runtime.nats import NatsBus
from tests.harness import kv
from tests.harness.nats import NatsServer
from tests.harness.wait import eventually
from tests.placer import wire
from tests.placer.conftest import http_get, rejections
from tests.placer.processes import ready, start, stop_all

NODES = [f"node-{i:03d}.rack-{i // 20}" for i in range(100)]
GPUS = 4
SLOTS = 12
"""Logical devices per node (3 per GPU): some GPUs run out of devices before memory."""
PODS = 1000
CAPPED = "capped"
CAPPED_GPUS = 24
TENANCY = {"quotas": [{"tenant": CAPPED, "gpus": CAPPED_GPUS}]}


def workload(seed: int = 7) -> list[PodPending]:
    """Shares of one GPU, whole GPUs and two-GPU pods: more than 100 x 4 GPUs hold; every
    tenth pod is tenant ``capped``'s."""
    rng = random.Random(seed)
    pods = []
    for i in range(PODS):
        kind = rng.random()
        uid = f"pod-{i:04d}"
        ns = CAPPED if i % 10 == 0 else "ml"
        if kind < 0.65:
            memory = rng.choice((2048, 4096, 6144))
            pod = wire.pending(uid, memory_mib=memory, cores=20, namespace=ns)
        elif kind < 0.85:
            pod = wire.pending(uid, memory_mib=None, cores=None, namespace=ns)  # a whole GPU
        elif kind < 0.99:
            pod = wire.pending(uid, shares=2, memory_mib=8192, cores=40, namespace=ns)
        else:  # fits nowhere
            pod = wire.pending(uid, shares=GPUS + 1, memory_mib=1024, cores=10, namespace=ns)
        pods.append(msgspec.structs.replace(pod, priority=rng.choice((0, 0, 100))))
    return pods


async def left_over(bus: NatsBus, ports: list[int], uids: set[str]) -> str | None:
    """None when tenant ``CAPPED``'s charges are exactly what its live records hold and every pod
    not placed fits on no node now (as the replicas serving ``ports`` see it); else what is not."""
    state = await wire.cluster_state(bus)
    held, _ = wire.record_shares([r for r in state.placements() if r.namespace == CAPPED])
    ledger = state.tenants.get(CAPPED)
    charged = sum(c.gpus for c in ledger.charges) if ledger else 0
    if charged != held:
        return f"{CAPPED}: {charged} GPU shares charged, live records hold {held}"
    for uid in sorted(uids - {r.pod_uid for r in state.placements()}):
        for port in ports:  # the replica that holds or decided the pod can judge it
            _, answer = await http_get(port, f"/v1/pods/{uid}")
            if "nodes_total" in answer:
                break
        else:
            return f"{uid}: no replica knows it"
        if answer["nodes_fitting"]:
            return f"{uid} waits, yet fits on {answer['nodes_fitting']} nodes: {answer}"
    return None


async def pool_holders(bus: NatsBus, pools: int) -> dict[int, str]:
    """Pool -> the replica whose lease on it is in KV now."""
    holders = {}
    for pool in range(pools):
        entry = await bus.kv_get(subjects.KV_POOLS, subjects.pool_key(pool))
        if entry is None:
            continue
        with contextlib.suppress(codec.DecodeError):  # a forged entry holds nothing
            holders[pool] = codec.decode(entry.value, PoolLease).holder
    return holders


@pytest.mark.timeout(300)  # the phases' own budgets below add up to less, each named on failure
@pytest.mark.parametrize("pools", [1, 3])
async def test_three_placers_one_killed_place_every_pod_once_and_over_commit_nothing(
    nats_server: NatsServer, bus: NatsBus, tmp_path: Path, pools: int
) -> None:
    now = time.time()
    inventories = {node: wire.inventory(node, GPUS, at=now) for node in NODES}
    for node in NODES:
        await kv.put_inventory(bus, inventories[node])
        await kv.put_facts(bus, wire.facts(node, slots=SLOTS, at=now))
    tenancy = tmp_path / "tenancy.json"
    tenancy.write_text(json.dumps(TENANCY))
    options: tuple[str, ...] = ("--tenancy-file", str(tenancy))
    if pools > 1:
        options = (*options, "--pools", str(pools), "--pool-lease-s", "1.5")
    placers = [await start(nats_server.url, n, tmp_path, *options) for n in range(3)]
    try:
        for number, (_, port) in enumerate(placers):
            await eventually(
                functools.partial(ready, port), timeout=60, what=f"placer {number} ready"
            )
        if pools > 1:  # the first replica up took every pool; the others' rounds share them out

            async def shared_out() -> bool:
                held = await pool_holders(bus, pools)
                return set(held.values()) == {"placer-0", "placer-1", "placer-2"}

            await eventually(shared_out, timeout=20, interval=0.1, what="one pool per replica")
        pods = workload()
        for start_at in range(0, len(pods), 100):
            await asyncio.gather(
                *(wire.publish_pod(bus, p) for p in pods[start_at : start_at + 100])
            )

        victim, _ = placers[1]

        async def many_claimed() -> bool:
            return await wire.claimed(bus) >= 300

        await eventually(many_claimed, timeout=60, interval=0.05, what="300 pods claimed")
        victim.send_signal(signal.SIGKILL)
        await victim.wait()
        killed_at = time.monotonic()
        if pools > 1:

            async def taken_over() -> bool:
                held = await pool_holders(bus, pools)
                return len(held) == pools and "placer-1" not in held.values()

            await eventually(
                taken_over, timeout=15, interval=0.1, what="the killed replica's pool taken over"
            )
            took = time.monotonic() - killed_at
            assert took < 3 * 1.5 + 1, f"took {took:.1f} s over a lease of 1.5 s"

        uids = {p.uid for p in pods}

        undecided: set[str] = set()

        async def all_decided() -> bool:
            recorded = {r.pod_uid for r in (await wire.cluster_state(bus)).placements()}
            undecided.clear()
            undecided.update(uids - recorded - {r.pod_uid for r in await rejections(bus)})
            return not undecided

        await eventually(
            all_decided,
            timeout=120,
            interval=0.5,
            what=lambda: f"every pod placed or rejected ({len(undecided)} neither)",
        )
        refusals = await rejections(bus)
        rejected = {r.pod_uid for r in refusals}
        # A redelivered duplicate may still be committing (and giving its booking back).
        state = await wire.settled_state(bus, inventories, slots=dict.fromkeys(NODES, SLOTS))
        recorded = {r.pod_uid for r in state.placements()}
        assert len(recorded) == len(state.placements())
        assert recorded | rejected >= uids
        assert 500 < len(recorded) < PODS, f"{len(recorded)} placed: the cluster must fill up"
        wire.check_quotas(state, {CAPPED: (CAPPED_GPUS, None)})
        wire.check_charges(state, {CAPPED: (CAPPED_GPUS, None)})
        assert any(r.namespace == CAPPED and "GPU quota exceeded" in r.message for r in refusals), (
            "the quota never refused a pod"
        )
        # Whether the tenant fills its quota before the other tenant fills the cluster depends on
        # the race (a killed replica's charges hold quota until repaired); what must hold is that
        # nothing is left over: no charge without its live record, no pod waiting while it fits.
        survivors = [port for number, (_, port) in enumerate(placers) if number != 1]
        left: list[str | None] = [None]

        async def nothing_left() -> bool:
            left[0] = await left_over(bus, survivors, uids)
            return left[0] is None

        # A waiting pod is tried again within BACKOFF_MAX_S.
        await eventually(
            nothing_left, timeout=40, interval=0.5, what=lambda: f"nothing left over: {left[0]}"
        )
        logged = [
            json.loads(line)
            for line in (tmp_path / "placer-0.log").read_text().splitlines()
            if '"pod placed"' in line
        ]
        assert logged, "one structured line per decision"
        assert {"pod", "pod_uid", "node", "gpus", "score", "latency_ms", "commit"} <= set(logged[0])
    finally:
        codes = await stop_all([process for process, _ in placers])
        for number, code in enumerate(codes):
            if number != 1:
                assert code == 0, (tmp_path / f"placer-{number}.log").read_text()[-3000:]


@pytest.mark.timeout(120)
async def test_a_standby_takes_over_a_killed_replicas_pool_and_places_its_pods(
    nats_server: NatsServer, bus: NatsBus, tmp_path: Path
) -> None:
    """Three replicas, two pools: two replicas hold one pool each and the third stands by,
    taking no pods. When a holder is SIGKILLed, the standby holds its pool within a few lease
    times, and the pods that come next are placed on every node, without over-commit."""
    now = time.time()
    nodes = NODES[:20]
    inventories = {node: wire.inventory(node, GPUS, at=now) for node in nodes}
    for node in nodes:
        await kv.put_inventory(bus, inventories[node])
        await kv.put_facts(bus, wire.facts(node, slots=SLOTS, at=now))
    options = ("--pools", "2", "--pool-lease-s", "1.5")
    placers = [await start(nats_server.url, n, tmp_path, *options) for n in range(3)]
    try:
        for number, (_, port) in enumerate(placers):
            await eventually(
                functools.partial(ready, port), timeout=60, what=f"placer {number} ready"
            )
        holders: list[dict[int, str]] = [{}]

        async def shared_out() -> bool:
            holders[0] = await pool_holders(bus, 2)
            return len(set(holders[0].values())) == 2

        await eventually(shared_out, timeout=20, interval=0.1, what="one pool per two replicas")
        (standby,) = {"placer-0", "placer-1", "placer-2"} - set(holders[0].values())
        first = [wire.pending(f"first-{i:02d}", memory_mib=4096, cores=10) for i in range(40)]
        for pod in first:
            await wire.publish_pod(bus, pod)

        async def placed(uids: set[str]) -> bool:
            state = await wire.cluster_state(bus)
            return uids <= {r.pod_uid for r in state.placements()}

        await eventually(
            functools.partial(placed, {p.uid for p in first}), timeout=30, what="first pods"
        )
        state = await wire.cluster_state(bus)
        assert standby not in {r.placer_id for r in state.placements()}, "a standby decided"
        # The cluster's statistics come from the holder of pool 0 alone, never from a standby.
        assert await bus.kv_get(subjects.KV_STATS, subjects.stats_key(standby)) is None
        assert await bus.kv_get(subjects.KV_STATS, subjects.stats_key(holders[0][0])) is not None

        victim_id = holders[0][0]
        victim = placers[int(victim_id.removeprefix("placer-"))][0]
        victim.send_signal(signal.SIGKILL)
        await victim.wait()
        killed_at = time.monotonic()

        async def taken_over() -> bool:
            return (await pool_holders(bus, 2)).get(0) == standby

        await eventually(taken_over, timeout=15, interval=0.1, what="the standby holds pool 0")
        took = time.monotonic() - killed_at
        assert took < 3 * 1.5 + 1, f"took {took:.1f} s over a lease of 1.5 s"

        then = [wire.pending(f"then-{i:02d}", memory_mib=4096, cores=10) for i in range(40)]
        for pod in then:
            await wire.publish_pod(bus, pod)
        await eventually(
            functools.partial(placed, {p.uid for p in then}), timeout=30, what="pods after"
        )
        state = await wire.settled_state(bus, inventories, slots=dict.fromkeys(nodes, SLOTS))
        by_standby = [r for r in state.placements() if r.placer_id == standby]
        assert by_standby, "the standby placed nothing after taking over"
        assert {r.pod_uid for r in state.placements()} >= {p.uid for p in first + then}
    finally:
        await stop_all([process for process, _ in placers])


@pytest.mark.timeout(60)
async def test_lease_rounds_watch_the_pools_bucket_rather_than_list_it(
    nats_server: NatsServer, bus: NatsBus, tmp_path: Path
) -> None:
    """A replica renews its leases every third of the lease time (here every 0.5 s) from what it
    watches of the bucket: listing it made and deleted a consumer on the server every round
    (on a JetStream cluster, a change of the cluster's metadata each)."""
    client = await nats.connect(nats_server.url)
    made: list[str] = []

    async def count(msg: NatsMsg) -> None:
        made.append(msg.subject)

    stream = f"KV_{subjects.KV_POOLS}"
    for subject in (f"$JS.API.CONSUMER.CREATE.{stream}", f"$JS.API.CONSUMER.CREATE.{stream}.>"):
        await client.subscribe(subject, cb=count)
    process, port = await start(
        nats_server.url, 0, tmp_path, "--pools", "2", "--pool-lease-s", "1.5"
    )
    try:
        await eventually(functools.partial(ready, port), timeout=30, what="placer ready")

        async def holds_both() -> bool:
            return await pool_holders(bus, 2) == {0: "placer-0", 1: "placer-0"}

        await eventually(holds_both, timeout=15, interval=0.1, what="both pools held")
        member = subjects.pool_member_key("placer-0")
        before = await bus.kv_get(subjects.KV_POOLS, member)
        made.clear()
        await asyncio.sleep(2.0)
        after = await bus.kv_get(subjects.KV_POOLS, member)
        assert before is not None and after is not None
        assert after.revision > before.revision  # rounds went on: the member entry was renewed
        assert await holds_both()
        assert made == []
    finally:
        await stop_all([process])
        await client.close()


@pytest.mark.timeout(60)
async def test_forged_pool_leases_are_rejected_counted_and_taken_over(
    nats_server: NatsServer, bus: NatsBus, tmp_path: Path
) -> None:
    """A lease entry that does not decode, and one naming another pool than its key, hold no
    pool: a replica rejects each once (counted, with a reason), then takes both pools over by
    compare-and-set, and places pods. A lease written by a replica split into another number of
    pools is named in a warning."""
    await bus.kv_put(subjects.KV_POOLS, subjects.pool_key(0), b"not a lease")
    forged = PoolLease(pool=5, holder="someone", renewed_at=time.time() + 3600, lease_s=3600)
    await bus.kv_put(subjects.KV_POOLS, subjects.pool_key(1), codec.encode(forged))
    other = PoolLease(pool=2, holder="three-pools", renewed_at=0.0, lease_s=3600, pools=3)
    await bus.kv_put(subjects.KV_POOLS, subjects.pool_key(2), codec.encode(other))
    now = time.time()
    for node in NODES[:4]:
        await kv.put_inventory(bus, wire.inventory(node, GPUS, at=now))
        await kv.put_facts(bus, wire.facts(node, slots=SLOTS, at=now))
    process, port = await start(nats_server.url, 0, tmp_path, "--pools", "2")
    try:
        await eventually(functools.partial(ready, port), timeout=30, what="placer ready")

        async def holds_both() -> bool:
            return await pool_holders(bus, 2) == {0: "placer-0", 1: "placer-0"}

        await eventually(holds_both, timeout=15, interval=0.1, what="both pools taken over")
        pod = wire.pending("after-forgery", memory_mib=2048, cores=10)
        await wire.publish_pod(bus, pod)

        async def placed() -> bool:
            state = await wire.cluster_state(bus)
            return pod.uid in {r.pod_uid for r in state.placements()}

        await eventually(placed, timeout=15, what="the pod placed")
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{port}/metrics") as response,
        ):
            metrics = await response.text()
        rejected = [
            line
            for line in metrics.splitlines()
            if line.startswith("tessera_messages_rejected_total") and 'family="pools"' in line
        ]
        assert sorted(rejected) == [
            'tessera_messages_rejected_total{family="pools",kind="decode"} 1.0',
            'tessera_messages_rejected_total{family="pools",kind="validate"} 1.0',
        ], rejected
        warned = [
            json.loads(line)
            for line in (tmp_path / "placer-0.log").read_text().splitlines()
            if "another number of node pools" in line
        ]
        assert [(w["holder"], w["its_pools"], w["pools"]) for w in warned] == [
            ("three-pools", 3, 2)
        ], "warned once, naming the other replica and both numbers"
    finally:
        assert await stop_all([process]) == [0]
