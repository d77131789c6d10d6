"""The NVML adapter against a real NVIDIA driver; skipped where there is none.

It runs in a child process: the other tests preload the C stub into this one, and pynvml keeps the
first library it loaded for the life of a process.
"""

from __future__ import annotations

import ctypes.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

READ_REAL_GPUS = """
import asyncio, json, msgspec
from services.inventory.nvml import NvmlReader

async def main():
    reader = NvmlReader()
    await reader.open()
    try:
        reading = await reader.read()
        event = await reader.wait_event(0.2)
    finally:
        await reader.close()
    print(json.dumps({"reading": msgspec.to_builtins(reading), "event": repr(event)}))

asyncio.run(main())
"""


@pytest.mark.gpu
@pytest.mark.skipif(
    ctypes.util.find_library("nvidia-ml") is None,
    reason="no NVIDIA driver (libnvidia-ml) on this machine",
)
def test_reads_the_real_gpus() -> None:
    result = subprocess.run(
        [sys.executable, "-c", READ_REAL_GPUS],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    print(result.stdout)  # quoted in the closing note when a GPU machine runs this
    reading = json.loads(result.stdout)["reading"]
    assert reading["driver_version"]
    assert reading["gpus"] or reading["faults"]
    for gpu in reading["gpus"]:
        assert gpu["uuid"].startswith(("GPU-", "MIG-"))
        assert gpu["memory_total_mib"] > 0
        assert gpu["memory_used_mib"] + gpu["memory_free_mib"] <= gpu["memory_total_mib"]
        assert 0 <= gpu["utilization_pct"] <= 100
        assert gpu["sm_clock_max_mhz"] > 0
        assert gpu["pci_bus_id"]
        assert len(gpu["links"]) == len(reading["gpus"]) - 1
