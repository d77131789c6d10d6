"""A longer chaos run than CI's: pods through the whole system while services are SIGKILLed.

    .venv/bin/python benchmarks/chaos.py [--nodes 10] [--pods 400] [--window 30] [--rounds 3]
        [--seeds 1,2,3] [--placers 3] [--pools 0] [--nats-servers 1]

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
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.binder.sync import SETTLED, WITHDREW
from tessera.up.spec import plan_nodes
from tessera.up.system import LocalSystem, SystemOptions
from tests.e2e.chaos import TARGETS, chaos_run

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


async def run_seed(seed: int, args: argparse.Namespace) -> dict[str, object]:
    pools = args.pools or args.placers
    options = SystemOptions(
        nodes=plan_nodes("4xA100-80GB", args.nodes),
        run_dir=Path(tempfile.mkdtemp(prefix=f"tessera-chaos-{seed}-")),
        placers=args.placers,
        binders=2,
        dashboard=False,
        webhook=False,
        binder_args=FAST_LEASE,
        placer_args=("--pools", str(pools)) if pools > 1 else (),
        nats_servers=args.nats_servers,
        ready_timeout_s=300.0,
    )
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


async def main(args: argparse.Namespace) -> None:
    for seed in (int(s) for s in args.seeds.split(",")):
        print(json.dumps(await run_seed(seed, args)), flush=True)


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
    asyncio.run(main(parser.parse_args()))
