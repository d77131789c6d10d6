"""A booking and its claim: two serial KV writes against one atomic batch (``Bus.kv_write_all``).

    .venv/bin/python benchmarks/kv_batch.py [--commits 2000] [--nats-servers 1,3]

For each server count (one nats-server, or a JetStream cluster on loopback with every bucket
replicated on each server): ``--commits`` commits, one after the other, each the two writes a
placer makes to commit a pod on a node: the pod's booking, guarded at the revision of the node's
bookings, and the pod's claim, create-only. Once as two round trips, the booking then the claim
(the protocol on a single server), once as one atomic batch (on a replicated store); the two
forms alternate in rounds of 100 commits so that both see the same machine. Prints the latency
of a commit (p50, p90, p99) and the CPU per commit of this process and of the nats-servers.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from shared import subjects  # noqa: E402
from shared.runtime.bus import KvWrite  # noqa: E402
from shared.runtime.nats import NatsBus  # noqa: E402
from tests.harness.nats import NatsCluster, NatsServer, connect_when_ready  # noqa: E402
from tests.harness.procstat import cpu_seconds  # noqa: E402

ROUND = 100
NODES = 50
LEDGER = b"x" * 460
"""About one booking."""
CLAIM = b"y" * 700


class Commits:
    """Commits of one form on fresh pods, round-robin over ``NODES`` nodes."""

    def __init__(self, bus: NatsBus, form: str) -> None:
        self.bus = bus
        self.form = form
        self.revisions: dict[str, int] = {}
        self.pods = 0

    async def one(self) -> None:
        self.pods += 1
        node, pod = f"{self.form}-node-{self.pods % NODES}", f"{self.form}-pod-{self.pods}"
        claim = subjects.claim_key(pod)
        booking = KvWrite(
            subjects.booking_key(node, pod),
            LEDGER,
            self.revisions.get(node, 0),
            guard=subjects.node_bookings(node),
        )
        if self.form == "batch":
            landed = await self.bus.kv_write_all(
                subjects.KV_LEDGER, [booking, KvWrite(claim, CLAIM, 0)]
            )
            assert landed is not None
            self.revisions[node] = landed[0]
            return
        booked = await self.bus.kv_write_all(subjects.KV_LEDGER, [booking])
        assert booked is not None
        self.revisions[node] = booked[0]
        assert await self.bus.kv_create(subjects.KV_LEDGER, claim, CLAIM) is not None


async def run(servers: int, commits: int) -> dict[str, dict[str, float]]:
    nats = NatsServer() if servers == 1 else NatsCluster(servers)
    with nats:
        bus = await connect_when_ready(nats.url, name="bench-kv-batch", replicas=servers)
        pids = [s.pid for s in (nats.servers if isinstance(nats, NatsCluster) else [nats])]
        forms = {form: Commits(bus, form) for form in ("serial", "batch")}
        latencies: dict[str, list[float]] = {form: [] for form in forms}
        cpu = {form: [0.0, 0.0] for form in forms}
        for _ in range(ROUND):  # warm-up, not counted
            for commit in forms.values():
                await commit.one()
        for _ in range(commits // ROUND):
            for form, commit in forms.items():
                own, server = time.process_time(), sum(cpu_seconds(p) for p in pids)
                for _ in range(ROUND):
                    start = time.perf_counter()
                    await commit.one()
                    latencies[form].append(time.perf_counter() - start)
                cpu[form][0] += time.process_time() - own
                cpu[form][1] += sum(cpu_seconds(p) for p in pids) - server
        await bus.drain()
    result: dict[str, dict[str, float]] = {}
    for form, seen in latencies.items():
        cuts = statistics.quantiles(seen, n=100)
        result[form] = {
            "p50": cuts[49] * 1000,
            "p90": cuts[89] * 1000,
            "p99": cuts[98] * 1000,
            "client": cpu[form][0] / len(seen) * 1000,
            "servers": cpu[form][1] / len(seen) * 1000,
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--commits", type=int, default=2000, help="commits of each form")
    parser.add_argument(
        "--nats-servers", default="1,3", help="comma-separated server counts (1, 3)"
    )
    args = parser.parse_args()
    print(
        f"machine: {platform.machine()}, {len(__import__('os').sched_getaffinity(0))} cores, "
        f"CPython {platform.python_version()}; {args.commits} commits of each form"
    )
    print("| servers | form | p50 | p90 | p99 | CPU ms per commit: this process / nats-servers |")
    print("|---|---|---|---|---|---|")
    for servers in (int(n) for n in args.nats_servers.split(",")):
        result = asyncio.run(run(servers, args.commits))
        for form, figures in result.items():
            print(
                f"| {servers} | {form} | {figures['p50']:.2f} ms | {figures['p90']:.2f} ms | "
                f"{figures['p99']:.2f} ms | {figures['client']:.2f} / {figures['servers']:.2f} |"
            )
        ratio = result["batch"]["p50"] / result["serial"]["p50"]
        print(f"  batch / serial p50: {ratio:.2f}")


if __name__ == "__main__":
    main()
