"""The chart's own NATS, run for real: its rendered configuration, auth script and TLS settings
in a real nats-server (the one the tests use, same version as the chart's image).

The pod's files are laid out under a temporary root (every mount path of the StatefulSet moved
there, in the files too); the server listens on loopback ports it picks. Clients connect as the
Tessera services would, with the credentials from the chart's Secret.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml

from tessera.up.system import nats_server_binary
from tests.deploy.chart import CHART_DIR, NAMESPACE, Object, component, containers, named, render
from tests.deploy.variants import PASSWORD, TOKEN, VARIANTS

NATS_HOST = f"{component('nats')}.{NAMESPACE}.svc"
POD_NAME = f"{component('nats')}-0"


class NatsPod:
    """The NATS StatefulSet's pod, its files under ``root``."""

    def __init__(self, objects: tuple[Object, ...], root: Path) -> None:
        self.objects = objects
        self.root = root
        self.statefulset = named(objects, "StatefulSet", component("nats"))
        self.pod = self.statefulset["spec"]["template"]["spec"]
        all_mounts = [
            m
            for c in self.pod.get("initContainers", []) + self.pod["containers"]
            for m in c["volumeMounts"]
        ]
        self.mount_paths = sorted({m["mountPath"] for m in all_mounts}, key=len, reverse=True)
        for path in self.mount_paths:
            self.host(path).mkdir(parents=True, exist_ok=True)
        for mount in all_mounts:
            self._fill(mount)

    def host(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    def relocate(self, text: str) -> str:
        for path in self.mount_paths:
            text = text.replace(path, str(self.host(path)))
        return text

    def volume(self, name: str) -> Object:
        """The pod's volume, or the StatefulSet's claim template of that name."""
        claims = self.statefulset["spec"].get("volumeClaimTemplates", [])
        found = [v for v in self.pod["volumes"] if v["name"] == name]
        found += [{"name": name, "claim": c} for c in claims if c["metadata"]["name"] == name]
        (volume,) = found
        return dict(volume)

    def _fill(self, mount: Object) -> None:
        volume = self.volume(mount["name"])
        target = self.host(mount["mountPath"])
        if "configMap" in volume:
            data = named(self.objects, "ConfigMap", volume["configMap"]["name"])["data"]
            for key, text in data.items():
                (target / key).write_text(self.relocate(text))
        elif "secret" in volume and "items" in volume["secret"]:
            secret = named(self.objects, "Secret", volume["secret"]["secretName"])["stringData"]
            for item in volume["secret"]["items"]:
                (target / item["path"]).write_text(secret[item["key"]])

    def run_init_containers(self) -> None:
        for init in self.pod.get("initContainers", []):
            command = [self.relocate(part) for part in init["command"]]
            subprocess.run(command, check=True, timeout=30, capture_output=True)

    def server_command(self, *extra: str) -> list[str]:
        (container,) = self.pod["containers"]
        assert container["command"][0] == "nats-server"
        return [nats_server_binary(), *(self.relocate(p) for p in container["command"][1:]), *extra]

    def env(self) -> dict[str, str]:
        (container,) = self.pod["containers"]
        env = dict(os.environ)
        for entry in container["env"]:
            assert entry["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
            env[entry["name"]] = POD_NAME
        return env


@contextlib.contextmanager
def serving(pod: NatsPod) -> Iterator[str]:
    """Start the pod's nats-server on loopback; yields its client host:port."""
    ports_dir = pod.root / "ports"
    ports_dir.mkdir()
    command = pod.server_command(
        "-a", "127.0.0.1", "-p", "-1", "-m", "-1", "--ports_file_dir", str(ports_dir)
    )
    log = pod.root / "nats-server.log"
    with log.open("wb") as log_file:
        process = subprocess.Popen(
            command, env=pod.env(), stdout=log_file, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 20
        ports: dict[str, Any] = {}
        while not ports:
            if process.poll() is not None:
                pytest.fail(f"nats-server exited: {log.read_text()}")
            assert time.monotonic() < deadline, "nats-server did not report its ports"
            for ports_file in ports_dir.glob("*.ports"):
                with contextlib.suppress(ValueError):  # caught half-written
                    ports = json.loads(ports_file.read_text())
            time.sleep(0.02)
        yield str(ports["nats"][0]).split("://")[1]
    finally:
        process.terminate()
        process.wait(timeout=10)


def _read_line(stream: socket.socket | ssl.SSLSocket) -> bytes:
    line = b""
    while not line.endswith(b"\r\n"):
        chunk = stream.recv(1)
        if not chunk:
            raise ConnectionResetError("the server closed the connection")
        line += chunk
    return line


def session(address: str, connect: dict[str, str], tls: ssl.SSLContext | None = None) -> str:
    """Connect as a client would (NATS client protocol, TLS upgrade after INFO; ``connect``: the
    CONNECT fields such as user, pass, auth_token) and ask JetStream for the account's info;
    "jetstream" when it answered, else what the server said.

    The protocol by hand, not nats-py: a refused nats-py connection leaves sockets behind.
    """
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        stream: socket.socket | ssl.SSLSocket = raw
        info = json.loads(_read_line(raw).removeprefix(b"INFO "))
        assert info.get("tls_required", False) == (tls is not None)
        try:
            if tls is not None:
                stream = tls.wrap_socket(raw, server_hostname=NATS_HOST)
            options = {"verbose": False, "pedantic": False, "protocol": 1, **connect}
            stream.sendall(b"CONNECT " + json.dumps(options).encode() + b"\r\nPING\r\n")
            answer = _read_line(stream)
            if not answer.startswith(b"PONG"):
                return answer.decode().strip()
            stream.sendall(b"SUB _INBOX.t 1\r\nPUB $JS.API.INFO _INBOX.t 0\r\n\r\n")
            header = _read_line(stream).split()
            while header[0] in (b"INFO", b"PING", b"PONG"):  # an update after CONNECT
                header = _read_line(stream).split()
            assert header[:2] == [b"MSG", b"_INBOX.t"], header
            payload = json.loads(stream.recv(int(header[-1]) + 2))
            assert payload["type"] == "io.nats.jetstream.api.v1.account_info_response", payload
            return "jetstream"
        except (ssl.SSLError, ConnectionResetError) as error:
            return f"refused: {error}"
        finally:
            if stream is not raw:
                stream.close()


@pytest.mark.parametrize("variant", ["default", "clustered-nats-user-password"])
def test_rendered_configuration_is_valid_for_nats_server(variant: str, tmp_path: Path) -> None:
    pod = NatsPod(render(VARIANTS[variant]), tmp_path)
    pod.run_init_containers()
    done = subprocess.run(
        pod.server_command("-t"), env=pod.env(), capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    assert "is valid" in done.stderr + done.stdout


def test_user_and_password_from_the_secret_are_the_servers(tmp_path: Path) -> None:
    values = yaml.safe_load(yaml.safe_dump(VARIANTS["clustered-nats-user-password"]))
    values["nats"]["embedded"]["replicas"] = 1  # one server here: routes need the cluster's DNS
    pod = NatsPod(render(values), tmp_path)
    pod.run_init_containers()
    assert (
        PASSWORD
        not in named(pod.objects, "ConfigMap", component("nats-config"))["data"]["nats.conf"]
    )
    with serving(pod) as address:
        assert session(address, {"user": "tessera", "pass": PASSWORD}) == "jetstream"
        wrong = {"user": "tessera", "pass": PASSWORD + "x"}
        assert "Authorization Violation" in session(address, wrong)
        assert "Authorization Violation" in session(address, {})


def _write_tls_secrets(pod: NatsPod, ca: trustme.CA) -> None:
    server = ca.issue_cert(NATS_HOST, "127.0.0.1")
    tls_dir = pod.host("/etc/nats/tls")
    server.private_key_pem.write_to_path(str(tls_dir / "tls.key"))
    server.cert_chain_pems[0].write_to_path(str(tls_dir / "tls.crt"))
    ca.cert_pem.write_to_path(str(tls_dir / "ca.crt"))


def test_token_over_mutual_tls(tmp_path: Path) -> None:
    objects = render(VARIANTS["embedded-nats-tls-token"])
    pod = NatsPod(objects, tmp_path)
    assert pod.volume("tls")["secret"]["secretName"] == "tessera-nats-server"
    ca = trustme.CA()
    _write_tls_secrets(pod, ca)
    pod.run_init_containers()
    with_client_cert = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    ca.configure_trust(with_client_cert)
    ca.issue_cert("tessera-placer").configure_cert(with_client_cert)
    without_client_cert = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    ca.configure_trust(without_client_cert)
    with serving(pod) as address:
        token = {"auth_token": TOKEN}
        assert session(address, token, with_client_cert) == "jetstream"
        assert session(address, token, without_client_cert).startswith("refused")
        wrong = {"auth_token": TOKEN + "0"}
        assert "Authorization Violation" in session(address, wrong, with_client_cert)


def test_services_connect_with_tls_to_the_name_in_the_servers_certificate() -> None:
    objects = render(VARIANTS["embedded-nats-tls-token"])
    placer = named(objects, "Deployment", component("placer"))
    args = placer["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--nats-url=tls://{NATS_HOST}:4222" in args
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    assert values["nats"]["embedded"]["image"]["tag"].startswith(_server_version())


def _server_version() -> str:
    done = subprocess.run(
        [nats_server_binary(), "--version"], capture_output=True, text=True, check=True
    )
    return done.stdout.split()[-1].removeprefix("v")


@pytest.mark.parametrize(
    ("variant", "replicas"),
    [
        ("default", "1"),
        ("clustered-nats-user-password", "3"),
        ("production", "3"),
        ("external-nats-nkey", "1"),
    ],
)
def test_services_keep_as_many_copies_of_each_stream_as_nats_has_servers(
    variant: str, replicas: str
) -> None:
    """A 3-server NATS keeps three copies of every stream and bucket: losing one server (or
    its volume) loses nothing (docs/design.md §12)."""
    services = [
        c
        for c in containers(render(VARIANTS[variant]))
        if any(a.startswith("--nats-url=") for a in c.args())
    ]
    assert services, variant
    for container in services:
        assert f"--nats-replicas={replicas}" in container.args(), container.where
