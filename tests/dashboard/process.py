"""The real ``tessera dashboard`` process, and the headless browser that looks at it.

Shared by the process and browser tests and by ``benchmarks/dashboard.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from shared.runtime.nats import NatsBus
from tests.harness.nats import environment_without_proxies

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


@dataclass
class DashboardProcess:
    process: subprocess.Popen[bytes]
    url: str
    log: Path

    def get_json(self, path: str) -> tuple[int, Any]:
        try:
            with urllib.request.urlopen(self.url + path.lstrip("/"), timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())


def _wait(condition: Callable[[], Any], *, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@contextlib.contextmanager
def dashboard_process(
    nats_url: str, *args: str, timeout: float = 30.0
) -> Iterator[DashboardProcess]:
    """``tessera dashboard`` on a free port, ready (every KV bucket loaded); SIGTERM after."""
    folder = Path(tempfile.mkdtemp(prefix="dashboard-"))
    log = folder / "dashboard.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tessera.cli",
                "dashboard",
                "--nats-url",
                nats_url,
                "--http-host",
                "127.0.0.1",
                "--http-port",
                "0",
                *args,
            ],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=sink,
            env=environment_without_proxies(),
        )
    try:

        def alive() -> None:
            if process.poll() is not None:
                raise AssertionError(f"dashboard exited {process.returncode}: {log.read_text()}")

        def started() -> dict[str, Any] | None:
            alive()
            for line in log.read_text().splitlines():
                if '"service starting"' in line:
                    return dict(json.loads(line))
            return None

        line = _wait(started, timeout=timeout, what="the 'service starting' line")
        running = DashboardProcess(
            process=process, url=f"http://127.0.0.1:{line['http_port']}/", log=log
        )

        def ready() -> bool:
            alive()
            return running.get_json("/readyz")[0] == 200

        _wait(ready, timeout=timeout, what="/readyz")
        yield running
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        shutil.rmtree(folder, ignore_errors=True)


def on_bus(nats_url: str, work: Callable[[NatsBus], Awaitable[None]]) -> None:
    """Run ``work`` with a fresh connection to ``nats_url`` (from synchronous code)."""

    async def run() -> None:
        bus = await NatsBus.connect(nats_url, name="tessera-test-writer")
        try:
            await work(bus)
        finally:
            await bus.drain()

    asyncio.run(run())


def browser_missing() -> str | None:
    """Why no browser test can run here, or None."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        return f"{' and '.join(missing)} missing: run `bash scripts/browser` (apt-get as root)"
    return None


def require_browser() -> None:
    """Fail the calling test when the browser is missing: it is part of the setup, and a test
    that skips itself where it cannot run would let CI pass without it. A developer without
    root opts out with TESSERA_SKIP_BROWSER=1 (the test is then skipped, saying so)."""
    why = browser_missing()
    if why is None:
        return
    if os.environ.get("TESSERA_SKIP_BROWSER") == "1":
        pytest.skip(f"TESSERA_SKIP_BROWSER=1: {why}")
    pytest.fail(f"the browser test needs the browser: {why}", pytrace=False)


@contextlib.contextmanager
def chromium(width: int = 1440, height: int = 1000) -> Iterator[Any]:
    """Headless Debian chromium driven by its chromedriver, with a fresh profile."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--window-size={width},{height}")
    options.add_argument(f"--user-data-dir={profile}")
    driver = webdriver.Chrome(
        options=options, service=Service(str(CHROMEDRIVER), env=dict(os.environ))
    )
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def wait_in_page(driver: Any, script: str, *, timeout: float = 30.0, what: str = "") -> Any:
    """Evaluate ``return <script>`` in the page until it is truthy."""
    return _wait(lambda: driver.execute_script(f"return {script}"), timeout=timeout, what=what)


SLICES_IN_PAGE = """
return Array.from(document.querySelectorAll('#nodes .bar.mem .slice')).map((el) => {
  const gpu = el.closest('.gpu');
  return [gpu.dataset.node, gpu.dataset.gpuUuid, el.dataset.podUid, el.dataset.namespace,
          Number(el.dataset.memoryMib), Number(el.dataset.cores), el.dataset.state];
});
"""
