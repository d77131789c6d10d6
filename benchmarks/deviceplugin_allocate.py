"""Allocate latency of the device plugin over real gRPC (unix socket) and a real nats-server.

    .venv/bin/python benchmarks/deviceplugin_allocate.py [--calls 2000] [--batch 50]

A fake kubelet (the test one) registers the plugin; a real ``nats-server`` holds the assignment
records. Records are written in batches the way the placer and binder write them (each pod's
claim and its booking on the node first, then one bound record per pod, one
container needing one logical device), the kubelet calls Allocate for each, and the finished
records are deleted before the next batch, so the plugin's view stays the size of a busy node.
The plugin grants only records that match their commit: it mirrors the node's bookings and
reads each pod's claim when its record arrives, so the check itself is in memory. Each
measured call is the full path: gRPC in, pick the record, compare-and-set in the KV bucket
(the record moves to allocated), gRPC out. Prints p50/p90/p99/max latency and calls per second,
then where the time goes: the mean time inside the plugin (its own ``allocate_seconds`` histogram:
plan, compare-and-set, bookkeeping), a bare KV compare-and-set round trip to the same server, and
the pure planning step (``plan_allocation`` over a batch of bound records) on its own.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from prometheus_client import CollectorRegistry  # noqa: E402

from services.deviceplugin._proto import api_pb2  # noqa: E402
from services.deviceplugin.command import DevicePluginSettings, build_config  # noqa: E402
from services.deviceplugin.rules import allocate  # noqa: E402
from services.deviceplugin.service import run_plugin  # noqa: E402
from shared import codec, subjects  # noqa: E402
from shared.messages.assignments import AssignmentRecord, RecordView  # noqa: E402
from shared.messages.base import ContainerSlices, GpuSlice  # noqa: E402
from shared.messages.inventory import GpuTelemetry, NodeInventory  # noqa: E402
from shared.runtime.health import Readiness  # noqa: E402
from shared.runtime.lifecycle import run_service  # noqa: E402
from shared.runtime.nats import NatsBus  # noqa: E402
from tests.deviceplugin.fake_kubelet import FakeKubelet  # noqa: E402
from tests.harness.commits import booking_of, claim_of  # noqa: E402
from tests.harness.nats import NatsServer  # noqa: E402

NODE = "bench-node"
GPUS = 8


def gpu_uuid(index: int) -> str:
    return f"GPU-{index:08x}-0000-1111-2222-333344445555"


def node_inventory() -> NodeInventory:
    return NodeInventory(
        node=NODE,
        gpus=tuple(
            GpuTelemetry(
                uuid=gpu_uuid(i),
                index=i,
                model="A100",
                memory_total_mib=81_920,
                memory_used_mib=0,
                memory_free_mib=81_920,
                numa_node=i // 4,
            )
            for i in range(GPUS)
        ),
        observed_at=time.time(),
    )


def bound_record(n: int) -> AssignmentRecord:
    index = n % GPUS
    return AssignmentRecord(
        pod_uid=f"pod-{n:06d}",
        namespace="bench",
        name=f"pod-{n}",
        node=NODE,
        containers=(
            ContainerSlices(
                container="main",
                gpus=(GpuSlice(uuid=gpu_uuid(index), index=index, memory_mib=4096, cores=25),),
                resources={"tessera.dev/gpu": 1},
            ),
        ),
        state="bound",
        decided_at=1_000_000.0 + n,
        placer_id="bench",
        bound_at=1_000_000.5 + n,
        commit=f"bench-{n}",
    )


async def commit_batch(bus: NatsBus, records: list[AssignmentRecord]) -> None:
    """What the placers wrote before these records: each pod's claim, the node's bookings."""
    for record in records:
        await bus.kv_put(
            subjects.KV_CLAIMS, subjects.claim_key(record.pod_uid), codec.encode(claim_of(record))
        )
    for record in records:
        key = subjects.booking_key(NODE, record.pod_uid)
        await bus.kv_put(subjects.KV_LEDGER, key, codec.encode(booking_of(record)))


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def measure(calls: int, batch: int, warmup: int) -> None:
    directory = Path(tempfile.mkdtemp(prefix="dp-bench-", dir="/tmp"))
    with NatsServer() as nats_server:
        bus = await NatsBus.connect(nats_server.url, name="bench-writer")
        await bus.kv_put(
            subjects.KV_INVENTORY, subjects.node_token(NODE), codec.encode(node_inventory())
        )
        settings = DevicePluginSettings(
            node=NODE,
            nats_url=nats_server.url,
            http_host="127.0.0.1",
            http_port=0,
            log_level="warning",
            log_format="text",
            plugin_dir=str(directory),
        )
        config = build_config(settings)
        readiness, stop, registry = Readiness(), asyncio.Event(), CollectorRegistry()
        async with FakeKubelet(directory) as kubelet:
            service = asyncio.create_task(
                run_service(
                    name="deviceplugin",
                    settings=settings,
                    readiness=readiness,
                    stop=stop,
                    registry=registry,
                    body=functools.partial(run_plugin, config=config),
                )
            )
            await kubelet.registered(timeout=30)
            for _ in range(3000):
                if readiness.ready:
                    break
                await asyncio.sleep(0.01)
            assert readiness.ready, readiness.report()
            latencies: list[float] = []
            async with kubelet.plugin(config.endpoint) as stub:
                started = time.perf_counter()
                measured_time = 0.0
                for first in range(0, calls + warmup, batch):
                    numbers = range(first, min(first + batch, calls + warmup))
                    keys = []
                    await commit_batch(bus, [bound_record(n) for n in numbers])
                    for n in numbers:
                        record = bound_record(n)
                        key = subjects.assignment_key(NODE, record.pod_uid)
                        await bus.kv_put(subjects.KV_ASSIGNMENTS, key, codec.encode(record))
                        keys.append(key)
                    await asyncio.sleep(0.05)  # let the plugin's KV watch catch up
                    batch_start = time.perf_counter()
                    for n in numbers:
                        device = f"{gpu_uuid(n % GPUS)}::{n % 40}"
                        request = api_pb2.AllocateRequest(
                            container_requests=[
                                api_pb2.ContainerAllocateRequest(devices_ids=[device])
                            ]
                        )
                        call_start = time.perf_counter()
                        response = await stub.Allocate(request, timeout=10)
                        elapsed = time.perf_counter() - call_start
                        assert response.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"]
                        if n >= warmup:
                            latencies.append(elapsed)
                    if first >= warmup:
                        measured_time += time.perf_counter() - batch_start
                    for key in keys:  # the pods finished: the binder deletes their records
                        await bus.kv_delete(subjects.KV_ASSIGNMENTS, key)
                total = time.perf_counter() - started
            stop.set()
            await service
        in_plugin = registry.get_sample_value("tessera_deviceplugin_allocate_seconds_sum") or 0.0
        in_plugin_calls = registry.get_sample_value("tessera_deviceplugin_allocate_seconds_count")
        cas = await cas_round_trips(bus, 500)
        await bus.drain()
    shutil.rmtree(directory, ignore_errors=True)
    plan_us = plan_cost(batch) * 1e6

    ms = [v * 1000 for v in latencies]
    print(
        f"machine: {platform.machine()}, {platform.python_implementation()} "
        f"{platform.python_version()}, asyncio event loop"
    )
    print(
        f"Allocate calls measured: {len(ms)} (after {warmup} warm-up), batches of {batch} "
        f"bound records, {GPUS} GPUs x 40 logical devices"
    )
    print(
        f"latency ms: p50 {percentile(ms, 0.50):.3f}  p90 {percentile(ms, 0.90):.3f}  "
        f"p99 {percentile(ms, 0.99):.3f}  max {max(ms):.3f}  mean {statistics.fmean(ms):.3f}"
    )
    print(
        f"throughput: {len(ms) / measured_time:.0f} calls/s sequential "
        f"(wall time {total:.1f} s including record writes)"
    )
    print(
        f"where the time goes: inside the plugin (plan + compare-and-set + bookkeeping) mean "
        f"{in_plugin / (in_plugin_calls or 1) * 1000:.3f} ms of {statistics.fmean(ms):.3f} ms; "
        f"a bare KV compare-and-set round trip p50 {percentile(cas, 0.5):.3f} ms p99 "
        f"{percentile(cas, 0.99):.3f} ms; planning alone {plan_us:.0f} us over {batch} bound "
        "records"
    )


async def cas_round_trips(bus: NatsBus, count: int) -> list[float]:
    """Milliseconds of ``count`` compare-and-sets on one scratch key, one after the other."""
    key = subjects.assignment_key("bench-scratch", "cas")
    revision = await bus.kv_put(subjects.KV_ASSIGNMENTS, key, b"0")
    times = []
    for n in range(count):
        started = time.perf_counter()
        written = await bus.kv_update(subjects.KV_ASSIGNMENTS, key, b"%d" % n, revision=revision)
        times.append((time.perf_counter() - started) * 1000)
        assert written is not None
        revision = written
    return times


def plan_cost(batch: int, rounds: int = 2000) -> float:
    """Seconds of one ``plan_allocation`` over ``batch`` bound records (the pure core alone)."""
    inventory = node_inventory()
    gpus = {gpu.uuid: gpu for gpu in inventory.gpus}
    records = [bound_record(n) for n in range(batch)]
    views = [RecordView(key=f"k{n}", revision=n + 1, record=r) for n, r in enumerate(records)]
    bookings = {r.pod_uid: booking_of(r) for r in records}
    advertised = {f"{gpu_uuid(i)}::{n}" for i in range(GPUS) for n in range(40)}
    started = time.perf_counter()
    for n in range(rounds):
        allocate.plan_allocation(
            (f"{gpu_uuid(n % GPUS)}::{n % 40}",),
            views,
            node=NODE,
            resource="tessera.dev/gpu",
            advertised=advertised,
            gpus=gpus,
            options=allocate.ResponseOptions(),
            now=2_000_000.0,
            bookings=bookings,
        )
    return (time.perf_counter() - started) / rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=100)
    args = parser.parse_args()
    warmup = -(-args.warmup // args.batch) * args.batch  # whole batches, so timing splits cleanly
    asyncio.run(measure(args.calls, args.batch, warmup))


if __name__ == "__main__":
    main()
