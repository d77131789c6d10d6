"""Placements to bound pods: throughput and placement-to-bound latency of the real binder.

    .venv/bin/python benchmarks/binder.py [--pods 1000] [--nodes 250] [--rate 100]

A real ``tessera binder`` process (one replica, leader election on) talks to the Kubernetes API test
double (served from this process) through kubernetes-asyncio, and to a real ``nats-server``. This
process plays the placer: it creates the pods, then commits each pod's placement as a placer does
(its booking, then its claim, in ``tessera-ledger``); the binder sees the claim, writes the record
``bound``, creates the Binding (annotations on it) and writes a ``Scheduled`` Event. Latency is from
the commit to the pod seen bound by a watch of the API test double's own store (in this process; one
clock, one machine). The garbage collector of this (stand-in) process is off during the run: its
pauses would stall the API test double and show up as binder latency; the binder process runs as in
production.

Two phases, fresh pods each:

- burst: every placement committed at once; throughput = pods / (last bound - first commit);
- paced: placements at ``--rate`` per second; latency p50/p99 of a binder that keeps up.

Pods on one node ask for different device counts (1..4 GPUs), so the ambiguity gate never holds
one back: this measures binding, not the device plugin's pace (the gate's cost is the time until
the earlier pod's Allocate, which the device plugin benchmark measures).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import msgspec

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from shared import codec, subjects  # noqa: E402
from shared.messages.ledger import BookedContainer, BookedSlice, Booking, PodClaim  # noqa: E402
from shared.messages.pods import PodPending  # noqa: E402
from shared.runtime.bus import Delivery  # noqa: E402
from shared.runtime.nats import NatsBus  # noqa: E402
from tessera.devcluster.apiserver import ApiServer  # noqa: E402
from tessera.devcluster.resources import LEASE, NODE, POD  # noqa: E402
from tessera.devcluster.store import Closed  # noqa: E402
from tests.harness.nats import NatsServer, environment_without_proxies  # noqa: E402
from tests.harness.procstat import cpu_seconds  # noqa: E402

PER_NODE = 4


def node_body(name: str) -> dict[str, object]:
    allocatable = {"cpu": "64", "memory": "512Gi", "pods": "110", "tessera.dev/gpu": "32"}
    return {
        "metadata": {"name": name},
        "status": {
            "allocatable": allocatable,
            "capacity": allocatable,
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def pod_body(name: str, gpus: int) -> dict[str, object]:
    limits = {
        "tessera.dev/gpu": str(gpus),
        "tessera.dev/gpu-memory": "4096",
        "cpu": "1",
        "memory": "2Gi",
    }
    return {
        "metadata": {"name": name, "namespace": "bench"},
        "spec": {
            "schedulerName": "tessera",
            "containers": [{"name": "main", "image": "bench", "resources": {"limits": limits}}],
        },
    }


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


class Results:
    """When each pod was seen bound (and, to know the binder is idle before a phase, the pods
    published as pending)."""

    def __init__(self) -> None:
        self.at: dict[str, float] = {}
        self.pending: set[str] = set()
        self.changed = asyncio.Event()

    async def follow(self, api: ApiServer) -> None:
        """Note when each pod is first seen on a node (a watch of the store, no HTTP)."""
        store = api.store
        _, watcher = store.watch(POD, namespace="bench", match=lambda _f, _l: True, since=None)
        try:
            while True:
                change = await watcher.queue.get()
                if isinstance(change, Closed):
                    return
                pod = change.object
                if (pod.get("spec") or {}).get("nodeName"):
                    self.at.setdefault(pod["metadata"]["uid"], time.time())
                    self.changed.set()
        finally:
            store.stop_watch(watcher)

    async def on_pending(self, delivery: Delivery) -> None:
        self.pending.add(codec.decode(delivery.data, PodPending).uid)

    async def published(self, uids: set[str], timeout: float = 120) -> None:
        """Wait until the binder has published every pod in ``uids`` as pending, then a little
        more, so that a phase starts with the binder idle."""
        deadline = time.monotonic() + timeout
        while not uids <= self.pending:
            if time.monotonic() > deadline:
                raise SystemExit(f"only {len(uids & self.pending)} of {len(uids)} published")
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)

    async def wait_for(self, uids: set[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not uids <= self.at.keys():
            if time.monotonic() > deadline:
                raise SystemExit(f"only {len(uids & self.at.keys())} of {len(uids)} bound")
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), 1.0)


async def prepare(api: ApiServer, phase: str, pods: int, nodes: int) -> list[Booking]:
    """The pods of a phase, and their bookings (committed when the phase runs)."""
    bookings = []
    for n in range(pods):
        node = f"node-{(n // PER_NODE) % nodes:04d}"
        gpus = 1 + n % PER_NODE
        name = f"{phase}-{n:05d}"
        uid = api.create(POD, pod_body(name, gpus))["metadata"]["uid"]
        first = sum(range(1, gpus))  # pods on a node take GPUs 0, 1-2, 3-5, 6-9
        container = BookedContainer(
            container="main",
            gpus=tuple(
                BookedSlice(
                    index=first + g, uuid=f"GPU-{node}-{first + g}", memory_mib=4096, core_milli=0
                )
                for g in range(gpus)
            ),
            resources={"tessera.dev/gpu": gpus},
        )
        bookings.append(
            Booking(
                pod_uid=uid,
                namespace="bench",
                name=name,
                node=node,
                commit=f"bench.{uid}",
                containers=(container,),
                decided_at=0.0,
                placer_id="bench",
            )
        )
    return bookings


async def commit(bus: NatsBus, booking: Booking) -> None:
    """What a placer writes to commit a placement: the booking, then the pod's claim."""
    key = subjects.booking_key(booking.node, booking.pod_uid)
    await bus.kv_create(subjects.KV_LEDGER, key, codec.encode(booking))
    claim = PodClaim(pod_uid=booking.pod_uid, state="placed", booking=booking, updated_at=0.0)
    await bus.kv_create(
        subjects.KV_CLAIMS, subjects.claim_key(booking.pod_uid), codec.encode(claim)
    )


async def run_phase(
    bus: NatsBus, results: Results, bookings: list[Booking], rate: float
) -> tuple[list[float], float]:
    """Commit the placements (all at once when ``rate`` is 0); latencies (ms) and pods/s."""
    started = time.time()
    sent: dict[str, float] = {}
    for i, booking in enumerate(bookings):
        if rate:
            delay = started + i / rate - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
        now = time.time()
        sent[booking.pod_uid] = now
        await commit(bus, msgspec.structs.replace(booking, decided_at=now))
    await results.wait_for(set(sent), timeout=300)
    latencies = [(results.at[uid] - at) * 1000 for uid, at in sent.items()]
    last = max(results.at[uid] for uid in sent)
    return latencies, len(sent) / (last - started)


def summary(name: str, latencies: list[float], per_s: float) -> str:
    return (
        f"{name}: {len(latencies)} pods, {per_s:.0f} pods/s bound; placement-to-bound ms "
        f"p50 {percentile(latencies, 0.5):.1f}  p90 {percentile(latencies, 0.9):.1f}  "
        f"p99 {percentile(latencies, 0.99):.1f}  max {max(latencies):.1f}  "
        f"mean {statistics.fmean(latencies):.1f}"
    )


async def measure(pods: int, nodes: int, rate: float) -> None:
    with NatsServer() as nats_server, tempfile.TemporaryDirectory() as work:
        # This process only stands in for the API server and the placer: its own garbage
        # collector would pause the stand-in API server and be counted as binder latency.
        gc.disable()
        async with ApiServer(bookmark_interval_s=5.0, journal_limit=0) as api:
            for n in range(nodes):
                api.create(NODE, node_body(f"node-{n:04d}"))
            kubeconfig = api.write_kubeconfig(Path(work) / "kubeconfig")
            bus = await NatsBus.connect(nats_server.url, name="bench-placer")
            results = Results()
            following = asyncio.create_task(results.follow(api))
            await bus.subscribe(subjects.PODS_PENDING, results.on_pending)
            burst = await prepare(api, "burst", pods, nodes)
            binder = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "tessera.cli",
                "binder",
                "--nats-url",
                nats_server.url,
                "--kubeconfig",
                str(kubeconfig),
                "--http-host",
                "127.0.0.1",
                "--http-port",
                "0",
                "--log-level",
                "warning",
                cwd=ROOT,
                env=environment_without_proxies() | {"PYTHONHASHSEED": "0"},
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
            )
            try:
                for _ in range(600):  # the binder leads once the lease is written
                    lease = api.find(LEASE, "default", "tessera-binder")
                    if lease and api.watchers(POD):
                        break
                    await asyncio.sleep(0.05)
                await results.published({b.pod_uid for b in burst})
                cpu_before = (cpu_seconds(binder.pid), cpu_seconds(os.getpid()))
                wall_before = time.monotonic()
                burst_ms, burst_rate = await run_phase(bus, results, burst, 0)
                wall = time.monotonic() - wall_before
                cpu = (
                    (cpu_seconds(binder.pid) - cpu_before[0]) / wall,
                    (cpu_seconds(os.getpid()) - cpu_before[1]) / wall,
                )
                paced = await prepare(api, "paced", pods, nodes)
                await results.published({b.pod_uid for b in paced})
                paced_ms, paced_rate = await run_phase(bus, results, paced, rate)
            finally:
                following.cancel()
                binder.send_signal(signal.SIGTERM)
                _, errors = await binder.communicate()
            await bus.drain()
            bindings = api.requests[("create", "pods/binding")]
            events = api.requests[("create", "events")]
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, "
        f"{platform.python_implementation()} {platform.python_version()}; binder: one "
        f"process; API test double and this placer stand-in share another"
    )
    print(
        f"{nodes} nodes, {PER_NODE} pods per node with 1..{PER_NODE} GPUs each "
        f"(no gate waits); {bindings} Binding and {events} Event create requests"
    )
    print(summary("burst (all placements at once)", burst_ms, burst_rate))
    print(
        f"burst CPU use (cores): binder {cpu[0]:.2f}, API test double + placer stand-in "
        f"{cpu[1]:.2f}"
    )
    print(summary(f"paced ({rate:g} placements/s)", paced_ms, paced_rate))
    if binder.returncode != 0:
        print(errors.decode()[-2000:])
    print(
        json.dumps(
            {
                "burst_pods_per_s": round(burst_rate),
                "paced_p50_ms": round(percentile(paced_ms, 0.5), 1),
                "paced_p99_ms": round(percentile(paced_ms, 0.99), 1),
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=1000, help="pods per phase")
    parser.add_argument("--nodes", type=int, default=250)
    parser.add_argument("--rate", type=float, default=100.0, help="placements/s when paced")
    args = parser.parse_args()
    asyncio.run(measure(args.pods, args.nodes, args.rate))


if __name__ == "__main__":
    main()
