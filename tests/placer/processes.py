"""Real ``tessera placer`` processes for tests: started over the test's nats-server, logging to a
file, their HTTP port read from the ``service starting`` log line."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from pathlib import Path
from typing import BinaryIO

from shared.runtime.nats import NatsBus
from tests.harness.nats import environment_without_proxies
from tests.harness.store import mark_restored
from tests.placer.conftest import http_get

ROOT = Path(__file__).resolve().parents[2]


async def start(
    nats_url: str, number: int, logs: Path, *options: str
) -> tuple[asyncio.subprocess.Process, int]:
    """A ``tessera placer`` process logging to ``logs``; its HTTP port once it started. No
    binder runs beside it: the store is first said to hold every bound placement (as the binder
    would), or the placer would wait for it."""
    marker = await NatsBus.connect(nats_url, name="tessera-test")
    try:
        await mark_restored(marker)
    finally:
        await marker.drain()
    log_file = logs / f"placer-{number}.log"
    with log_file.open("wb") as stderr:  # the child keeps its own copy of the descriptor
        process = await _spawn(nats_url, number, stderr, *options)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for line in log_file.read_text().splitlines():
            if '"service starting"' in line:
                return process, int(json.loads(line)["http_port"])
        assert process.returncode is None, log_file.read_text()[-2000:]
        await asyncio.sleep(0.05)
    raise AssertionError(f"placer {number} did not start: {log_file.read_text()[-2000:]}")


async def _spawn(
    nats_url: str, number: int, stderr: BinaryIO, *options: str
) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tessera.cli",
        "placer",
        "--nats-url",
        nats_url,
        "--http-host",
        "127.0.0.1",
        "--http-port",
        "0",
        "--placer-id",
        f"placer-{number}",
        "--ack-wait-s",
        "3",
        "--reconcile-interval-s",
        "2",
        "--inventory-stale-s",
        "3600",
        *options,
        cwd=ROOT,
        env=environment_without_proxies(),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=stderr,
    )


async def ready(port: int) -> bool:
    try:
        status, _ = await http_get(port, "/readyz")
    except Exception:
        return False
    return status == 200


async def stop_all(processes: list[asyncio.subprocess.Process]) -> list[int]:
    """SIGTERM every placer still running (SIGCONT first: a stopped one would never act on it),
    wait for each, SIGKILL one that has not exited within 30 s; their exit codes."""
    for process in processes:
        if process.returncode is None:
            process.send_signal(signal.SIGCONT)
            process.send_signal(signal.SIGTERM)
    codes = []
    for process in processes:
        try:
            codes.append(await asyncio.wait_for(process.wait(), 30))
        except TimeoutError:
            process.kill()
            codes.append(await process.wait())
    return codes
