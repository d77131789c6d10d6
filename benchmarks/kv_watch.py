"""KV listings and watches: whole, and what they cost, against nats-py's own watcher.

    .venv/bin/python benchmarks/kv_watch.py [--keys 10000] [--rounds 5] [--listings 500]

Two figures, each for ``NatsBus`` (``shared/runtime/nats/``) and for nats-py's ``KeyValue``
beside it, on one real ``nats-server``:

- initial values: the time from starting a watch over ``--keys`` keys (1.5 KB each, the size of
  a node's inventory) to its "initial values done" marker, median of ``--rounds``;
- short listings: ``--listings`` listings of a bucket of 5 keys while three tasks of a second
  connection keep writing three of them; how many listings missed a key. nats-py's
  ``KeyValue.keys()`` can mark the initial values done before they arrived (nats.py issue 842).
  (nats-py's listings each leave a consumer on the server for 5 minutes, and a stream holds at
  most 1,000: keep ``--listings`` below that.)
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import nats.js.errors

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shared import subjects
from shared.runtime.nats import NatsBus
from tests.harness.nats import NatsServer


async def initial_values_s(bus: NatsBus, bucket: str, *, ours: bool) -> tuple[float, int]:
    """Seconds until the watch's initial values are done, and how many came."""
    started = time.perf_counter()
    count = 0
    if ours:
        watch = bus.kv_watch(bucket)
        async for entry in watch:
            if entry is None:
                break
            count += 1
        await watch.aclose()  # type: ignore[attr-defined]
    else:
        watcher = await (await bus._bucket(bucket)).watch(">")
        async for entry in watcher:
            if entry is None:
                break
            count += 1
        await watcher.stop()
    return time.perf_counter() - started, count


async def short_listings(bus: NatsBus, writer: NatsBus, listings: int, *, ours: bool) -> int:
    """How many of ``listings`` listings of 5 keys (3 of them written meanwhile) missed a key."""
    bucket = subjects.KV_ASSIGNMENTS
    keys = {f"bench.k{i}" for i in range(5)}
    for key in keys:
        await writer.kv_put(bucket, key, b"0")
    kv = await bus._bucket(bucket)
    stop = asyncio.Event()

    async def write(key: str) -> None:
        while not stop.is_set():
            await writer.kv_put(bucket, key, b"x" * 100)

    writers = [asyncio.create_task(write(key)) for key in sorted(keys)[:3]]
    short = 0
    try:
        for _ in range(listings):
            if ours:
                listed = set(await bus.kv_keys(bucket))
            else:
                try:
                    listed = set(await kv.keys())
                except nats.js.errors.NoKeysError:
                    listed = set()
            short += not keys <= listed
    finally:
        stop.set()
        await asyncio.gather(*writers)
    return short


async def main(args: argparse.Namespace) -> None:
    with NatsServer() as server:
        bus = await NatsBus.connect(server.url, name="bench-reader")
        writer = await NatsBus.connect(server.url, name="bench-writer")
        bucket = subjects.KV_INVENTORY
        value = b"v" * 1500
        for start in range(0, args.keys, 1000):
            batch = range(start, min(args.keys, start + 1000))
            await asyncio.gather(*(writer.kv_put(bucket, f"node-{i:06d}", value) for i in batch))
        print(f"initial values of {args.keys} keys, median of {args.rounds} (s):")
        for name, ours in (("NatsBus.kv_watch", True), ("nats-py KeyValue.watch", False)):
            runs = [await initial_values_s(bus, bucket, ours=ours) for _ in range(args.rounds)]
            counts = {count for _, count in runs}
            median = statistics.median(seconds for seconds, _ in runs)
            print(f"  {name:24} {median:.3f}  (values seen: {sorted(counts)})")
        print(f"listings of 5 keys under writes that missed a key, of {args.listings}:")
        for name, ours in (("NatsBus.kv_keys", True), ("nats-py KeyValue.keys", False)):
            short = await short_listings(bus, writer, args.listings, ours=ours)
            print(f"  {name:24} {short}  ({100 * short / args.listings:.1f} %)")
        await writer.drain()
        await bus.drain()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=10_000, help="keys in the watched bucket")
    parser.add_argument("--rounds", type=int, default=5, help="watches timed")
    parser.add_argument("--listings", type=int, default=500, help="short listings under writes")
    asyncio.run(main(parser.parse_args()))
