"""``tessera binder``: help, configuration errors, and two real processes electing a leader."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from services.binder.command import BinderSettings, build_config
from services.binder.config import pod_namespace
from shared.config import ConfigError
from shared.runtime.nats import NatsBus
from tessera.devcluster.apiserver import ApiServer
from tessera.devcluster.resources import LEASE, NODE, POD
from tests.binder.builders import node, pod, record, slices
from tests.binder.conftest import eventually
from tests.binder.test_service import bound_to, uid_of
from tests.harness.kv import place
from tests.harness.nats import NatsServer, environment_without_proxies

ROOT = Path(__file__).resolve().parents[2]
LEASE_S, RENEW_S, RETRY_S = 2.0, 1.5, 0.25


def tessera(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tessera.cli", "binder", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_help_documents_the_settings() -> None:
    text = " ".join(tessera("--help").stdout.split())
    for expected in (
        "--kubeconfig",
        "--scheduler-name",
        "default: tessera",
        "--leader-elect, --no-leader-elect",
        "--lease-duration-s",
        "default: 15.0",
        "--renew-deadline-s",
        "default: 10.0",
        "--retry-period-s",
        "default: 2.0",
        "--gate-timeout-s",
        "--node-facts-refresh-s",
        "--allocation-warning-s",
        "env TESSERA_API_TIMEOUT_S",
    ):
        assert expected in text


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        pytest.param(
            {"lease_duration_s": 5.0, "renew_deadline_s": 5.0},
            "--lease-duration-s (5) must be greater than --renew-deadline-s (5)",
            id="lease-not-longer-than-deadline",
        ),
        pytest.param(
            {"retry_period_s": 9.0},
            "--renew-deadline-s (10) must be greater than 1.2 x --retry-period-s (9)",
            id="retry-too-slow",
        ),
    ],
)
def test_leader_election_timings_are_checked_together(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        build_config(BinderSettings(**fields), environ={})
    assert build_config(BinderSettings(leader_elect=False, **fields), environ={})


def test_the_lease_namespace_defaults_to_the_pods_own(tmp_path: Path) -> None:
    assert build_config(
        BinderSettings(), environ={"POD_NAMESPACE": "gpu-system"}
    ).lease_namespace == ("gpu-system")
    account = tmp_path / "namespace"
    account.write_text("tessera\n")
    assert pod_namespace({}, account) == "tessera"
    assert pod_namespace({}, tmp_path / "absent") == "default"


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        pytest.param(
            [],
            {"HOME": "/nonexistent"},
            "no Kubernetes API to talk to: not running in a pod",
            id="no-cluster",
        ),
        pytest.param(
            ["--kubeconfig", "/nonexistent/kubeconfig"],
            {},
            "cannot load Kubernetes configuration: no such file: /nonexistent/kubeconfig",
            id="missing-kubeconfig",
        ),
    ],
)
def test_configuration_errors_are_one_line_and_exit_2(
    args: list[str], env: dict[str, str], message: str
) -> None:
    base = {
        k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")
    }
    result = tessera(*args, "--nats-url", "nats://127.0.0.1:1", env=base | env)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == f"tessera binder: configuration error: {message}" or (
        result.stderr.startswith("tessera binder: configuration error: ")
        and message in result.stderr
        and result.stderr.count("\n") == 1
    ), result.stderr


class Process:
    """A real ``tessera binder`` process and the lines it logged."""

    def __init__(self, identity: str, process: asyncio.subprocess.Process) -> None:
        self.identity = identity
        self.process = process
        self.lines: list[dict[str, Any]] = []
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.process.stderr is not None
        while line := await self.process.stderr.readline():
            try:
                self.lines.append(json.loads(line))
            except ValueError:
                self.lines.append({"msg": line.decode(errors="replace")})

    def logged(self, message: str) -> bool:
        return any(line.get("msg") == message for line in self.lines)

    @property
    def port(self) -> int:
        return int(
            next(li["http_port"] for li in self.lines if li.get("msg") == "service starting")
        )

    async def stop(self) -> int:
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.process.wait(), 30)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()
        await self.reader
        assert self.process.returncode is not None
        return self.process.returncode


async def start(identity: str, nats: NatsServer, kubeconfig: Path) -> Process:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tessera.cli",
        "binder",
        "--nats-url",
        nats.url,
        "--kubeconfig",
        str(kubeconfig),
        "--identity",
        identity,
        "--http-host",
        "127.0.0.1",
        "--http-port",
        "0",
        "--lease-namespace",
        "tessera",
        "--lease-duration-s",
        str(LEASE_S),
        "--renew-deadline-s",
        str(RENEW_S),
        "--retry-period-s",
        str(RETRY_S),
        cwd=ROOT,
        env=environment_without_proxies(),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    return Process(identity, process)


async def http_get(port: int, path: str) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}{path}") as response,
    ):
        return response.status, await response.text()


def holder(api: ApiServer) -> str:
    lease = api.find(LEASE, "tessera", "tessera-binder")
    return str((lease or {}).get("spec", {}).get("holderIdentity") or "")


async def test_two_binders_elect_one_leader_and_the_standby_takes_over_after_sigkill(
    api: ApiServer, nats_server: NatsServer, bus: NatsBus, kubeconfig: Path
) -> None:
    api.create(NODE, node())
    binders = [await start(name, nats_server, kubeconfig) for name in ("binder-a", "binder-b")]
    try:
        await eventually(
            lambda: all(b.logged("caches synced") for b in binders),
            timeout=40,
            what="both binders synced",
        )
        await eventually(lambda: holder(api) in ("binder-a", "binder-b"), what="a leader")
        leader = next(b for b in binders if b.identity == holder(api))
        standby = next(b for b in binders if b is not leader)
        for binder in binders:  # both are ready; only one leads
            status, text = await http_get(binder.port, "/readyz")
            assert status == 200, text
            _, metrics = await http_get(binder.port, "/metrics")
            leading = "tessera_binder_leader 1.0" in metrics
            assert leading == (binder is leader), (binder.identity, metrics[-400:])

        first = record(uid_of(api.create(POD, pod("first"))), "first")
        await place(bus, first)
        await eventually(lambda: bound_to(api, "first"), what="the leader binds")

        loop = asyncio.get_running_loop()
        leader.process.kill()
        killed_at = loop.time()
        await leader.stop()
        await eventually(
            lambda: holder(api) == standby.identity,
            timeout=LEASE_S * 5,
            what="the standby to take the lease",
        )
        took_s = loop.time() - killed_at
        # One lease duration from the last renew (at most a retry period before the kill), a
        # retry period to notice, and slack for a loaded machine.
        print(f"standby took over {took_s:.2f} s after SIGKILL of the leader")
        assert took_s <= LEASE_S + 2 * RETRY_S + 2.0, took_s

        second = record(
            uid_of(api.create(POD, pod("second"))),
            "second",
            slices("main", (1, 4096, 25), devices=2),
        )
        await place(bus, second)
        await eventually(lambda: bound_to(api, "second"), what="the new leader binds")
        assert api.get(POD, "default", "second")["spec"]["nodeName"] == "gpu-1"
        assert [w.code for w in api.writes_to("pods/binding")] == [201, 201]
    finally:
        codes = [await b.stop() for b in binders]
    assert codes[binders.index(standby)] == 0
    assert holder(api) == "", "the last leader released the lease on SIGTERM"
