"""The placer service end to end: real ``tessera placer`` processes over a real nats-server.

    .venv/bin/python benchmarks/placer_service.py [--nodes 1000] [--gpus 8] [--rate 500]
        [--seconds 10] [--replicas 1,3] [--burst 3000] [--rss-nodes 10000] [--quota-share 0]
        [--spread-share 0] [--pools 1] [--nats-servers 1] [--hand-off-s 0.25]

For each replica count: a fresh nats-server; every node's inventory and node facts written into KV
(as the inventory and the binder do); that many placer processes started and waited for (ready =
everything loaded); then pods published on ``tessera.pods.pending`` through JetStream, the way the
binder publishes them.

- **Latency at a rate**: pods paced at ``--rate`` per second for ``--seconds``; for each pod, the
  time from the start of its publish to the arrival of its claim (a KV watch of the pods'
  claims in ``tessera-ledger``: the decision is committed by then, and the binder sees it).
  The first second is warm-up and not counted. The placers' own histogram (message received to
  decision published) is read from ``/metrics`` as well, and so is their event loops' lag during
  the rate (``tessera_event_loop_lag_seconds``, sampled every 0.25 s): a loop held up, by a full
  garbage collection or a long computation, holds up every pod in flight. The NATS messages each
  replica sent and received per pod at the rate come from nats-server's ``/connz``: what a
  replica pays for following the others' writes.
- **Saturation**: ``--burst`` pods published at once; decisions per second from the first publish
  to the last decision, and the CPU each process took per pod from the first publish to a second
  after the last decision (the replicas' idle upkeep weighs less in it than at the rate).
- **The hand-off**: ``--hand-off-s`` after each claim is written the driver writes the pod's
  record ``allocated``, in one create, as the binder and the device plugin would between them
  (its CPU is the driver's; it follows the claims with a batched watch). A placer keeps a pod
  whose record is not yet allocated off nodes where it would wait at the binder's gate; with no
  record ever written, every node would soon look queued.
- **Memory**: one placer with ``--rss-nodes`` nodes of ``--gpus`` GPUs loaded; its resident set
  size (``VmRSS``) once ready, and again after placing ``--burst`` pods on them.

The pods are GPU shares (2-8 GiB, 10-40 % of the SMs) and a few whole GPUs; the cluster never
fills, so every pod is placed and nothing waits. ``--quota-share F`` puts that fraction of the pods
in a tenant with a quota (large enough never to refuse one): each of their commits also charges the
tenant's one usage entry by compare-and-set, which is what exact quotas cost.
``--spread-share F`` gives that fraction of the pods a topology spread constraint over
``kubernetes.io/hostname`` (``maxSkew`` 1, ``DoNotSchedule``, one app's pods), which the placer
judges node by node, counting the app's pods on every node: what such a pod costs beside the
others, which the node-aware rules leave alone (every node carries the hostname label, as a
kubelet's node does). ``--pools N``
starts the placers with node pools (``--pools 0``: as many pools as replicas), and waits until
the pools are shared out before sending pods. ``--nats-servers 3`` runs them over a three-server
JetStream cluster on loopback, every stream and bucket with three replicas (each write then waits
for a quorum: the round trip a deployment with replicated NATS pays). Prints what it measures,
target met or not.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import os
import platform
import random
import re
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402

from shared import codec, subjects  # noqa: E402
from shared.commits import record_of  # noqa: E402
from shared.messages.assignments import settled  # noqa: E402
from shared.messages.constraints import (  # noqa: E402
    Constraints,
    LabelSelector,
    SpreadConstraint,
)
from shared.messages.inventory import GpuTelemetry, NodeInventory  # noqa: E402
from shared.messages.ledger import Booking, PodClaim  # noqa: E402
from shared.messages.nodes import NodeFacts  # noqa: E402
from shared.messages.pods import ContainerRequest, PodPending  # noqa: E402
from shared.runtime.nats import NatsBus  # noqa: E402
from tests.harness.nats import (  # noqa: E402
    NatsCluster,
    NatsServer,
    connect_when_ready,
    environment_without_proxies,
)
from tests.harness.procstat import context_switches, cpu_seconds  # noqa: E402
from tests.harness.store import mark_restored  # noqa: E402

GPU_MIB = 81_920
LOOP_LAG = "tessera_event_loop_lag_seconds"
BURST_SETTLE_S = 1.0
"""After a burst's last decision, how long the placers' CPU is still counted (idle upkeep too)."""

PROFILE = bool(os.environ.get("PLACER_BENCH_PROFILE"))
"""Run the placers under cProfile (``placer-N.prof`` beside their logs) to see where time goes."""


def node_name(i: int) -> str:
    return f"gpu-{i:05d}.zone-{i % 3}"


def inventory(node: str, gpus: int, now: float) -> NodeInventory:
    return NodeInventory(
        node=node,
        gpus=tuple(
            GpuTelemetry(
                uuid=f"GPU-{node}-{i}",
                index=i,
                model="A100-SXM4-80GB",
                memory_total_mib=GPU_MIB,
                memory_used_mib=0,
                memory_free_mib=GPU_MIB,
                numa_node=i // 4,
            )
            for i in range(gpus)
        ),
        observed_at=now,
        sequence=1,
        backend="fake",
    )


def facts(node: str, now: float) -> NodeFacts:
    return NodeFacts(
        node=node,
        cpu_allocatable_milli=128_000,
        memory_allocatable_mib=1024 * 1024,
        labels={"nvidia.com/gpu.product": "A100-SXM4-80GB", "kubernetes.io/hostname": node},
        observed_at=now,
    )


QUOTA_TENANT = "bench-quota"
SPREAD_APP = {"app": "bench-spread"}
SPREAD = Constraints(
    spread=(
        SpreadConstraint(
            max_skew=1,
            topology_key="kubernetes.io/hostname",
            when_unsatisfiable="DoNotSchedule",
            selector=LabelSelector(match_labels=tuple(SPREAD_APP.items())),
        ),
    )
)


def pod(
    n: int, rng: random.Random, quota_share: float = 0.0, spread_share: float = 0.0
) -> PodPending:
    whole = rng.random() < 0.1
    quoted = quota_share > 0 and rng.random() < quota_share
    spread = spread_share > 0 and rng.random() < spread_share
    return PodPending(
        uid=f"bench-{n:06d}",
        namespace=QUOTA_TENANT if quoted else "bench",
        name=f"pod-{n}",
        containers=(
            ContainerRequest(
                name="main",
                gpu_shares=1,
                gpu_memory_mib=None if whole else rng.choice((2048, 4096, 8192)),
                gpu_cores=None if whole else rng.choice((10, 20, 30, 40)),
                cpu_milli=rng.choice((500, 1000, 2000)),
                memory_mib=rng.choice((1024, 4096)),
                resources={"tessera.dev/gpu": 1},
            ),
        ),
        created_at=time.time(),
        resource_version="1",
        labels=dict(SPREAD_APP) if spread else {},
        constraints=SPREAD if spread else None,
    )


async def load_cluster(bus: NatsBus, nodes: int, gpus: int) -> None:
    now = time.time()
    for first in range(0, nodes, 250):
        writes = []
        for i in range(first, min(nodes, first + 250)):
            name = node_name(i)
            token = subjects.node_token(name)
            writes.append(
                bus.kv_put(subjects.KV_INVENTORY, token, codec.encode(inventory(name, gpus, now)))
            )
            writes.append(bus.kv_put(subjects.KV_NODES, token, codec.encode(facts(name, now))))
        await asyncio.gather(*writes)


@dataclass
class Placer:
    process: asyncio.subprocess.Process
    port: int
    log: Path


async def start_placer(url: str, number: int, directory: Path, *options: str) -> Placer:
    log = directory / f"placer-{number}.log"
    with log.open("wb") as stderr:
        profiler = ["-m", "cProfile", "-o", str(directory / f"placer-{number}.prof")]
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            *(profiler if PROFILE else []),
            "-m",
            "tessera.cli",
            "placer",
            "--nats-url",
            url,
            "--http-host",
            "127.0.0.1",
            "--http-port",
            "0",
            "--placer-id",
            f"bench-{number}",
            "--inventory-stale-s",
            "3600",
            *options,
            cwd=ROOT,
            env=environment_without_proxies(),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=stderr,
        )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for line in log.read_text().splitlines():
            if '"service starting"' in line:
                return Placer(process, int(json.loads(line)["http_port"]), log)
        if process.returncode is not None:
            raise RuntimeError(log.read_text()[-2000:])
        await asyncio.sleep(0.05)
    raise RuntimeError(f"placer {number} did not start")


async def http(port: int, path: str) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}{path}") as response,
    ):
        return response.status, await response.text()


async def wait_ready(placers: list[Placer], timeout: float = 600) -> float:
    started = time.monotonic()
    for placer in placers:
        while True:
            try:
                status, _ = await http(placer.port, "/readyz")
                if status == 200:
                    break
            except aiohttp.ClientError:
                pass
            if placer.process.returncode is not None:
                raise RuntimeError(placer.log.read_text()[-2000:])
            if time.monotonic() - started > timeout:
                raise RuntimeError("placers not ready")
            await asyncio.sleep(0.1)
    return time.monotonic() - started


async def pools_held(placer: Placer) -> int:
    """The node pools ``placer`` holds (its ``tessera_placer_pools_held`` gauge)."""
    _, text = await http(placer.port, "/metrics")
    found = re.search(r"^tessera_placer_pools_held (\S+)$", text, re.MULTILINE)
    return int(float(found.group(1))) if found else 0


async def wait_pools(placers: list[Placer], pools: int, timeout: float = 60) -> float:
    """Wait until the pools are shared out: all held, none by more replicas than needed."""
    started = time.monotonic()
    most = -(-pools // len(placers))
    while True:
        held = [await pools_held(p) for p in placers]
        if sum(held) == pools and max(held) <= most:
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise RuntimeError(f"pools not shared out: {held}")
        await asyncio.sleep(0.2)


async def stop(placers: list[Placer]) -> None:
    for placer in placers:
        if placer.process.returncode is None:
            placer.process.send_signal(signal.SIGTERM)
    for placer in placers:
        try:
            await asyncio.wait_for(placer.process.wait(), 30)
        except TimeoutError:
            placer.process.kill()
            await placer.process.wait()


@dataclass(frozen=True)
class Used:
    """What the measured processes have used so far: CPU seconds per kind of process (placers,
    nats-server, driver), and the placers' context switches."""

    cpu_s: dict[str, float]
    switches: int

    @classmethod
    def now(cls, pids: dict[str, list[int]]) -> Used:
        return cls(
            cpu_s={kind: sum(map(cpu_seconds, ps)) for kind, ps in pids.items()},
            switches=sum(map(context_switches, pids["placers"])),
        )

    def per_pod(self, before: Used, pods: int, replicas: int) -> tuple[dict[str, float], float]:
        """Since ``before``: CPU ms per pod per kind, and context switches per pod per replica."""
        cpu = {kind: (s - before.cpu_s[kind]) * 1000 / pods for kind, s in self.cpu_s.items()}
        return cpu, (self.switches - before.switches) / pods / replicas


def memory_mib(pid: int) -> dict[str, float]:
    """Process ``pid``'s ``VmRSS`` (resident now) and ``VmHWM`` (the peak resident so far), MiB."""
    found = {"VmRSS": float("nan"), "VmHWM": float("nan")}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key = line.split(":", 1)[0]
        if key in found:
            found[key] = int(line.split()[1]) / 1024
    return found


def rss_mib(pid: int) -> float:
    return memory_mib(pid)["VmRSS"]


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


@dataclass
class Clocked:
    sent: dict[str, float] = field(default_factory=dict)
    decided: dict[str, float] = field(default_factory=dict)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    expected: int = 0


async def follow_decisions(
    bus: NatsBus, clocked: Clocked, pods: list[PodPending]
) -> asyncio.Task[None]:
    """Note when the claim of each of ``pods`` arrives (its commit is complete then), until
    cancelled; returns once the watch is following."""
    wanted = {p.uid for p in pods}
    following = asyncio.Event()

    async def follow() -> None:
        async for entry in bus.kv_watch(subjects.KV_CLAIMS, subjects.CLAIM_KEYS):
            if entry is None:
                following.set()
                continue
            uid = subjects.claim_uid(entry.key)
            if entry.deleted or uid not in wanted:
                continue
            clocked.decided.setdefault(uid, time.perf_counter())
            if len(clocked.decided) >= clocked.expected:
                clocked.done.set()

    task = asyncio.create_task(follow())
    await asyncio.wait_for(following.wait(), 30)
    return task


class HandOff:
    """What the binder and the device plugin do to a placement, in one write: ``after_s`` after
    the pod's claim is written (bind, kubelet, Allocate), its record created ``allocated``. The
    placers then stop counting the pod as queued at the binder's gate, as they do in a whole
    system; with no record ever written, every node would look queued and each decision would
    try node after node (``decider._decide_in``). The claims come from a batched watch, so the
    stand-in costs the driver a delivery per claim and one create per pod."""

    def __init__(self, bus: NatsBus, after_s: float) -> None:
        self._bus = bus
        self._after_s = after_s
        self._due: list[tuple[float, str, Booking]] = []
        self._idle = asyncio.Event()
        self._idle.set()
        self._tasks: list[asyncio.Task[None]] = []
        self.written = 0
        """Records marked allocated."""

    def start(self) -> None:
        """Follow and write in the background (nothing, for ``after_s`` below 0)."""
        if self._after_s >= 0:
            self._tasks = [asyncio.create_task(self._follow()), asyncio.create_task(self._write())]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def settled(self) -> None:
        """Wait until every record seen so far is handed off."""
        await self._idle.wait()

    async def _follow(self) -> None:
        watch = self._bus.kv_watch(subjects.KV_CLAIMS, subjects.CLAIM_KEYS, batch_s=0.05)
        async for entry in watch:
            if entry is None or entry.deleted:
                continue
            claim = codec.decode(entry.value, PodClaim)
            if claim.state == "placed" and claim.booking is not None:
                when = time.monotonic() + self._after_s
                heapq.heappush(self._due, (when, claim.pod_uid, claim.booking))
                self._idle.clear()

    async def _write(self) -> None:
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            while self._due and self._due[0][0] <= now:
                _, uid, booking = heapq.heappop(self._due)
                record = settled(record_of(booking, bound_at=time.time()), now=time.time())
                key = subjects.assignment_key(booking.node, uid)
                # A write that lost found the key taken (a fence): nothing to hand off.
                if await self._bus.kv_create(subjects.KV_ASSIGNMENTS, key, codec.encode(record)):
                    self.written += 1
            if not self._due:
                self._idle.set()


async def publish(bus: NatsBus, message: PodPending, clocked: Clocked) -> None:
    clocked.sent[message.uid] = time.perf_counter()
    await bus.js_publish(
        subjects.PODS_PENDING,
        codec.encode(message),
        msg_id=f"pending.{message.uid}.{message.resource_version}",
    )


async def histogram(
    placers: list[Placer], name: str = "tessera_placer_decision_seconds"
) -> dict[float, float]:
    """Summed cumulative buckets of histogram ``name`` over the placers."""
    buckets: dict[float, float] = {}
    for placer in placers:
        _, text = await http(placer.port, "/metrics")
        for line in text.splitlines():
            found = re.match(rf'{name}_bucket\{{le="([^"]+)"\}} (\S+)', line)
            if found:
                le = float(found.group(1))
                buckets[le] = buckets.get(le, 0.0) + float(found.group(2))
    return buckets


async def placer_messages(servers: list[NatsServer]) -> tuple[float, float]:
    """Messages the placers' connections have sent and received so far (each nats-server's
    ``/connz``: ``in_msgs`` is what a client sent, ``out_msgs`` what it was sent)."""
    placers = []
    for server in servers:
        port = int(server.monitoring_url.rsplit(":", 1)[1])
        _, text = await http(port, "/connz?limit=1024")
        placers += [c for c in json.loads(text)["connections"] if c.get("name") == "tessera-placer"]
    return sum(c["in_msgs"] for c in placers), sum(c["out_msgs"] for c in placers)


def nats(args: argparse.Namespace) -> NatsServer | NatsCluster:
    """One nats-server, or a JetStream cluster of ``--nats-servers`` (streams replicated on
    all of them), serving monitoring endpoints."""
    if args.nats_servers == 1:
        return NatsServer(monitoring=True)
    return NatsCluster(args.nats_servers, monitoring=True)


def servers_of(nats: NatsServer | NatsCluster) -> list[NatsServer]:
    return nats.servers if isinstance(nats, NatsCluster) else [nats]


async def counter_sum(placers: list[Placer], name: str) -> float:
    """A counter summed over its labels and the placers."""
    total = 0.0
    for placer in placers:
        _, text = await http(placer.port, "/metrics")
        for line in text.splitlines():
            if re.match(rf"{name}(\{{.*\}})? ", line):
                total += float(line.rsplit(" ", 1)[1])
    return total


def since(after: dict[float, float], before: dict[float, float]) -> dict[float, float]:
    """The observations a cumulative histogram gained between two reads."""
    return {le: count - before.get(le, 0.0) for le, count in after.items()}


def bucket_quantile(buckets: dict[float, float], fraction: float) -> str:
    total = buckets.get(float("inf"), 0.0)
    if not total:
        return "-"
    for le in sorted(buckets):
        if buckets[le] >= fraction * total:
            return f"<= {le * 1000:g} ms" if le != float("inf") else "> 5 s"
    return "-"


async def run_cluster(
    replicas: int, args: argparse.Namespace, directory: Path
) -> dict[str, object]:
    with nats(args) as server:
        bus = await connect_when_ready(server.url, name="bench-driver", replicas=args.nats_servers)
        await mark_restored(bus)  # no binder runs here: the store holds every placement
        try:
            await load_cluster(bus, args.nodes, args.gpus)
            options: tuple[str, ...] = ("--nats-replicas", str(args.nats_servers))
            if args.quota_share:
                tenancy = directory / "tenancy.json"
                quota = {"tenant": QUOTA_TENANT, "gpus": 10**9}
                tenancy.write_text(json.dumps({"quotas": [quota]}))
                options = ("--tenancy-file", str(tenancy))
            pools = replicas if args.pools == 0 else args.pools
            if pools > 1:
                options = (*options, "--pools", str(pools))
            placers = [
                await start_placer(server.url, n, directory, *options) for n in range(replicas)
            ]
            hand_off = HandOff(bus, args.hand_off_s)
            hand_off.start()
            followers: list[asyncio.Task[None]] = []
            try:
                ready_s = await wait_ready(placers)
                if pools > 1:
                    await wait_pools(placers, pools)
                rng = random.Random(replicas)
                # Latency at a fixed rate.
                count = int(args.rate * args.seconds)
                clocked = Clocked(expected=count)
                pods = [pod(n, rng, args.quota_share, args.spread_share) for n in range(count)]
                followers.append(await follow_decisions(bus, clocked, pods))
                tasks = []
                pids = {
                    "placers": [p.process.pid for p in placers],
                    "nats-server": [s.pid for s in servers_of(server)],
                    "driver": [os.getpid()],
                }
                used_before = Used.now(pids)
                messages_before = await placer_messages(servers_of(server))
                lag_before = await histogram(placers, LOOP_LAG)
                start = time.perf_counter()
                for n, message in enumerate(pods):
                    delay = start + n / args.rate - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    tasks.append(asyncio.create_task(publish(bus, message, clocked)))
                await asyncio.gather(*tasks)
                await asyncio.wait_for(clocked.done.wait(), 120)
                warm = set(p.uid for p in pods[: int(args.rate)])
                latencies = [
                    (clocked.decided[uid] - clocked.sent[uid]) * 1000
                    for uid in clocked.decided
                    if uid not in warm
                ]
                achieved = count / (time.perf_counter() - start)
                await hand_off.settled()  # its writes count in the CPU too
                cpu_per_pod, switches = Used.now(pids).per_pod(used_before, count, replicas)
                messages = await placer_messages(servers_of(server))
                sent, received = (
                    (now - before) / count / replicas
                    for now, before in zip(messages, messages_before, strict=True)
                )
                buckets = await histogram(placers)
                lag = since(await histogram(placers, LOOP_LAG), lag_before)
                # Saturation (``--burst 0``: not measured).
                saturated = 0.0
                burst_cpu: dict[str, float] = {}
                burst_switches = 0.0
                if args.burst:
                    burst = [
                        pod(count + n, rng, args.quota_share, args.spread_share)
                        for n in range(args.burst)
                    ]
                    clocked = Clocked(expected=args.burst)
                    followers.append(await follow_decisions(bus, clocked, burst))
                    used_before = Used.now(pids)
                    start = time.perf_counter()
                    await asyncio.gather(*(publish(bus, message, clocked) for message in burst))
                    await asyncio.wait_for(clocked.done.wait(), 300)
                    saturated = args.burst / (max(clocked.decided.values()) - start)
                    await hand_off.settled()
                    # The other replicas may still be applying the last writes: counted too.
                    await asyncio.sleep(BURST_SETTLE_S)
                    burst_cpu, burst_switches = Used.now(pids).per_pod(
                        used_before, args.burst, replicas
                    )
                conflicts = await counter_sum(placers, "tessera_placer_commit_conflicts_total")
                fallbacks = await counter_sum(placers, "tessera_placer_pool_fallbacks_total")
                retries = await counter_sum(placers, "tessera_placer_commit_retries_total")
                return {
                    "handed_off": hand_off.written,
                    "conflicts": conflicts,
                    "retries": retries,
                    "fallbacks": fallbacks,
                    "replicas": replicas,
                    "ready_s": ready_s,
                    "measured": len(latencies),
                    "rate": achieved,
                    "p50": percentile(latencies, 0.5),
                    "p90": percentile(latencies, 0.9),
                    "p99": percentile(latencies, 0.99),
                    "max": max(latencies),
                    "own_p50": bucket_quantile(buckets, 0.5),
                    "own_p99": bucket_quantile(buckets, 0.99),
                    "lag_samples": lag.get(float("inf"), 0.0),
                    "lag_over_10ms": lag.get(float("inf"), 0.0) - lag.get(0.01, 0.0),
                    "lag_p99": bucket_quantile(lag, 0.99),
                    "saturation": saturated,
                    "cpu": cpu_per_pod,
                    "burst_cpu": burst_cpu,
                    "switches": switches,
                    "burst_switches": burst_switches,
                    "sent": sent,
                    "received": received,
                }
            finally:
                for follower in followers:
                    follower.cancel()
                await hand_off.stop()
                await stop(placers)
        finally:
            await bus.drain()


async def measure_rss(args: argparse.Namespace, directory: Path) -> dict[str, float]:
    with NatsServer() as server:
        bus = await NatsBus.connect(server.url, name="bench-driver")
        await mark_restored(bus)  # no binder runs here: the store holds every placement
        try:
            await load_cluster(bus, args.rss_nodes, args.gpus)
            placers = [await start_placer(server.url, 9, directory)]
            hand_off = HandOff(bus, args.hand_off_s)
            hand_off.start()
            try:
                ready_s = await wait_ready(placers)
                await asyncio.sleep(2)
                loaded = rss_mib(placers[0].process.pid)
                rng = random.Random(9)
                clocked = Clocked(expected=args.burst)
                pods = [pod(n, rng) for n in range(args.burst)]
                follower = await follow_decisions(bus, clocked, pods)
                await asyncio.gather(*(publish(bus, message, clocked) for message in pods))
                if pods:
                    await asyncio.wait_for(clocked.done.wait(), 600)
                follower.cancel()
                await hand_off.settled()
                await asyncio.sleep(2)
                placed = rss_mib(placers[0].process.pid)
                return {"ready_s": ready_s, "loaded": loaded, "placed": placed}
            finally:
                await hand_off.stop()
                await stop(placers)
        finally:
            await bus.drain()


async def main(args: argparse.Namespace) -> None:
    directory = Path(tempfile.mkdtemp(prefix="placer-bench-"))
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, "
        f"{platform.python_implementation()} {platform.python_version()}; nats-server, "
        "the placers and this driver share the machine"
    )
    print(
        f"cluster: {args.nodes} nodes x {args.gpus} GPUs; {args.rate:g} pods/s for "
        f"{args.seconds:g} s (first second not counted); burst of {args.burst}; "
        f"{args.nats_servers} nats-server(s)"
        + (
            f"; {args.quota_share:.0%} of the pods in a tenant with a quota"
            if args.quota_share
            else ""
        )
        + (
            f"; {args.spread_share:.0%} of the pods with a hostname spread constraint"
            if args.spread_share
            else ""
        )
    )
    print(
        "| replicas | pods/s sent | p50 | p90 | p99 | max | placers' own p50 / p99 "
        "| decisions/s at saturation | ready after |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for replicas in [int(r) for r in args.replicas.split(",")]:
        r = await run_cluster(replicas, args, directory)
        print(
            f"| {r['replicas']} | {r['rate']:.0f} | {r['p50']:.1f} ms | {r['p90']:.1f} ms "
            f"| {r['p99']:.1f} ms | {r['max']:.1f} ms | {r['own_p50']} / {r['own_p99']} "
            f"| {r['saturation']:.0f} | {r['ready_s']:.1f} s |",
            flush=True,
        )
        cpu = r["cpu"]
        assert isinstance(cpu, dict)
        print(
            "  CPU ms per pod at the rate: " + ", ".join(f"{k} {v:.2f}" for k, v in cpu.items()),
            flush=True,
        )
        burst_cpu = r["burst_cpu"]
        assert isinstance(burst_cpu, dict)
        if burst_cpu:
            print(
                "  CPU ms per pod in the burst (first publish to a second after the last "
                "decision): " + ", ".join(f"{k} {v:.2f}" for k, v in burst_cpu.items()),
                flush=True,
            )
        print(
            f"  context switches per pod, each replica (all its threads): {r['switches']:.1f} "
            "at the rate" + (f", {r['burst_switches']:.1f} in the burst" if burst_cpu else ""),
            flush=True,
        )
        print(
            f"  NATS messages per pod at the rate, each replica: sent {r['sent']:.1f}, "
            f"received {r['received']:.1f}",
            flush=True,
        )
        print(
            f"  placers' event loops at the rate (tessera_event_loop_lag_seconds): "
            f"{r['lag_samples']:.0f} samples, p99 {r['lag_p99']}, "
            f"{r['lag_over_10ms']:.0f} held up over 10 ms",
            flush=True,
        )
        pods = int(args.rate * args.seconds) + args.burst
        print(
            f"  compare-and-sets lost: {r['conflicts']:.0f}; pods decided again after their "
            f"commit was refused: {r['retries']:.0f}; pods decided outside the deciding "
            f"replica's pools: {r['fallbacks']:.0f} (of {pods}); records handed off: "
            f"{r['handed_off']:.0f}",
            flush=True,
        )
    if args.rss_nodes:
        m = await measure_rss(args, directory)
        print(
            f"memory, one placer, {args.rss_nodes} nodes x {args.gpus} GPUs: "
            f"RSS {m['loaded']:.0f} MiB once ready ({m['ready_s']:.1f} s to load), "
            f"{m['placed']:.0f} MiB after placing {args.burst} pods "
            f"(target < 300 MB = 286 MiB)"
        )
    print(f"placer logs: {directory}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--rate", type=float, default=500)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--replicas", default="1,3")
    parser.add_argument("--burst", type=int, default=3000)
    parser.add_argument(
        "--pools",
        type=int,
        default=1,
        help="node pools (the placers' --pools); 0 = as many as replicas",
    )
    parser.add_argument("--rss-nodes", type=int, default=10_000)
    parser.add_argument(
        "--nats-servers",
        type=int,
        default=1,
        help="1, or 3 for a JetStream cluster on loopback (streams with 3 replicas)",
    )
    parser.add_argument(
        "--hand-off-s",
        type=float,
        default=0.25,
        help="seconds from a pod's claim to its record written allocated, standing in for the "
        "binder and the device plugin (claim -> bind -> Allocate in benchmarks/e2e.py); below "
        "0: no record is written (every placement stays reserved)",
    )
    parser.add_argument(
        "--quota-share",
        type=float,
        default=0.0,
        help="fraction of the pods in a tenant with a (never refusing) quota",
    )
    parser.add_argument(
        "--spread-share",
        type=float,
        default=0.0,
        help="fraction of the pods with a topology spread constraint over kubernetes.io/hostname",
    )
    asyncio.run(main(parser.parse_args()))
