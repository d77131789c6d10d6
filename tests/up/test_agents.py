"""Several nodes' services in one process (``tessera.up.agents``), as large benchmark clusters
run them: each service is still its own (NATS connection, gRPC socket, HTTP port, log name)."""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.request
from pathlib import Path

import pytest

from tessera.up import workload as w
from tessera.up.spec import plan_nodes
from tessera.up.system import LocalSystem, SystemOptions
from tests.e2e.helpers import assert_exact, phase, settle
from tests.harness.nats import environment_without_proxies

pytestmark = pytest.mark.timeout(180)


def read_url(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as page:
        return bytes(page.read())


async def test_nodes_hosted_two_per_process_place_and_allocate_exactly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    options = SystemOptions(
        nodes=plan_nodes("2xA100-80GB", 3),
        run_dir=tmp_path,
        placers=1,
        dashboard=False,
        webhook=False,
        nodes_per_process=2,
        env=environment_without_proxies(),
        nats_monitoring=True,
    )
    async with LocalSystem(options) as system:
        hosts = sorted(set(system.supervisor.hosted.values()))
        assert hosts == ["agents-1", "agents-2"], "3 nodes, 2 per process"
        assert len(system.supervisor.hosted) == 6, "an inventory and a device plugin per node"
        ports = {name: system.supervisor.http_port(name) for name in system.supervisor.hosted}
        assert len(set(ports.values())) == 6, f"each service its own HTTP port: {ports}"
        for i in range(6):
            system.cluster.create_pod(
                w.pod(f"p-{i}", [w.container(gpu=1, memory_mib=8192, cores=10)], namespace="ns")
            )
        pods = await settle(system, "ns", 6)
        assert all(phase(p) == "Running" for p in pods)
        await assert_exact(system, pods)
        # What benchmarks/e2e.py counts messages with: the server's monitoring endpoints.
        url = system.nats_monitoring_url(system.nats_names()[0])
        assert url is not None and url.startswith("http://127.0.0.1:")
        connz = json.loads(await asyncio.to_thread(read_url, f"{url}/connz?limit=100"))
        names = {c.get("name", "") for c in connz["connections"]}
        assert {"tessera-binder", "tessera-placer", "tessera-deviceplugin"} <= names, names
        log = (system.supervisor.logs / "agents-1.log").read_text().splitlines()
        agents = {json.loads(line).get("agent") for line in log if line.startswith("{")}
        assert {"inventory/node-1", "deviceplugin/node-1", "inventory/node-2"} <= agents
        caplog.set_level(logging.DEBUG, logger="tessera.devcluster.kubelet")
    # Stopping the system stops the device plugins on purpose: every kubelet sees its plugin's
    # stream end, and says so quietly (a benchmark of 100 nodes printed 100 warnings at its end).
    ended = [r for r in caplog.records if r.getMessage() == "device plugin stream ended"]
    assert len(ended) == 3, f"one end per node's plugin: {ended}"
    assert all(r.levelno == logging.DEBUG for r in ended), [r.levelname for r in ended]
