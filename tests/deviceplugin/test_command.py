"""``tessera deviceplugin``: settings, their errors, and the real process start and stop."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from services.deviceplugin.command import DevicePluginSettings, build_config
from shared import codec, subjects
from shared.config import ConfigError
from shared.messages.deadletter import DeadLetter
from shared.runtime.bus import Delivery
from shared.runtime.nats import NatsBus
from tests.deviceplugin.builders import NODE, gpu, inventory
from tests.deviceplugin.fake_kubelet import FakeKubelet
from tests.harness.kv import announce_inventory
from tests.harness.nats import NatsServer, environment_without_proxies

ROOT = Path(__file__).resolve().parents[2]


def tessera(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tessera.cli", "deviceplugin", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_help_documents_modes_providers_and_paths() -> None:
    text = " ".join(tessera("--help").stdout.split())
    for expected in (
        "--mode {logical,memory-units}",
        "--isolation {none,mps,hami-core}",
        "--plugin-dir",
        "default: /var/lib/kubelet/device-plugins",
        "--split-counts",
        "--memory-unit-mib",
        "--compat-envs",
        "--pre-start",
        "env TESSERA_RECORD_WAIT_S",
    ):
        assert expected in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(
            [], "no node name: pass --node, or set NODE_NAME or TESSERA_NODE", id="no-node"
        ),
        pytest.param(
            ["--node", "n1", "--split-counts", "0=many"],
            "--split-counts entry '0=many': expected GPU=N",
            id="bad-split-count",
        ),
        pytest.param(
            ["--node", "n1", "--split-counts", "GPU-a=1"],
            "a GPU needs at least 2 devices",
            id="split-count-below-two",
        ),
        pytest.param(
            ["--node", "n1", "--plugin-dir", "/" + "d" * 110],
            "over the 107-byte limit of unix sockets",
            id="socket-path-too-long",
        ),
        pytest.param(
            ["--node", "n1", "--endpoint", "kubelet.sock"],
            "must be a plain file name other than kubelet.sock",
            id="endpoint-kubelet",
        ),
        pytest.param(
            ["--node", "n1", "--compat-envs", "volcano,gpushare"],
            "--compat-envs (command line)",
            id="unknown-compat",
        ),
    ],
)
def test_configuration_errors_are_one_line_and_exit_2(args: list[str], message: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("NODE_NAME", "TESSERA_NODE")}
    result = tessera(*args, "--nats-url", "nats://127.0.0.1:1", env=env)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert result.stderr.startswith("tessera deviceplugin: configuration error: ")
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        pytest.param(
            {}, {"endpoint": "tessera-logical.sock", "resource": "tessera.dev/gpu"}, id="defaults"
        ),
        pytest.param(
            {"mode": "memory-units"},
            {"endpoint": "tessera-memory-units.sock", "resource": "tessera.dev/gpu-memory"},
            id="memory-units",
        ),
        pytest.param(
            {"endpoint": "gpu.sock", "split_counts": ("0=4", "GPU-x=8")},
            {"endpoint": "gpu.sock", "split_counts": {"0": 4, "GPU-x": 8}},
            id="per-gpu-splits",
        ),
        pytest.param(
            {"compat_envs": ("aliyun",), "isolation": "mps"},
            {"compat": frozenset({"aliyun"}), "isolation": "mps"},
            id="response",
        ),
        pytest.param(
            {"api": "dra", "registry_dir": "/r", "dra_plugin_dir": "/p", "cdi_dir": "/c"},
            {"api": "dra", "dirs": ("/r", "/p", "/c")},
            id="dra",
        ),
    ],
)
def test_build_config(fields: dict[str, Any], expected: dict[str, Any]) -> None:
    config = build_config(DevicePluginSettings(node=NODE, **fields))
    derived = {
        "endpoint": config.endpoint,
        "resource": config.resource,
        "split_counts": dict(config.devices.split_counts),
        "compat": config.response.compat,
        "isolation": config.response.isolation,
        "api": config.api,
        "dirs": tuple(str(d) for d in (config.registry_dir, config.dra_plugin_dir, config.cdi_dir)),
    }
    assert {key: derived[key] for key in expected} == expected


def test_build_config_rejects_a_missing_node() -> None:
    with pytest.raises(ConfigError, match="no node name"):
        build_config(DevicePluginSettings())


async def test_the_real_process_registers_and_stops_cleanly_on_sigterm(
    nats_server: NatsServer, bus: NatsBus, kubelet: FakeKubelet, plugin_dir: Path
) -> None:
    await announce_inventory(bus, inventory(gpu(0)))
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tessera.cli",
        "deviceplugin",
        "--node",
        NODE,
        "--nats-url",
        nats_server.url,
        "--plugin-dir",
        str(plugin_dir),
        "--http-host",
        "127.0.0.1",
        "--http-port",
        "0",
        "--kubelet-poll-s",
        "0.05",
        cwd=ROOT,
        env=environment_without_proxies(),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stderr is not None
    logged: list[bytes] = []
    try:
        registration = await kubelet.registered(timeout=30)
        assert registration.resource_name == "tessera.dev/gpu"
        while not any(b"registered with the kubelet" in line for line in logged):
            line = await asyncio.wait_for(process.stderr.readline(), 30)
            assert line, f"the plugin exited: {b''.join(logged).decode()[-2000:]}"
            logged.append(line)
        assert (plugin_dir / "tessera-logical.sock").exists()

        # A malformed message on the live service's subject is dead-lettered with its reason,
        # and the service keeps serving /healthz.
        started = next(json.loads(line) for line in logged if b'"service starting"' in line)
        letters: asyncio.Queue[Delivery] = asyncio.Queue()

        async def collect(delivery: Delivery) -> None:
            await letters.put(delivery)

        await bus.subscribe(subjects.deadletter("inventory"), collect)
        await bus.publish(subjects.inventory(NODE), b'{"node": 7}')
        letter = codec.decode((await asyncio.wait_for(letters.get(), 10)).data, DeadLetter)
        assert letter.subject == subjects.inventory(NODE)
        assert "Expected `str`, got `int` - at `$.node`" in letter.reason
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://127.0.0.1:{started['http_port']}/healthz") as response,
        ):
            assert response.status == 200
        assert process.returncode is None
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            _, rest = await asyncio.wait_for(process.communicate(), 30)
        finally:
            if process.returncode is None:  # never leave a stuck plugin behind
                process.kill()
                await process.wait()
    assert process.returncode == 0, (b"".join(logged) + rest).decode()[-2000:]
    assert b'"msg": "service stopped"' in rest
