"""A booking's write as its node fills: one whole-node entry against one key per booking.

    .venv/bin/python benchmarks/ledger_writes.py [--held 10,40,160] [--writes 1000]

One nats-server; one node already holding ``--held`` bookings (``Booking`` values as a placer
writes them, one share each). Each measured write books one more pod, the next takes it off
again, so the node stays at that size. Two forms, one after the other for each size:

- ``entry``: the node's whole ``NodeLedger`` by compare-and-set (the ledger before issue 23's
  item 2: every booking of the node in one value);
- ``keys``: the pod's ``Booking`` under its own key, written, then deleted, each guarded at the
  latest revision among the node's keys (``KvWrite.guard``; the ledger now).

A second process watches the bucket and decodes every delivery as a placer replica's view does.
Prints, per size and form: the bytes a booking writes, p50 and p99 latency of a write, and the
CPU per write of the writer, of nats-server and of the watcher.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import platform
import statistics
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from shared import codec, subjects  # noqa: E402
from shared.messages.ledger import Booking, NodeLedger  # noqa: E402
from shared.runtime.bus import KvWrite  # noqa: E402
from shared.runtime.nats import NatsBus  # noqa: E402
from tests.harness.nats import NatsServer, connect_when_ready  # noqa: E402
from tests.harness.procstat import cpu_seconds  # noqa: E402
from tests.placer.test_translate import booking  # noqa: E402

NODE = "n1"
END = "end"
"""A key written after the measured writes: the watcher has decoded them all once it sees it."""


def cpu_s() -> float:
    return time.process_time()


async def watch(url: str, control: Connection) -> None:
    """Decode every delivery; at each write of the key ``END``, send the CPU spent since the
    last one (or since the watch caught up)."""
    bus = await NatsBus.connect(url, name="watcher")
    started = 0.0
    async for entry in bus.kv_watch(subjects.KV_LEDGER):
        if entry is None or entry.key == END:
            if entry is not None:
                control.send(cpu_s() - started)
            else:
                control.send(0.0)  # caught up
            started = cpu_s()
        elif not entry.deleted:
            codec.decode(entry.value, Booking if "." in entry.key else NodeLedger)


def watcher(url: str, control: Connection) -> None:
    asyncio.run(watch(url, control))


class Node:
    """One node holding ``held`` bookings, written in one form."""

    def __init__(self, bus: NatsBus, form: str, held: int) -> None:
        self.bus, self.form = bus, form
        self.held = [booking(f"held-{n}", (n % 8, 4096, 100)) for n in range(held)]
        self.revision = 0
        self.pods = 0
        self.sizes: list[int] = []

    async def fill(self) -> None:
        if self.form == "entry":
            ledger = NodeLedger(node=NODE, bookings=tuple(self.held))
            self.revision = await self.bus.kv_put(subjects.KV_LEDGER, NODE, codec.encode(ledger))
            return
        for held in self.held:
            key = subjects.booking_key(NODE, held.pod_uid)
            self.revision = await self.bus.kv_put(subjects.KV_LEDGER, key, codec.encode(held))

    async def book_and_take_off(self) -> None:
        """Two writes: one pod booked, then taken off."""
        self.pods += 1
        pod = booking(f"pod-{self.pods}", (self.pods % 8, 4096, 100))
        if self.form == "entry":
            for bookings in ((*self.held, pod), tuple(self.held)):
                data = codec.encode(NodeLedger(node=NODE, bookings=bookings))
                if len(bookings) > len(self.held):
                    self.sizes.append(len(data))
                landed = await self.bus.kv_update(
                    subjects.KV_LEDGER, NODE, data, revision=self.revision
                )
                assert landed is not None
                self.revision = landed
            return
        key, guard = subjects.booking_key(NODE, pod.pod_uid), subjects.node_bookings(NODE)
        data = codec.encode(pod)
        self.sizes.append(len(data))
        written = await self.bus.kv_write_all(
            subjects.KV_LEDGER, [KvWrite(key, data, self.revision, guard=guard)]
        )
        assert written is not None
        marker = await self.bus.kv_delete_if(
            subjects.KV_LEDGER, key, revision=written[0], guard=guard
        )
        assert marker is not None
        self.revision = marker


async def run(held: int, form: str, writes: int) -> dict[str, float]:
    with NatsServer() as nats:
        bus = await connect_when_ready(nats.url, name="bench-ledger-writes", replicas=1)
        node = Node(bus, form, held)
        await node.fill()
        ours, theirs = multiprocessing.Pipe()
        process = multiprocessing.Process(target=watcher, args=(nats.url, theirs))
        process.start()
        ours.recv()  # its watch caught up
        for _ in range(20):  # warm-up
            await node.book_and_take_off()
        node.sizes.clear()
        await bus.kv_put(subjects.KV_LEDGER, END, b"")
        await asyncio.to_thread(ours.recv)  # the warm-up's deliveries
        latencies: list[float] = []
        own, server = cpu_s(), cpu_seconds(nats.pid)
        for _ in range(writes // 2):
            start = time.perf_counter()
            await node.book_and_take_off()
            latencies.append((time.perf_counter() - start) / 2)
        own, server = cpu_s() - own, cpu_seconds(nats.pid) - server
        await bus.kv_put(subjects.KV_LEDGER, END, b"")
        watched = await asyncio.to_thread(ours.recv)
        process.kill()
        await bus.drain()
    cuts = statistics.quantiles(latencies, n=100)
    return {
        "bytes": statistics.mean(node.sizes),
        "p50": cuts[49] * 1000,
        "p99": cuts[98] * 1000,
        "writer": own / writes * 1000,
        "server": server / writes * 1000,
        "watcher": watched / writes * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--held", default="10,40,160", help="bookings already on the node")
    parser.add_argument("--writes", type=int, default=1000, help="measured writes of each form")
    args = parser.parse_args()
    print(
        f"machine: {platform.machine()}, {len(__import__('os').sched_getaffinity(0))} cores, "
        f"CPython {platform.python_version()}; {args.writes} writes of each form and size"
    )
    print(
        "| bookings on the node | form | bytes a booking writes | p50 | p99 | "
        "CPU ms a write: writer / nats-server / watcher |"
    )
    print("|---|---|---|---|---|---|")
    for held in (int(n) for n in args.held.split(",")):
        for form in ("entry", "keys"):
            f = asyncio.run(run(held, form, args.writes))
            print(
                f"| {held} | {form} | {f['bytes']:,.0f} | {f['p50']:.2f} ms | {f['p99']:.2f} ms "
                f"| {f['writer']:.3f} / {f['server']:.3f} / {f['watcher']:.3f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
