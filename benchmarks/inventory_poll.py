"""What one inventory poll costs: the pure core, the NVML adapter (over the C stub), the message.

Run: ``.venv/bin/python benchmarks/inventory_poll.py`` (needs gcc for the NVML stub). Prints the
median of several rounds; the core's figure is per poll of a whole node.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.inventory import snapshot
from services.inventory.fake import FakeReader, parse_fake_gpus
from services.inventory.nvml import NvmlReader
from shared import codec
from tests.inventory.stub import NvmlStub, StubGpu, build_stub

ROUNDS = 5


def median_us(samples: list[float]) -> float:
    return statistics.median(samples) * 1e6


async def core_per_poll(gpus: int, polls: int = 2000) -> tuple[float, int]:
    """Seconds per apply_reading + next_publication, and the snapshot's encoded size."""
    reader = FakeReader(parse_fake_gpus(f"{gpus}xA100-80GB"), node="bench-node")
    readings = []
    for step in range(polls):
        for index in range(gpus):
            reader.set_load(
                index,
                utilization_pct=(step + index) % 7,
                memory_used_mib=1000 + (step * 37 + index) % 200,
            )
        readings.append(await reader.read())
    policy = snapshot.Policy()
    state = snapshot.InventoryState()
    started = time.perf_counter()
    size = 0
    for step, reading in enumerate(readings):
        state = snapshot.apply_reading(state, reading, now=step * 2.0, policy=policy)
        publication = snapshot.next_publication(
            state,
            node="bench-node",
            backend="fake",
            observed_at=step * 2.0,
            now=step * 2.0,
            policy=policy,
        )
        if publication.reason is not None:
            state = publication.state
            size = len(codec.encode(publication.inventory))
    return (time.perf_counter() - started) / polls, size


async def nvml_read(gpus: int, reads: int = 200) -> float:
    """Seconds per NvmlReader.read of ``gpus`` stub GPUs (topology cached after the first)."""
    directory = Path(tempfile.mkdtemp(prefix="nvml-bench-"))
    stub = NvmlStub(
        library=build_stub(directory),
        gpus=[
            StubGpu(
                uuid=f"GPU-bench-{i}",
                bus_id=f"00000000:{0x10 + i:02X}:00.0",
                nvlinks=tuple((link, (i + 1) % gpus) for link in range(4)),
                processes=((1000 + i, 512),),
            )
            for i in range(gpus)
        ],
        topology={(a, b): 10 for a in range(gpus) for b in range(gpus) if a != b},
    )
    stub.write()
    reader = NvmlReader(library=str(stub.library))
    await reader.open()
    try:
        await reader.read()
        started = time.perf_counter()
        for _ in range(reads):
            await reader.read()
        return (time.perf_counter() - started) / reads
    finally:
        await reader.close()


async def main() -> None:
    for gpus in (1, 8, 16):
        rounds = [await core_per_poll(gpus) for _ in range(ROUNDS)]
        per_poll = median_us([seconds for seconds, _ in rounds])
        print(
            f"core: {gpus:2d} GPUs: {per_poll:7.1f} us per poll (apply_reading + "
            f"next_publication); snapshot {rounds[0][1]} bytes"
        )
    per_read = median_us([await nvml_read(8) for _ in range(ROUNDS)])
    print(f"nvml adapter over the C stub: 8 GPUs: {per_read / 1000:.2f} ms per read")


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    asyncio.run(main())
