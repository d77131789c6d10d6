"""A port chosen free and taken by another process before nats-server binds it: the cluster
harness and ``tessera up`` start their servers again on new ports (a loaded CI run once failed
a test's set-up on "address already in use")."""

from __future__ import annotations

import socket
from pathlib import Path

from tessera.up.spec import plan_nodes
from tessera.up.system import LocalSystem, SystemOptions
from tests.harness.nats import NatsCluster


def taken(port: int) -> socket.socket:
    """A listening socket on ``port``: what another process's server would hold."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", port))
    holder.listen()
    return holder


def test_a_cluster_starts_on_new_ports_when_one_was_taken() -> None:
    cluster = NatsCluster(3)
    first_choice = cluster.servers[1].port
    with taken(first_choice), cluster:
        assert all(server.url for server in cluster.servers)
        assert first_choice not in [server.port for server in cluster.servers]


async def test_tessera_up_starts_nats_on_new_ports_when_one_was_taken(tmp_path: Path) -> None:
    said: list[str] = []
    options = SystemOptions(
        nodes=plan_nodes("1xA100-80GB", 1),
        run_dir=tmp_path,
        placers=1,
        binders=1,
        dashboard=False,
        webhook=False,
        nats_servers=3,
    )
    system = LocalSystem(options, say=said.append)
    first_choice = system.nats_ports[0]
    with taken(first_choice):
        async with system:
            assert system.bus is not None and system.bus.connected
            assert first_choice not in system.nats_ports
    assert any("NATS port was taken" in line for line in said), said
