"""``tessera placer``: its help, its configuration errors (real process, exit code 2), and
what its settings make of the configuration."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from services.placer.command import PlacerSettings, build_config

ROOT = Path(__file__).resolve().parents[2]


def tessera(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tessera.cli", "placer", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_help_lists_every_placer_setting_with_its_environment_variable() -> None:
    text = " ".join(tessera("--help").stdout.split())
    for expected in (
        "--profile PROFILE",
        "built-in name (tessera, fgd, bestfit",
        "env TESSERA_PROFILE; default: tessera",
        "--placer-id",
        "--tenancy-file",
        "env TESSERA_RESERVE_TIMEOUT_S; default: 120.0",
        "env TESSERA_RELEASE_RETENTION_S; default: 3600.0",
        "env TESSERA_INVENTORY_STALE_S; default: 30.0",
        "env TESSERA_MAX_COMMIT_RETRIES; default: 8",
        "env TESSERA_TASK_MIX_WINDOW; default: 2000",
        "--ack-wait-s",
        "--reconcile-interval-s",
        "GET /v1/pods/<uid>",
    ):
        assert expected in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["--profile", "fastest"], "is neither a built-in profile", id="profile"),
        pytest.param(
            ["--tenancy-file", "/nonexistent/t.json"],
            "cannot read the tenancy file /nonexistent/t.json",
            id="tenancy-missing",
        ),
        pytest.param(["--task-mix-window", "0"], "--task-mix-window (command line)", id="window"),
        pytest.param(["--reserve-timeout-s", "-1"], "--reserve-timeout-s", id="timeout"),
    ],
)
def test_configuration_errors_are_one_line_and_exit_2(args: list[str], message: str) -> None:
    result = tessera(*args, "--nats-url", "nats://127.0.0.1:1")
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("tessera placer: configuration error: ")
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_a_bad_tenancy_file_at_start_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "tenancy.json"
    bad.write_text('{"quotas": [{"tenant": "a", "gpus": "lots"}]}')
    result = tessera("--tenancy-file", str(bad), "--nats-url", "nats://127.0.0.1:1")
    assert result.returncode == 2
    assert "Expected `int | null`, got `str` - at `$.quotas[0].gpus`" in result.stderr


@pytest.mark.parametrize(("replicas", "batched"), [(1, False), (3, True)])
def test_a_replicated_store_gets_claims_in_the_booking_s_batch(
    replicas: int, batched: bool
) -> None:
    """On one server a batch is staged on disk first (dearer than the claim's own write); on a
    JetStream cluster it saves a replicated round trip (``benchmarks/kv_batch.py``)."""
    config = build_config(PlacerSettings(placer_id="p", nats_replicas=replicas))
    assert config.claims_with_bookings is batched
