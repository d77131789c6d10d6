"""The placer at the largest cluster of docs/design.md §7: 10,000 nodes x 8 GPUs, a burst of
pods through NATS.

    .venv/bin/python benchmarks/placer_scale.py [--nodes 10000] [--gpus 8] [--replicas 1,3]
        [--burst 5000] [--busy-share 0.2] [--foreign-share 0.05] [--timeout 600] [--pools 1]
        [--json]

For each replica count: a fresh nats-server; the cluster written into KV as the services write it
(every node's inventory and node facts; on the busy nodes, the pods already running there: each
one's ledger booking, ``placed`` claim and ``allocated`` assignment record, as a placer and the
device plugin leave them); that many real ``tessera placer`` processes started together and
waited for until ready (every KV watch loaded and reconciled); then ``--burst`` pods published at
once on ``tessera.pods.pending`` through JetStream, as the binder publishes them (the pod mix of
``placer_service.py``: GPU shares of 2-8 GiB and 10-40 % of the SMs, 10 % whole GPUs). The run
waits until every pod is decided: its claim in ``tessera-ledger`` (a KV watch) or a
``PlacementRejected`` with its reasons on ``tessera.placements.rejected``. A pod neither decided
nor rejected within ``--timeout``, a rejection without reasons or a placer that exits fails the
run: non-zero exit status and a message naming what was missing.

Reported per placer replica (from ``/proc/<pid>``): seconds from its start to ready; CPU seconds
to get ready, during the burst and in all; CPU per decision (its burst CPU over the decisions it
published); resident memory once ready, at its peak (``VmHWM``) and at the end (``VmRSS``); and
for the run: the burst's wall time (first publish to last decision) and decisions per second;
nats-server's CPU and memory the same way. Targets (docs/design.md §7 and issue 23): every pod
decided; each placer's peak RSS < 300 MB (286 MiB); 3 replicas cost <= 1.3x the CPU per decision
of one. nats-server, the placers and this driver share the machine's cores: on a machine with
fewer cores than replicas + 1, decisions per second measure the machine, CPU per decision the
placer. ``--pools N`` starts the placers with node pools (``--pools 0``: as many as replicas) and
waits until the pools are shared out before the burst.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import placer_service as service  # this folder's service benchmark (puts the root on sys.path)

from shared import codec, subjects
from shared.commits import CORE_MILLI_PER_PERCENT
from shared.messages.assignments import AssignmentRecord, ContainerAllocation
from shared.messages.base import ContainerSlices, GpuSlice
from shared.messages.inventory import GpuTelemetry, NodeInventory
from shared.messages.ledger import BookedContainer, BookedSlice, Booking, NodeLedger, PodClaim
from shared.messages.placement import PlacementRejected
from shared.messages.pods import ContainerRequest, PodPending
from shared.runtime.bus import Delivery
from shared.runtime.nats import NatsBus
from tests.harness.nats import NatsServer
from tests.harness.store import mark_restored

GPU_MIB = service.GPU_MIB
TARGET_RSS_MIB = 300e6 / 2**20
TARGET_CPU_RATIO = 1.3
RESOURCE = "tessera.dev/gpu"


# --- the cluster ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Held:
    """A pod already running on a node: ``memory_mib`` and ``cores`` on GPU ``gpu``."""

    uid: str
    gpu: int
    memory_mib: int
    cores: int


@dataclass(frozen=True)
class NodePlan:
    name: str
    held: tuple[Held, ...] = ()
    foreign_mib: tuple[int, ...] = ()
    """Memory in use on each GPU by processes Tessera did not place (empty: none)."""


def plan_cluster(
    nodes: int, gpus: int, busy_share: float, foreign_share: float, seed: int = 23
) -> list[NodePlan]:
    """The cluster before the burst: most nodes idle; ``busy_share`` of them running 1 to 6
    pods (GPU shares of 2-16 GiB and 10-50 % of the SMs, one in ten a whole GPU), never more than
    a GPU holds; ``foreign_share`` of them with memory in use outside Tessera on some GPUs."""
    rng = random.Random(seed)
    plans = []
    held_count = 0
    for i in range(nodes):
        name = service.node_name(i)
        draw = rng.random()
        if draw < busy_share:
            memory = [0] * gpus
            cores = [0] * gpus
            held = []
            for _ in range(rng.randint(1, 6)):
                if rng.random() < 0.1:
                    free = [g for g in range(gpus) if memory[g] == 0 and cores[g] == 0]
                    if not free:
                        continue
                    g, mib, pct = rng.choice(free), GPU_MIB, 100
                else:
                    mib, pct = rng.choice((2048, 4096, 8192, 16384)), rng.choice((10, 20, 30, 50))
                    room = [
                        g
                        for g in range(gpus)
                        if memory[g] + mib <= GPU_MIB and cores[g] + pct <= 100
                    ]
                    if not room:
                        continue
                    g = rng.choice(room)
                memory[g] += mib
                cores[g] += pct
                held.append(Held(uid=f"held-{held_count:06d}", gpu=g, memory_mib=mib, cores=pct))
                held_count += 1
            plans.append(NodePlan(name=name, held=tuple(held)))
        elif draw < busy_share + foreign_share:
            foreign = tuple(rng.choice((0, 0, 1024, 4096, 10240)) for _ in range(gpus))
            plans.append(NodePlan(name=name, foreign_mib=foreign))
        else:
            plans.append(NodePlan(name=name))
    return plans


def node_inventory(plan: NodePlan, gpus: int, now: float) -> NodeInventory:
    used = list(plan.foreign_mib) or [0] * gpus
    busy = [0] * gpus
    for h in plan.held:
        used[h.gpu] += h.memory_mib
        busy[h.gpu] += h.cores
    return NodeInventory(
        node=plan.name,
        gpus=tuple(
            GpuTelemetry(
                uuid=f"GPU-{plan.name}-{i}",
                index=i,
                model="A100-SXM4-80GB",
                memory_total_mib=GPU_MIB,
                memory_used_mib=used[i],
                memory_free_mib=GPU_MIB - used[i],
                utilization_pct=min(100, busy[i]),
                numa_node=i // 4,
            )
            for i in range(gpus)
        ),
        observed_at=now,
        sequence=1,
        backend="fake",
    )


def held_entries(plan: NodePlan, now: float) -> tuple[NodeLedger, list[PodClaim], list[Any]]:
    """What a placer and a device plugin left for ``plan``'s running pods: the node's ledger
    entry, each pod's ``placed`` claim and its ``allocated`` assignment record."""
    bookings, claims, records = [], [], []
    for h in plan.held:
        uuid = f"GPU-{plan.name}-{h.gpu}"
        whole = h.cores == 100
        request = PodPending(
            uid=h.uid,
            namespace="bench",
            name=h.uid,
            containers=(
                ContainerRequest(
                    name="main",
                    gpu_shares=1,
                    gpu_memory_mib=None if whole else h.memory_mib,
                    gpu_cores=None if whole else h.cores,
                    cpu_milli=1000,
                    memory_mib=4096,
                    resources={RESOURCE: 1},
                ),
            ),
            created_at=now - 3600,
            resource_version="1",
        )
        booking = Booking(
            pod_uid=h.uid,
            namespace="bench",
            name=h.uid,
            node=plan.name,
            commit=f"commit-{h.uid}",
            tenant="bench",
            cpu_milli=1000,
            memory_mib=4096,
            kind="1-gpu" if whole else "share",
            containers=(
                BookedContainer(
                    container="main",
                    gpus=(
                        BookedSlice(
                            index=h.gpu,
                            uuid=uuid,
                            memory_mib=h.memory_mib,
                            core_milli=h.cores * CORE_MILLI_PER_PERCENT,
                        ),
                    ),
                    resources={RESOURCE: 1},
                ),
            ),
            decided_at=now - 3600,
            placer_id="bench-earlier",
        )
        bookings.append(booking)
        claims.append(
            PodClaim(
                pod_uid=h.uid, state="placed", booking=booking, request=request, updated_at=now
            )
        )
        records.append(
            AssignmentRecord(
                pod_uid=h.uid,
                namespace="bench",
                name=h.uid,
                node=plan.name,
                containers=(
                    ContainerSlices(
                        container="main",
                        gpus=(
                            GpuSlice(
                                uuid=uuid, index=h.gpu, memory_mib=h.memory_mib, cores=h.cores
                            ),
                        ),
                        resources={RESOURCE: 1},
                    ),
                ),
                state="allocated",
                decided_at=now - 3600,
                placer_id="bench-earlier",
                bound_at=now - 3590,
                allocated=(
                    ContainerAllocation(
                        container="main", device_ids=(f"{uuid}-0",), allocated_at=now - 3580
                    ),
                ),
                allocated_at=now - 3580,
                commit=booking.commit,
            )
        )
    return NodeLedger(node=plan.name, bookings=tuple(bookings)), claims, records


async def load_cluster(bus: NatsBus, plans: list[NodePlan], gpus: int) -> int:
    """Write ``plans`` into KV, 250 nodes at a time; returns the number of KV entries."""
    now = time.time()
    entries = 0
    for first in range(0, len(plans), 250):
        writes = []
        for plan in plans[first : first + 250]:
            token = subjects.node_token(plan.name)
            inventory = codec.encode(node_inventory(plan, gpus, now))
            writes.append(bus.kv_put(subjects.KV_INVENTORY, token, inventory))
            writes.append(
                bus.kv_put(subjects.KV_NODES, token, codec.encode(service.facts(plan.name, now)))
            )
            if plan.held:
                ledger, claims, records = held_entries(plan, now)
                for booking in ledger.bookings:
                    key = subjects.booking_key(plan.name, booking.pod_uid)
                    writes.append(bus.kv_put(subjects.KV_LEDGER, key, codec.encode(booking)))
                for claim in claims:
                    key = subjects.claim_key(claim.pod_uid)
                    writes.append(bus.kv_put(subjects.KV_CLAIMS, key, codec.encode(claim)))
                for record in records:
                    key = subjects.assignment_key(plan.name, record.pod_uid)
                    writes.append(bus.kv_put(subjects.KV_ASSIGNMENTS, key, codec.encode(record)))
        entries += len(writes)
        await asyncio.gather(*writes)
    return entries


# --- following the burst ----------------------------------------------------------------------


@dataclass
class Outcomes:
    """Every pod's first outcome, and who decided what."""

    expected: set[str]
    first: dict[str, float] = field(default_factory=dict)
    placed: dict[str, str] = field(default_factory=dict)
    """Pod -> the placer that published its decision."""
    rejected: dict[str, str] = field(default_factory=dict)
    """Pod -> the placer that rejected it last (with reasons)."""
    unexplained: list[str] = field(default_factory=list)
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def on_claim(self, claim: PodClaim) -> None:
        if claim.pod_uid in self.expected and claim.booking is not None:
            self.placed.setdefault(claim.pod_uid, claim.booking.placer_id)
            self._decided(claim.pod_uid)

    def on_rejection(self, rejection: PlacementRejected) -> None:
        if rejection.pod_uid not in self.expected:
            return
        if not rejection.reasons and not rejection.message:
            self.unexplained.append(rejection.pod_uid)
            return
        self.rejected[rejection.pod_uid] = rejection.placer_id
        self._decided(rejection.pod_uid)

    def _decided(self, uid: str) -> None:
        self.first.setdefault(uid, time.perf_counter())
        if len(self.first) >= len(self.expected):
            self.done.set()

    def undecided(self) -> list[str]:
        return sorted(self.expected - self.first.keys())


async def follow(bus: NatsBus, outcomes: Outcomes) -> asyncio.Task[None]:
    """Follow the pods' claims and the rejections into ``outcomes`` (the claims until the task
    returned is cancelled); returns once both are followed."""
    following = asyncio.Event()

    async def claims() -> None:
        async for entry in bus.kv_watch(subjects.KV_CLAIMS, subjects.CLAIM_KEYS):
            if entry is None:
                following.set()
            elif not entry.deleted:
                outcomes.on_claim(codec.decode(entry.value, PodClaim))

    async def on_rejection(delivery: Delivery) -> None:
        outcomes.on_rejection(codec.decode(delivery.data, PlacementRejected))

    await bus.subscribe(subjects.PLACEMENTS_REJECTED, on_rejection)
    task = asyncio.create_task(claims())
    await asyncio.wait_for(following.wait(), 60)
    return task


class RunError(Exception):
    """The run did not show what it measures: the message says what is missing."""


def progress(line: str) -> None:
    """One line on stderr, written over the last one on a terminal."""
    if sys.stderr.isatty():
        print(f"\r{line:<100}", end="", file=sys.stderr, flush=True)
    elif line:
        print(line, file=sys.stderr, flush=True)


def rss_line(placers: list[service.Placer]) -> str:
    """The placers' resident sizes now, for the progress line (one that just exited: "-")."""
    sizes = []
    for placer in placers:
        try:
            sizes.append(f"{service.rss_mib(placer.process.pid):.0f}")
        except OSError:
            sizes.append("-")
    return f"RSS {', '.join(sizes)} MiB"


def check_alive(placers: list[service.Placer]) -> None:
    for n, placer in enumerate(placers):
        if placer.process.returncode is not None:
            raise RunError(
                f"placer {n} exited with status {placer.process.returncode}; its log ends:\n"
                + placer.log.read_text(errors="replace")[-3000:]
            )


async def ready_after(placer: service.Placer, started: float, timeout: float) -> float:
    """Seconds from ``started`` (its spawn) to ``placer`` answering ready."""
    while True:
        try:
            status, _ = await service.http(placer.port, "/readyz")
            if status == 200:
                return time.monotonic() - started
        except aiohttp.ClientError:
            pass
        if placer.process.returncode is not None:
            check_alive([placer])
        if time.monotonic() - started > timeout:
            raise RunError(f"a placer was not ready {timeout:.0f} s after it started")
        await asyncio.sleep(0.2)


# --- one run ----------------------------------------------------------------------------------


def usage(pid: int) -> dict[str, float]:
    memory = service.memory_mib(pid)
    return {
        "cpu_s": service.cpu_seconds(pid),
        "rss_mib": memory["VmRSS"],
        "hwm_mib": memory["VmHWM"],
    }


async def run(
    replicas: int, plans: list[NodePlan], args: argparse.Namespace, directory: Path
) -> dict[str, Any]:
    with NatsServer() as server:
        bus = await NatsBus.connect(server.url, name="bench-driver")
        await mark_restored(bus)  # no binder runs here: the store holds every placement
        try:
            progress(f"{replicas} replica(s): writing {len(plans)} nodes into KV")
            loading = time.monotonic()
            entries = await load_cluster(bus, plans, args.gpus)
            load_s = time.monotonic() - loading
            placers, spawned = [], []
            pools = args.pools or replicas
            pool_options = ("--pools", str(pools)) if pools > 1 else ()
            followers: list[asyncio.Task[None]] = []
            try:
                for n in range(replicas):
                    spawned.append(time.monotonic())
                    placers.append(
                        await service.start_placer(
                            server.url,
                            n,
                            directory,
                            "--reserve-timeout-s",
                            str(args.reserve_timeout),
                            *pool_options,
                        )
                    )
                waits = [
                    asyncio.create_task(ready_after(p, s, args.timeout))
                    for p, s in zip(placers, spawned, strict=True)
                ]
                while not all(w.done() for w in waits):
                    await asyncio.wait(waits, timeout=2)
                    ready = sum(w.done() for w in waits)
                    progress(
                        f"{replicas} replica(s): {ready}/{replicas} ready, "
                        f"{time.monotonic() - spawned[0]:.0f} s, {rss_line(placers)}"
                    )
                ready_s = [w.result() for w in waits]
                if pools > 1:
                    await service.wait_pools(placers, pools, timeout=args.timeout)
                at_ready = [usage(p.process.pid) for p in placers]
                nats_ready = usage(server.pid)

                rng = random.Random(replicas)
                burst = [service.pod(n, rng) for n in range(args.burst)]
                outcomes = Outcomes(expected={p.uid for p in burst})
                followers.append(await follow(bus, outcomes))
                before = [usage(p.process.pid) for p in placers]
                nats_before = usage(server.pid)
                driver_before = service.cpu_seconds(os.getpid())
                start = time.perf_counter()
                sent = service.Clocked()
                await asyncio.gather(*(service.publish(bus, m, sent) for m in burst))
                deadline = time.monotonic() + args.timeout
                while not outcomes.done.is_set():
                    check_alive(placers)
                    if outcomes.unexplained:
                        raise RunError(f"rejections without reasons: {outcomes.unexplained[:10]}")
                    if time.monotonic() > deadline:
                        missing = outcomes.undecided()
                        raise RunError(
                            f"{len(missing)} of {args.burst} pods neither decided nor rejected "
                            f"{args.timeout:.0f} s after the burst, for example {missing[:10]}"
                        )
                    try:
                        async with asyncio.timeout(2):
                            await outcomes.done.wait()
                    except TimeoutError:
                        pass
                    progress(
                        f"{replicas} replica(s): {len(outcomes.first)}/{args.burst} decided "
                        f"({len(outcomes.placed)} placed, {len(outcomes.rejected)} rejected), "
                        f"{time.perf_counter() - start:.0f} s, {rss_line(placers)}"
                    )
                wall_s = max(outcomes.first.values()) - start
                await asyncio.sleep(args.settle)  # acks and the last commits' echoes
                check_alive(placers)
                after = [usage(p.process.pid) for p in placers]
                nats_after = usage(server.pid)
                driver_cpu = service.cpu_seconds(os.getpid()) - driver_before
            finally:
                for follower in followers:
                    follower.cancel()
                await service.stop(placers)
        finally:
            await bus.drain()
    progress("")
    rows: list[dict[str, Any]] = []
    for n in range(replicas):
        placer_id = f"bench-{n}"
        decided = sum(1 for who in outcomes.placed.values() if who == placer_id)
        burst_cpu = after[n]["cpu_s"] - before[n]["cpu_s"]
        rows.append(
            {
                "placer": placer_id,
                "ready_s": ready_s[n],
                "cpu_s_to_ready": at_ready[n]["cpu_s"],
                "cpu_s_burst": burst_cpu,
                "cpu_s_total": after[n]["cpu_s"],
                "decisions": decided,
                "rejections": sum(1 for who in outcomes.rejected.values() if who == placer_id),
                "cpu_ms_per_decision": burst_cpu * 1000 / decided if decided else None,
                "rss_ready_mib": at_ready[n]["rss_mib"],
                "rss_peak_mib": after[n]["hwm_mib"],
                "rss_final_mib": after[n]["rss_mib"],
            }
        )
    placers_cpu = sum(r["cpu_s_burst"] for r in rows)
    return {
        "replicas": replicas,
        "kv_entries": entries,
        "kv_write_s": load_s,
        "burst": args.burst,
        "placed": len(outcomes.placed),
        "rejected_only": len(outcomes.rejected.keys() - outcomes.placed.keys()),
        "burst_wall_s": wall_s,
        "decisions_per_s": args.burst / wall_s,
        "placers_cpu_ms_per_decision": placers_cpu * 1000 / args.burst,
        "placers": rows,
        "nats_server": {
            "cpu_s_burst": nats_after["cpu_s"] - nats_before["cpu_s"],
            "cpu_ms_per_decision": (nats_after["cpu_s"] - nats_before["cpu_s"]) * 1000 / args.burst,
            "cpu_s_total": nats_after["cpu_s"],
            "rss_ready_mib": nats_ready["rss_mib"],
            "rss_peak_mib": nats_after["hwm_mib"],
            "rss_final_mib": nats_after["rss_mib"],
        },
        "driver_cpu_s_burst": driver_cpu,
    }


def verdicts(runs: list[dict[str, Any]]) -> dict[str, Any]:
    peak = max(r["rss_peak_mib"] for run in runs for r in run["placers"])
    out: dict[str, Any] = {
        "every_pod_decided": True,  # a run that misses one fails before this
        "peak_placer_rss_mib": peak,
        "rss_below_300_mb": peak < TARGET_RSS_MIB,
    }
    per = {run["replicas"]: run["placers_cpu_ms_per_decision"] for run in runs}
    if 1 in per and 3 in per:
        out["cpu_ratio_3_to_1"] = per[3] / per[1]
        out["cpu_ratio_within_1_3"] = per[3] / per[1] <= TARGET_CPU_RATIO
    return out


def table(runs: list[dict[str, Any]]) -> str:
    lines = [
        "| replicas | process | ready after | CPU to ready | CPU in burst | decisions "
        "| CPU per decision | RSS ready / peak / final |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        for r in run["placers"]:
            per = r["cpu_ms_per_decision"]
            lines.append(
                f"| {run['replicas']} | placer {r['placer']} | {r['ready_s']:.1f} s "
                f"| {r['cpu_s_to_ready']:.1f} s | {r['cpu_s_burst']:.1f} s | {r['decisions']:,} "
                f"| {'-' if per is None else f'{per:.2f} ms'} | {r['rss_ready_mib']:.0f} / "
                f"{r['rss_peak_mib']:.0f} / {r['rss_final_mib']:.0f} MiB |"
            )
        nats = run["nats_server"]
        lines.append(
            f"| {run['replicas']} | nats-server | "
            f"| {nats['cpu_s_total'] - nats['cpu_s_burst']:.1f} s"
            f" | {nats['cpu_s_burst']:.1f} s | | {nats['cpu_ms_per_decision']:.2f} ms "
            f"| {nats['rss_ready_mib']:.0f} / {nats['rss_peak_mib']:.0f} / "
            f"{nats['rss_final_mib']:.0f} MiB |"
        )
    lines.append("")
    lines.append(
        "| replicas | KV entries (written in) | burst | placed / rejected | burst wall "
        "| decisions/s | placers' CPU per decision |"
    )
    lines.append("|---|---|---|---|---|---|---|")
    for run in runs:
        lines.append(
            f"| {run['replicas']} | {run['kv_entries']:,} ({run['kv_write_s']:.1f} s) "
            f"| {run['burst']:,} | {run['placed']:,} / {run['rejected_only']:,} "
            f"| {run['burst_wall_s']:.1f} s | {run['decisions_per_s']:.0f} "
            f"| {run['placers_cpu_ms_per_decision']:.2f} ms |"
        )
    return "\n".join(lines)


async def main(args: argparse.Namespace) -> int:
    directory = Path(tempfile.mkdtemp(prefix="placer-scale-"))
    plans = plan_cluster(args.nodes, args.gpus, args.busy_share, args.foreign_share)
    held = sum(len(p.held) for p in plans)
    setup = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"{platform.python_implementation()} {platform.python_version()}",
        "nodes": args.nodes,
        "gpus_per_node": args.gpus,
        "busy_nodes": sum(1 for p in plans if p.held),
        "running_pods": held,
        "foreign_nodes": sum(1 for p in plans if p.foreign_mib),
        "burst": args.burst,
        "placer_logs": str(directory),
    }
    if not args.json:
        print(
            f"machine: {setup['machine']}; nats-server, the placers and this driver share it\n"
            f"cluster: {args.nodes:,} nodes x {args.gpus} GPUs, {setup['busy_nodes']:,} running "
            f"{held:,} pods, {setup['foreign_nodes']:,} with memory in use outside Tessera; "
            f"burst of {args.burst:,} pods; placer logs: {directory}",
            flush=True,
        )
    runs = []
    try:
        for replicas in [int(r) for r in args.replicas.split(",")]:
            logs = directory / f"replicas-{replicas}"
            logs.mkdir()
            runs.append(await run(replicas, plans, args, logs))
    except RunError as failure:
        print(f"\nFAILED: {failure}\nplacer logs: {directory}", file=sys.stderr)
        return 1
    result = {"setup": setup, "runs": runs, "targets": verdicts(runs)}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(table(runs))
        print(json.dumps(result["targets"]))
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Exit status: 0 when every pod was decided; 1 when a pod was neither placed nor "
        "rejected with reasons within --timeout, or a placer exited.",
    )
    p.add_argument("--nodes", type=int, default=10_000, help="nodes in the cluster (10000)")
    p.add_argument("--gpus", type=int, default=8, help="GPUs per node, A100 80 GB (8)")
    p.add_argument(
        "--replicas",
        default="1,3",
        help="comma-separated placer replica counts, one fresh cluster each (1,3)",
    )
    p.add_argument("--burst", type=int, default=5000, help="pods published at once (5000)")
    p.add_argument(
        "--busy-share",
        type=float,
        default=0.2,
        help="fraction of the nodes already running 1-6 Tessera pods: booking, claim and "
        "allocated record each (0.2)",
    )
    p.add_argument(
        "--foreign-share",
        type=float,
        default=0.05,
        help="fraction of the nodes with GPU memory in use outside Tessera (0.05)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=600,
        help="seconds each placer may take to get ready, and the burst to be decided (600)",
    )
    p.add_argument(
        "--settle",
        type=float,
        default=2,
        help="seconds to wait after the last decision before reading CPU and final RSS (2)",
    )
    p.add_argument(
        "--reserve-timeout-s",
        dest="reserve_timeout",
        type=float,
        default=3600,
        help="the placers' --reserve-timeout-s: no binder runs here, so every decision stays "
        "reserved, and a burst that takes longer than the default 120 s would have the first "
        "pods released and placed again while the last wait (3600)",
    )
    p.add_argument(
        "--pools",
        type=int,
        default=1,
        help="the placers' --pools; 0 = as many as replicas (1: no node pools)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON document, not tables")
    return p


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parser().parse_args())))
