"""Extender mode with the real processes: ``tessera placer --extender-port`` and ``tessera
binder --extender-scheduler-names`` over a real nats-server, each under its own NATS identity and
subject permissions (the placer asks the binder for the pod, the binder answers to the placer's
inbox), against the Kubernetes API test double; a taken extender port stops the placer at start
with one line naming the option (exit 2)."""

from __future__ import annotations

import asyncio
import socket
import sys
import time
from pathlib import Path

from tessera.devcluster.apiserver import ApiServer
from tessera.devcluster.resources import NAMESPACE, NODE, POD
from tessera.up.identities import Identities
from tessera.up.ports import free_port
from tests.binder.builders import container, node, pod
from tests.binder.conftest import eventually
from tests.binder.test_command import ROOT, Process
from tests.binder.test_constraints import anti_affinity, namespace
from tests.extender.conftest import post
from tests.harness import kv
from tests.harness.nats import NatsServer, environment_without_proxies
from tests.placer import wire


async def spawn(service: str, *args: str, env: dict[str, str] | None = None) -> Process:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tessera.cli",
        service,
        "--http-host",
        "127.0.0.1",
        "--http-port",
        "0",
        *args,
        cwd=ROOT,
        env={**environment_without_proxies(), **(env or {})},
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    return Process(service, process)


def extender_port(placer: Process) -> int:
    return int(
        next(li["extender_port"] for li in placer.lines if li.get("msg") == "extender listening")
    )


async def test_the_processes_filter_and_bind_a_pod_kube_scheduler_sends(
    api: ApiServer, kubeconfig: Path, tmp_path: Path
) -> None:
    identities = Identities(tmp_path / "auth", ["gpu-1"])
    with NatsServer(identities.server_config()) as nats_server:
        await _filter_and_bind(api, kubeconfig, nats_server, identities)
        log = (nats_server.directory / "server.log").read_text()
    assert " Violation - " not in log


async def _filter_and_bind(
    api: ApiServer, kubeconfig: Path, nats_server: NatsServer, identities: Identities
) -> None:
    api.create(NODE, node("gpu-1", gpus=8))
    binder = await spawn(
        "binder",
        "--nats-url",
        nats_server.url,
        "--kubeconfig",
        str(kubeconfig),
        "--no-leader-elect",
        "--extender-scheduler-names",
        "tessera-extender",
        env=identities.of("binder").env(),
    )
    placer = await spawn(
        "placer",
        "--nats-url",
        nats_server.url,
        "--extender-port",
        str(free_port()),
        "--extender-bind-timeout-s",
        "15",
        "--inventory-stale-s",
        "3600",
        env=identities.of("placer").env(),
    )
    try:
        await eventually(
            lambda: placer.logged("placer ready") or placer.process.returncode is not None,
            timeout=60,
            what="the placer ready",
        )
        # The node's GPUs, as its inventory writes them: once a placer or the binder has given
        # the store its epoch (an inventory may not, and waits for it).
        inventory = await identities.connect(nats_server.url, "inventory", "gpu-1")
        try:
            await kv.put_inventory(inventory, wire.inventory("gpu-1", 2, at=time.time()))
        finally:
            await inventory.drain()
        port = extender_port(placer)
        # Kept away from web pods of the namespaces labelled team=web (there are none): the
        # selector is resolved from what the binder publishes in tessera-namespaces, under each
        # process's own NATS permissions, before the pod passes filter.
        api.create(NAMESPACE, namespace("shop", team="web"))
        train = pod("train", container(gpu=1, memory=4096, cores=20), scheduler="tessera-extender")
        train["spec"]["affinity"] = anti_affinity("web", "web")
        created = api.create(POD, train)
        args = {"Pod": api.get(POD, "default", "train"), "Nodes": None, "NodeNames": ["gpu-1"]}

        async def passes() -> bool:  # once the binder has published the facts and namespaces
            status, answer = await post(port, "filter", args)
            return status == 200 and answer["NodeNames"] == ["gpu-1"]

        await eventually(passes, timeout=60, what="gpu-1 passing filter")
        status, answer = await post(
            port,
            "bind",
            {
                "PodName": "train",
                "PodNamespace": "default",
                "PodUID": created["metadata"]["uid"],
                "Node": "gpu-1",
            },
        )
        assert (status, answer) == (200, {"Error": ""}), (placer.lines[-8:], binder.lines[-8:])
        assert api.get(POD, "default", "train")["spec"]["nodeName"] == "gpu-1"
    finally:
        codes = [await placer.stop(), await binder.stop()]
    assert codes == [0, 0], (
        [(line.get("ts"), line.get("msg")) for line in placer.lines[-12:]],
        [(line.get("ts"), line.get("msg")) for line in binder.lines[-5:]],
    )


async def test_a_taken_extender_port_stops_the_placer_naming_the_option(
    nats_server: NatsServer,
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        placer = await spawn("placer", "--nats-url", nats_server.url, "--extender-port", str(port))
        code = await asyncio.wait_for(placer.process.wait(), 60)
        await placer.reader
    assert code == 2
    (line,) = [li["msg"] for li in placer.lines]
    assert line.startswith(
        f"tessera placer: configuration error: cannot serve the scheduler extender on "
        f"127.0.0.1:{port} (--extender-port): "
    ), line
