"""A longer chaos run than CI's: pods through the whole system while services are SIGKILLed,
or NATS loses its whole store again and again.

    .venv/bin/python benchmarks/chaos.py [--nodes 10] [--pods 400] [--window 30] [--rounds 3]
        [--seeds 1,2,3] [--placers 3] [--pools 0] [--nats-servers 1]
    .venv/bin/python benchmarks/chaos.py --store-losses 50 [--nodes 4] [--burst-pods 24]
        [--burst-s 4] [--seeds 1] [--nats-servers 1]

For each seed: ``tessera up``'s LocalSystem (``--nodes`` nodes of 4 fake A100-80GB, ``--placers``
placers with ``--pools`` node pools, 0 = one per placer; two binders with leader election; one or
three nats-servers), then ``tests/e2e/chaos.py``'s run: ``--pods`` pods created in batches over
``--window`` seconds while each target (a placer, the binder leader, a device plugin, a
nats-server) is SIGKILLed ``--rounds`` times at seeded moments and started again after a short
pause. A pod the kubelet fails is replaced, as its ReplicaSet would, and must be explained by an
outage of its node's plugin or of NATS. The run fails unless, in the end, every pod is Running
with exactly its record's slices, no GPU is over-committed, no record is left ``reserved`` or
``bound`` and no service broke its NATS permissions. Prints one JSON line per seed: kills,
pods replaced, records the binders withdrew and settled, wall time.

``--store-losses N``: the store-loss loop instead (:func:`store_loss_loop`). ``N`` rounds, each a
burst of ``--burst-pods`` pods created (and the pods of the round three before deleted) over
``--burst-s`` seconds, with NATS losing its whole store at a random moment of the burst: every
nats-server (all three of a cluster) SIGKILLed, its store deleted, started again empty 0.5-2.5 s
later; what is bound is restored from the pods' annotations. The pods are large (16,384 MiB
and 20 % of the SMs, or half that), so about three rounds' pods fill two thirds of the GPUs: a
record released while its pod runs shows as the next pods handed that GPU's room again. After
each round every pod must be Running (a pod the kubelet fails is replaced and must fall in a
store loss's window), no GPU over-committed by what the simulated kubelets handed out, every
container's environment exactly its record's slices; at the end no record ``reserved`` or
``bound``. Prints one JSON line per seed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.binder.settling import SETTLED, WITHDREW
from shared import codec, subjects
from shared.messages.epoch import StoreEpoch, StoreRestored
from shared.runtime.bus import BusUnavailableError
from tessera.up import workload as w
from tessera.up.spec import plan_nodes
from tessera.up.system import LocalSystem, SystemOptions
from tests.e2e.chaos import (
    NAMESPACE,
    TARGETS,
    Outage,
    ReplicaSet,
    assert_no_record_stuck,
    chaos_run,
)
from tests.e2e.helpers import assert_exact, pending_message, phase, until

FAST_LEASE = ("--lease-duration-s", "4", "--renew-deadline-s", "3", "--retry-period-s", "1")
"""The binders' leader lease, short so that a killed leader is replaced within seconds."""


def binder_repairs(run_dir: Path) -> dict[str, int]:
    """How many records the binders withdrew (a pod ended before its Allocate) and settled (a pod
    admitted from another pod's identical record), from their logs."""
    counts = {"records_withdrawn": 0, "records_settled": 0}
    for log_file in sorted((run_dir / "logs").glob("binder-*.log")):
        for line in log_file.read_text(errors="replace").splitlines():
            try:
                message = json.loads(line).get("msg")
            except (ValueError, AttributeError):
                continue  # not a JSON log line, or one cut short by a SIGKILL
            if message == WITHDREW:
                counts["records_withdrawn"] += 1
            elif message == SETTLED:
                counts["records_settled"] += 1
    return counts


def system_options(args: argparse.Namespace, run_prefix: str) -> SystemOptions:
    """The system a chaos run starts: two binders, the placers in their pools, no dashboard."""
    pools = args.pools or args.placers
    return SystemOptions(
        nodes=plan_nodes("4xA100-80GB", args.nodes),
        run_dir=Path(tempfile.mkdtemp(prefix=run_prefix)),
        placers=args.placers,
        binders=2,
        dashboard=False,
        webhook=False,
        binder_args=FAST_LEASE,
        placer_args=("--pools", str(pools)) if pools > 1 else (),
        nats_servers=args.nats_servers,
        ready_timeout_s=300.0,
    )


async def run_seed(seed: int, args: argparse.Namespace) -> dict[str, object]:
    options = system_options(args, f"tessera-chaos-{seed}-")
    async with LocalSystem(options) as system:
        report = await chaos_run(
            system,
            pods=args.pods,
            seed=seed,
            window_s=args.window,
            targets=TARGETS * args.rounds,
            settle_timeout_s=300.0,
            say=lambda line: print(line, file=sys.stderr, flush=True),
        )
        violations = system.bus_violations()
    if violations:
        raise SystemExit(f"seed {seed}: NATS permissions broken: {violations[:5]}")
    return {
        "seed": seed,
        "pods": report.pods,
        "kills": len(report.outages),
        "killed": sorted({o.name for o in report.outages}),
        "replaced": len(report.replaced),
        "wall_s": round(report.wall_s, 1),
        **binder_repairs(options.run_dir),
        "every_pod_running_exact": True,
        "run_dir": str(options.run_dir),
    }


ROUNDS_KEPT = 3
"""Rounds of pods alive at once in the store-loss loop (each burst deletes the oldest round)."""


def loss_pod(n: int, generation: int = 0) -> dict[str, Any]:
    """Pod ``c-<n>`` of the store-loss loop: 16,384 MiB and 20 % of the SMs on one GPU, every
    other pod half that (an A100-80GB holds five of the first)."""
    suffix = f"-r{generation}" if generation else ""
    memory, cores = (16384, 20) if n % 2 else (8192, 10)
    container = w.container(gpu=1, memory_mib=memory, cores=cores, cpu="100m", memory="128Mi")
    return w.pod(f"c-{n}{suffix}", [container], namespace=NAMESPACE)


async def store_restored(system: LocalSystem) -> bool:
    """Whether the binder said the store holds every bound placement (``StoreRestored`` of the
    store's epoch): only then is every running pod's record back."""
    bus = system.bus
    if bus is None or not bus.connected:
        return False
    try:
        epoch = await bus.kv_get(subjects.KV_META, subjects.META_EPOCH)
        restored = await bus.kv_get(subjects.KV_META, subjects.META_RESTORED)
    except BusUnavailableError:
        return False
    if epoch is None or restored is None:
        return False
    return codec.decode(epoch.value, StoreEpoch).epoch == (
        codec.decode(restored.value, StoreRestored).epoch
    )


async def store_loss_loop(
    system: LocalSystem, *, losses: int, seed: int, burst_pods: int, burst_s: float
) -> dict[str, object]:
    """NATS loses its whole store ``losses`` times, each at a random moment of a burst (see the
    module docstring); the figures, or AssertionError at the first round that breaks a rule."""
    rng = random.Random(seed)
    started = time.monotonic()

    def clock() -> float:
        return time.monotonic() - started

    def note(text: str) -> None:
        print(f"{clock():8.2f} s  {text}", file=sys.stderr, flush=True)

    replicas = ReplicaSet(system, loss_pod, clock=clock, note=note)
    outages: list[Outage] = []
    live: list[list[int]] = []
    created = 0
    round_s: list[float] = []
    replacer = asyncio.create_task(replicas.run())
    try:
        for loss in range(1, losses + 1):
            round_started = clock()
            numbers = list(range(created, created + burst_pods))
            created += burst_pods
            retiring = live.pop(0) if len(live) >= ROUNDS_KEPT else []
            live.append(numbers)

            async def burst(numbers: list[int] = numbers, retiring: list[int] = retiring) -> None:
                batches = 4
                for batch in range(batches):
                    for n in numbers[batch::batches]:
                        replicas.create(n)
                    for n in retiring[batch::batches]:
                        replicas.delete(n)
                    await asyncio.sleep(burst_s / batches)

            async def lose(loss: int = loss) -> None:
                await asyncio.sleep(rng.uniform(0.0, burst_s))
                pause = rng.uniform(0.5, 2.5)
                names = system.nats_names()
                note(
                    f"store loss {loss}: SIGKILL {', '.join(names)}, wipe, restart in {pause:.1f} s"
                )
                down_at = clock()
                for name in names:
                    await asyncio.to_thread(system.wipe_nats_store, name)
                await asyncio.sleep(pause)
                for name in names:
                    system.restart(name)
                outages.append(
                    Outage("nats-server", down_at=down_at, up_at=clock(), store_lost=True)
                )

            await asyncio.gather(burst(), lose())
            await until(lambda: store_restored(system), timeout=120.0, what="the store restored")
            expected = sum(len(r) for r in live)

            def all_running(expected: int = expected) -> bool:
                current = system.cluster.pods(NAMESPACE)
                return len(current) == expected and all(phase(p) == "Running" for p in current)

            try:
                await until(all_running, timeout=300.0, what="every pod Running", interval=0.2)
            except AssertionError:
                stuck = [
                    (p["metadata"]["name"], phase(p), pending_message(p))
                    for p in system.cluster.pods(NAMESPACE)
                    if phase(p) != "Running"
                ]
                raise AssertionError(f"loss {loss}: not every pod Running: {stuck[:10]}") from None
            over = system.cluster.overcommits()
            assert not over, f"loss {loss}: GPUs over-committed: {over[:5]}"
            unexplained = [f for f in replicas.replaced if not any(o.explains(f) for o in outages)]
            assert not unexplained, f"loss {loss}: pods failed outside a store loss: {unexplained}"
            await assert_exact(system, system.cluster.pods(NAMESPACE))
            round_s.append(clock() - round_started)
            note(f"loss {loss}: {expected} pods Running and exact, none over-committed")
        final = system.cluster.pods(NAMESPACE)
        await assert_no_record_stuck(
            system, {p["metadata"]["uid"]: p["spec"].get("nodeName") or "" for p in final}
        )
    finally:
        replacer.cancel()
    ordered = sorted(round_s)
    return {
        "seed": seed,
        "store_losses": len(outages),
        "pods_created": created,
        "pods_running_at_end": len(final),
        "pods_failed_replaced": len(replicas.replaced),
        "failed_reasons": sorted({f.reason for f in replicas.replaced}),
        "gpus_overcommitted": len({(o.node, o.gpu) for o in system.cluster.overcommits()}),
        "every_round_exact": True,  # a container off its record's slices ends the run
        "round_s_median": round(ordered[len(ordered) // 2], 1),
        "wall_s": round(clock(), 1),
    }


async def run_store_losses(seed: int, args: argparse.Namespace) -> dict[str, object]:
    options = system_options(args, f"tessera-store-losses-{seed}-")
    async with LocalSystem(options) as system:
        figures = await store_loss_loop(
            system,
            losses=args.store_losses,
            seed=seed,
            burst_pods=args.burst_pods,
            burst_s=args.burst_s,
        )
        violations = system.bus_violations()
    if violations:
        raise SystemExit(f"seed {seed}: NATS permissions broken: {violations[:5]}")
    return {
        **figures,
        "nats_servers": args.nats_servers,
        "nodes": args.nodes,
        "placers": args.placers,
        **binder_repairs(options.run_dir),
        "run_dir": str(options.run_dir),
    }


async def main(args: argparse.Namespace) -> None:
    for seed in (int(s) for s in args.seeds.split(",")):
        run = run_store_losses if args.store_losses else run_seed
        print(json.dumps(await run(seed, args)), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10, help="GPU nodes of 4 A100-80GB (10)")
    parser.add_argument("--pods", type=int, default=400, help="pods per seed (400)")
    parser.add_argument(
        "--window", type=float, default=30.0, help="seconds the pods and kills spread over (30)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="kills of each target (3)")
    parser.add_argument("--seeds", default="1,2,3", help="comma-separated seeds (1,2,3)")
    parser.add_argument("--placers", type=int, default=3, help="placer replicas (3)")
    parser.add_argument(
        "--pools", type=int, default=0, help="the placers' --pools; 0 = one per placer (0)"
    )
    parser.add_argument("--nats-servers", type=int, default=1, help="1, or 3 for a cluster (1)")
    parser.add_argument(
        "--store-losses",
        type=int,
        default=0,
        help="run the store-loss loop instead: this many losses of the whole store, one per "
        "burst (0: the kill chaos)",
    )
    parser.add_argument(
        "--burst-pods", type=int, default=24, help="store-loss loop: pods per burst (24)"
    )
    parser.add_argument(
        "--burst-s", type=float, default=4.0, help="store-loss loop: seconds per burst (4)"
    )
    asyncio.run(main(parser.parse_args()))
