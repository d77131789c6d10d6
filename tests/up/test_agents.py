"""Several nodes' services in one process (``tessera.up.agents``), as large benchmark clusters
run them: each service is still its own (NATS connection, gRPC socket, HTTP port, log name)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tessera.up import workload as w
from tessera.up.spec import plan_nodes
from tessera.up.system import LocalSystem, SystemOptions
from tests.e2e.helpers import assert_exact, phase, settle
from tests.harness.nats import environment_without_proxies

pytestmark = pytest.mark.timeout(180)


async def test_nodes_hosted_two_per_process_place_and_allocate_exactly(tmp_path: Path) -> None:
    options = SystemOptions(
        nodes=plan_nodes("2xA100-80GB", 3),
        run_dir=tmp_path,
        placers=1,
        dashboard=False,
        webhook=False,
        nodes_per_process=2,
        env=environment_without_proxies(),
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
        log = (system.supervisor.logs / "agents-1.log").read_text().splitlines()
        agents = {json.loads(line).get("agent") for line in log if line.startswith("{")}
        assert {"inventory/node-1", "deviceplugin/node-1", "inventory/node-2"} <= agents
