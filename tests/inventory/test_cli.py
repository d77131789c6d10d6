"""``tessera inventory`` as an operator runs it: real processes, real signals, real exit codes."""

from __future__ import annotations

import ctypes.util
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.inventory.command import EXIT_BACKEND_UNAVAILABLE
from shared import codec, subjects
from shared.messages.inventory import NodeInventory
from shared.runtime.command import EXIT_CONFIG_ERROR
from shared.runtime.nats import NatsBus
from tessera.cli import main as tessera_main
from tests.harness.nats import NatsServer, environment_without_proxies
from tests.inventory.conftest import GPU_A, GPU_B
from tests.inventory.helpers import Inbox
from tests.inventory.stub import NvmlStub

ROOT = Path(__file__).resolve().parents[2]
NODE = "node-7.example"
REAL_NVML = ctypes.util.find_library("nvidia-ml") is not None


def clean_environment(**extra: str) -> dict[str, str]:
    """The test environment without anything that could pick a node, a config or a library."""
    env = environment_without_proxies()
    for name in list(env):
        if name.startswith("TESSERA_") or name in ("NODE_NAME", "LD_LIBRARY_PATH"):
            del env[name]
    env.update(extra)
    return env


def inventory_command(*args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "tessera.cli",
        "inventory",
        "--log-format",
        "text",
        "--http-host",
        "127.0.0.1",
        "--http-port",
        "0",
        *args,
    ]


def run_to_exit(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        inventory_command(*args),
        env=clean_environment(**env),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def stop(process: subprocess.Popen[str]) -> tuple[int, float, str]:
    """SIGTERM; returns (exit code, seconds it took, stderr)."""
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=15)
    return process.returncode, time.monotonic() - started, stderr


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[str]]]:
    """Processes a test starts; any still running at the end are killed."""
    processes: list[subprocess.Popen[str]] = []
    yield processes
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.communicate()


def spawn(started: list[subprocess.Popen[str]], *args: str, **env: str) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        inventory_command(*args),
        env=clean_environment(**env),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    started.append(process)
    return process


async def test_fake_backend_publishes_heartbeats_and_stops_cleanly_on_sigterm(
    nats_server: NatsServer, bus: NatsBus, started: list[subprocess.Popen[str]]
) -> None:
    inbox = await Inbox(bus, NODE).start()
    process = spawn(
        started,
        "--backend",
        "fake",
        "--fake-gpus",
        "2xA100-80GB,1xT4-16GB",
        "--nats-url",
        nats_server.url,
        "--poll-interval-s",
        "0.1",
        "--heartbeat-interval-s",
        "0.5",
        NODE_NAME=NODE,
    )
    first = await inbox.next(timeout=20)
    assert (first.node, first.backend, [g.model for g in first.gpus]) == (
        NODE,
        "fake",
        ["A100-80GB", "A100-80GB", "T4-16GB"],
    )
    beat = await inbox.next(timeout=5)  # nothing changes: the next one is the heartbeat
    assert beat.sequence == first.sequence + 1
    assert 0.4 <= beat.observed_at - first.observed_at < 3
    entry = await bus.kv_get(subjects.KV_INVENTORY, subjects.node_token(NODE))
    assert entry is not None
    assert codec.decode(entry.value, NodeInventory).sequence >= beat.sequence

    code, seconds, stderr = stop(process)
    assert (code, "Traceback" in stderr) == (0, False), stderr
    assert seconds < 5
    assert "service stopped" in stderr


async def test_nvml_backend_finds_the_library_by_name(
    nats_server: NatsServer,
    bus: NatsBus,
    nvml_stub: NvmlStub,
    started: list[subprocess.Popen[str]],
) -> None:
    """No --nvml-library: pynvml loads libnvidia-ml.so.1 through the library path, as on a node."""
    inbox = await Inbox(bus, NODE).start()
    process = spawn(
        started,
        "--nats-url",
        nats_server.url,
        "--node",
        NODE,
        LD_LIBRARY_PATH=str(nvml_stub.directory),
    )
    first = await inbox.next(timeout=20)
    assert (first.backend, first.driver_version, [g.uuid for g in first.gpus]) == (
        "nvml",
        "550.54.15",
        [GPU_A, GPU_B],
    )
    code, seconds, stderr = stop(process)
    assert (code, "Traceback" in stderr) == (0, False), stderr
    assert seconds < 5


@pytest.mark.skipif(REAL_NVML, reason="this machine has a real NVML library")
def test_a_node_without_nvml_gets_one_clear_line_and_exit_code_4() -> None:
    result = run_to_exit("--node", NODE, "--nats-url", "nats://127.0.0.1:1")
    assert result.returncode == EXIT_BACKEND_UNAVAILABLE
    assert result.stderr == (
        "tessera inventory: NVML library not found (libnvidia-ml.so.1): not a GPU node? run with "
        "--backend fake to simulate one, or point --nvml-library at the driver's "
        "libnvidia-ml.so.1\n"
    )


def test_nvml_failing_at_start_gets_one_clear_line_and_exit_code_4(nvml_stub: NvmlStub) -> None:
    nvml_stub.init_error = 9
    nvml_stub.write()
    result = run_to_exit("--node", NODE, "--nvml-library", str(nvml_stub.library))
    assert result.returncode == EXIT_BACKEND_UNAVAILABLE
    assert result.stderr == (
        "tessera inventory: NVIDIA driver not loaded (NVML: Driver Not Loaded): check the driver "
        "on this node, or run with --backend fake to simulate GPUs\n"
    )


def test_no_node_name_is_a_configuration_error() -> None:
    result = run_to_exit("--backend", "fake", "--fake-gpus", "1xA100-80GB")
    assert result.returncode == EXIT_CONFIG_ERROR
    assert result.stderr == (
        "tessera inventory: configuration error: no node name: pass --node, or set NODE_NAME or "
        "TESSERA_NODE\n"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(
            ["--backend", "fake"],
            "--backend fake needs exactly one of --fake-gpus "
            "(e.g. 4xA100-80GB) or --fake-spec FILE",
            id="fake-without-gpus",
        ),
        pytest.param(
            ["--backend", "fake", "--fake-gpus", "1xA100-80GB", "--fake-spec", "x.toml"],
            "--backend fake needs exactly one of --fake-gpus (e.g. 4xA100-80GB) or "
            "--fake-spec FILE",
            id="fake-with-both",
        ),
        pytest.param(
            ["--fake-gpus", "1xA100-80GB"],
            "--fake-gpus and --fake-spec need --backend fake",
            id="fake-gpus-without-fake-backend",
        ),
        pytest.param(
            ["--backend", "fake", "--fake-gpus", "lots"],
            "--fake-gpus: cannot read "
            "'lots': expected COUNTxMODEL-MEMORY, for example 4xA100-80GB or "
            "2xA100-80GB,1xT4-16GB",
            id="bad-shorthand",
        ),
        pytest.param(
            ["--backend", "fake", "--fake-spec", "/nonexistent/spec.toml"],
            "--fake-spec: cannot read /nonexistent/spec.toml: No such file or directory",
            id="missing-spec",
        ),
        pytest.param(
            [
                "--backend",
                "fake",
                "--fake-gpus",
                "1xA100-80GB",
                "--poll-interval-s",
                "5",
                "--heartbeat-interval-s",
                "2",
            ],
            "--heartbeat-interval-s (2.0) must not be "
            "shorter than --poll-interval-s (5.0): the heartbeat is checked at each poll",
            id="heartbeat-shorter-than-poll",
        ),
        pytest.param(
            ["--backend", "fake", "--fake-gpus", "1xA100-80GB", "--poll-interval-s", "0"],
            "--poll-interval-s (command line): Expected `float` > 0.0",
            id="zero-poll-interval",
        ),
    ],
)
def test_configuration_errors(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = tessera_main(["inventory", "--node", NODE, *args])
    assert code == EXIT_CONFIG_ERROR
    assert capsys.readouterr().err == f"tessera inventory: configuration error: {message}\n"


def test_help_documents_every_setting() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tessera.cli", "inventory", "--help"],
        env=clean_environment(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    help_text = " ".join(result.stdout.split())
    for option, env in [
        ("--backend {nvml,fake}", "TESSERA_BACKEND"),
        ("--fake-gpus", "TESSERA_FAKE_GPUS"),
        ("--fake-spec", "TESSERA_FAKE_SPEC"),
        ("--nvml-library", "TESSERA_NVML_LIBRARY"),
        ("--poll-interval-s", "TESSERA_POLL_INTERVAL_S"),
        ("--heartbeat-interval-s", "TESSERA_HEARTBEAT_INTERVAL_S"),
        ("--deadband-memory-mib", "TESSERA_DEADBAND_MEMORY_MIB"),
        ("--deadband-utilization-pct", "TESSERA_DEADBAND_UTILIZATION_PCT"),
        ("--deadband-temperature-c", "TESSERA_DEADBAND_TEMPERATURE_C"),
        ("--deadband-power-w", "TESSERA_DEADBAND_POWER_W"),
        ("--health-probe-period-s", "TESSERA_HEALTH_PROBE_PERIOD_S"),
        ("--event-wait-timeout-s", "TESSERA_EVENT_WAIT_TIMEOUT_S"),
        ("--node", "NODE_NAME"),
    ]:
        assert option in help_text
        assert env in help_text


def test_settings_come_from_the_environment_too() -> None:
    """Environment variables reach the same checks as the options (the chart sets them)."""
    result = run_to_exit(NODE_NAME=NODE, TESSERA_BACKEND="fake", TESSERA_FAKE_GPUS="nonsense")
    assert result.returncode == EXIT_CONFIG_ERROR
    assert result.stderr.startswith(
        "tessera inventory: configuration error: --fake-gpus: cannot read 'nonsense'"
    )
