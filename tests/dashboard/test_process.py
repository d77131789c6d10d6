"""The real ``tessera dashboard`` process: help, configuration errors, a clean stop, a restart."""

from __future__ import annotations

import signal
import subprocess
import sys

from shared.runtime.nats import NatsBus
from tests.dashboard.builders import synthetic_cluster, write_cluster
from tests.dashboard.process import ROOT, dashboard_process, on_bus
from tests.harness.nats import NatsServer


def tessera(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tessera.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_help_names_the_api_and_every_setting() -> None:
    result = tessera("dashboard", "--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    for words in (
        "/api/v1/cluster",
        "/api/v1/pods/pending",
        "--http-port HTTP_PORT port of the page, the JSON API",
        "--push-interval-s",
        "env TESSERA_INVENTORY_STALE_S; default: 60.0",
        "--stats-stale-s",
        "--pending-rows",
        "Read-only; it needs no Kubernetes access",
    ):
        assert words in text


def test_a_bad_setting_is_one_line_and_exit_2() -> None:
    result = tessera("dashboard", "--push-interval-s", "0")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "tessera dashboard: configuration error: --push-interval-s (command line): "
        "Expected `float` > 0.0"
    )


def test_sigterm_stops_it_cleanly_and_a_restart_shows_the_same_cluster(
    nats_server: NatsServer,
) -> None:
    cluster = synthetic_cluster(3, 2, pending=0)

    async def seed(bus: NatsBus) -> None:
        await write_cluster(bus, cluster)

    on_bus(nats_server.url, seed)
    with dashboard_process(nats_server.url) as first:
        status, before = first.get_json("/api/v1/cluster")
        assert status == 200
        assert len(before["nodes"]) == 3
        first.process.kill()  # no goodbye: the next one must rebuild everything from NATS
        first.process.wait()
    with dashboard_process(nats_server.url) as second:
        status, after = second.get_json("/api/v1/cluster")
        assert status == 200
        assert after["nodes"] == before["nodes"]
        assert after["totals"] == before["totals"]
        second.process.send_signal(signal.SIGTERM)
        assert second.process.wait(timeout=20) == 0
        log = second.log.read_text()
        assert '"service stopped"' in log
        assert "Traceback" not in log
