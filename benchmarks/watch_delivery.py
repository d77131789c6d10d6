"""What one KV watch delivery costs the watching process: CPU per 1,000 entries.

    .venv/bin/python benchmarks/watch_delivery.py [--entries 20000] [--keys 500] [--size 300]

One real ``nats-server``; a writer process puts ``--entries`` values of ``--size`` bytes over
``--keys`` keys of the ledger bucket while a watcher process (``NatsBus.kv_watch``, as every
service follows its buckets) receives them; the watcher's own CPU seconds (user + system) from
its initial values to the last entry, per 1,000 entries. Every service pays this for every write
it follows, so it is a floor under the control plane's CPU per pod.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import resource
import sys
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shared import subjects
from shared.runtime.nats import NatsBus
from tests.harness.nats import NatsServer


def cpu_s() -> float:
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime


async def watch(url: str, entries: int, ready: Event, result: Queue[float]) -> None:
    bus = await NatsBus.connect(url, name="watcher")
    received, started = 0, 0.0
    async for entry in bus.kv_watch(subjects.KV_LEDGER):
        if entry is None:
            started = cpu_s()
            ready.set()
            continue
        received += 1
        if received == entries:
            break
    result.put(cpu_s() - started)
    await bus.drain()


def watcher(url: str, entries: int, ready: Event, result: Queue[float]) -> None:
    asyncio.run(watch(url, entries, ready, result))


async def write(url: str, args: argparse.Namespace, ready: Event) -> None:
    bus = await NatsBus.connect(url, name="writer")
    await asyncio.to_thread(ready.wait)  # a process's event: waited on in a thread
    value = b"x" * args.size
    for i in range(args.entries):
        await bus.kv_put(subjects.KV_LEDGER, f"node-{i % args.keys}", value)
    await bus.drain()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=20_000, help="values written and watched")
    parser.add_argument("--keys", type=int, default=500, help="keys they are spread over")
    parser.add_argument("--size", type=int, default=300, help="bytes per value")
    args = parser.parse_args()
    with NatsServer() as server:
        ready = multiprocessing.Event()
        result: Queue[float] = multiprocessing.Queue()
        process = multiprocessing.Process(
            target=watcher, args=(server.url, args.entries, ready, result)
        )
        process.start()
        asyncio.run(write(server.url, args, ready))
        used = result.get(timeout=300)
        process.join()
    print(f"watcher CPU per 1,000 entries: {used / args.entries * 1e6:.1f} ms")


if __name__ == "__main__":
    main()
