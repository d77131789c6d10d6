"""What an operator does with ``tessera up --keep``: the real kubectl against the simulated API
(the admission webhook refusing and defaulting pods, a second ``apply``, ``logs``), a node in
memory-units mode, and ``tessera explain``, all on one system shared by this module.

The system is one ``tessera up`` process started as a user starts it; its JSON summary (with
``--keep``) says where everything listens.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.test_monitoring import dashboard_expressions, metric_names, rule_expressions
from tests.harness.nats import NatsServer, environment_without_proxies

ROOT = Path(__file__).resolve().parents[2]
KUBECTL = Path(sys.executable).parent / "kubectl"
NODES = "a100=2xA100-80GB,t4m=4xT4:mode=memory-units,cpu1=cpu"
TENANCY = {"quotas": [{"tenant": "team-b", "gpus": 4, "gpu_memory_mib": 65536}]}
WORKLOAD = [
    {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "seed", "annotations": {"tessera.dev/gpu-model": "A100"}},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {
                        "limits": {"tessera.dev/gpu": "1", "tessera.dev/gpu-memory": "4096"}
                    },
                }
            ]
        },
    }
]
pytestmark = pytest.mark.timeout(240)


@dataclass
class System:
    process: subprocess.Popen[str]
    summary: dict[str, Any]
    run_dir: Path

    @property
    def endpoints(self) -> dict[str, Any]:
        return dict(self.summary["endpoints"])

    def kubectl(
        self, *args: str, stdin: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [str(KUBECTL), "--kubeconfig", self.endpoints["kubeconfig"], *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
            env=environment_without_proxies(),
        )
        if check:
            assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
        return done

    def pod(self, name: str, namespace: str = "default") -> dict[str, Any]:
        return dict(
            json.loads(self.kubectl("get", "pod", "-n", namespace, name, "-o", "json").stdout)
        )

    def wait_running(
        self, name: str, namespace: str = "default", timeout: float = 60
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            pod = self.pod(name, namespace)
            if pod["status"].get("phase") == "Running":
                return pod
            assert time.monotonic() < deadline, f"{namespace}/{name} not Running: {pod['status']}"
            time.sleep(0.2)


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    run_dir = tmp_path_factory.mktemp("operator")
    workload = run_dir / "workload.json"
    workload.write_text(json.dumps(WORKLOAD))
    tenancy = run_dir / "tenancy.json"
    tenancy.write_text(json.dumps(TENANCY))
    process = subprocess.Popen(
        [
            sys.executable, "-m", "tessera.cli", "up", "--keep", "--json", "--gpus", NODES,
            "--workload", str(workload), "--timeout", "120", "--run-dir", str(run_dir),
            "--tenancy-file", str(tenancy),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=environment_without_proxies(),
    )  # fmt: skip
    try:
        assert process.stdout is not None
        line = process.stdout.readline()  # printed once settled; --keep goes on
        assert line, f"tessera up ended early (logs in {run_dir / 'logs'})"
        yield System(process=process, summary=json.loads(line), run_dir=run_dir)
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGINT)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process.stdout is not None:
            process.stdout.close()


def manifest(name: str, limits: dict[str, Any], *, namespace: str = "team-a", **spec: Any) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "cuda",
                        "image": "nvidia/cuda:12.4.1-base",
                        "resources": {"limits": limits},
                    }
                ],
                **spec,
            },
        }
    )


def test_the_system_started_and_settled(system: System) -> None:
    summary = system.summary
    assert summary["settled"] is True
    assert summary["pods_by_phase"] == {"Running": 1}
    assert (summary["mismatched_containers"], summary["overcommitted_gpus"]) == (0, 0)
    assert summary["endpoints"]["webhook_url"].startswith("https://127.0.0.1:")


def test_an_impossible_request_is_refused_at_kubectl_apply_with_the_binder_s_line(
    system: System,
) -> None:
    pod = manifest("too-much", {"tessera.dev/gpu": 1, "tessera.dev/gpu-memory": "16Gi"})
    refused = system.kubectl("apply", "-f", "-", stdin=pod, check=False)
    assert refused.returncode != 0
    assert (
        'admission webhook "validate.tessera.dev" denied the request: Tessera cannot place this '
        "pod as written: spec.containers[0].resources.limits[tessera.dev/gpu-memory] (container "
        "'cuda'): '16Gi' has a unit, but tessera.dev/gpu-memory counts MiB and takes a plain "
        "number; for 16Gi write 16384"
    ) in refused.stderr, refused.stderr
    missing = system.kubectl("get", "pod", "-n", "team-a", "too-much", check=False)
    assert missing.returncode != 0 and "NotFound" in missing.stderr


def test_a_pod_without_scheduler_or_share_count_is_defaulted_and_runs(system: System) -> None:
    """No schedulerName, memory and cores without tessera.dev/gpu: the webhook makes it a
    Tessera pod of one share; it runs with exactly that slice (kubectl logs prints its GPU
    environment), and applying the same file again changes nothing."""
    pod = manifest(
        "notebook",
        {"tessera.dev/gpu-memory": 2048, "tessera.dev/gpu-cores": 25},
        namespace="team-b",
    )
    created = system.kubectl("apply", "-f", "-", stdin=pod)
    assert "pod/notebook created" in created.stdout
    stored = system.pod("notebook", "team-b")
    assert stored["spec"]["schedulerName"] == "tessera"
    limits = stored["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {
        "tessera.dev/gpu": "1",
        "tessera.dev/gpu-memory": "2048",
        "tessera.dev/gpu-cores": "25",
    }
    running = system.wait_running("notebook", "team-b")
    again = system.kubectl("apply", "-f", "-", stdin=pod)
    assert again.stdout.strip() in ("pod/notebook unchanged", "pod/notebook configured")
    assert system.pod("notebook", "team-b")["spec"] == running["spec"]
    log = system.kubectl("logs", "-n", "team-b", "notebook").stdout
    env = dict(line.split("=", 1) for line in log.splitlines() if "=" in line)
    assignment = json.loads(running["metadata"]["annotations"]["tessera.dev/assignment"])
    (share,) = assignment["containers"][0]["gpus"]
    assert env["NVIDIA_VISIBLE_DEVICES"] == share["uuid"]
    assert env["TESSERA_GPU_MEMORY_LIMIT_MIB"] == "2048"
    assert env["TESSERA_GPU_CORES"] == "25"


def test_tessera_s_annotations_cannot_be_edited_with_kubectl(system: System) -> None:
    """The binder marked the pod assigned through the webhook (its own identity); kubectl may
    not point the pod's assignment elsewhere, which a restore after a store loss would read."""
    running = system.wait_running("seed")
    annotations = running["metadata"]["annotations"]
    deadline = time.monotonic() + 30
    while annotations.get("tessera.dev/assigned") != "true":
        assert time.monotonic() < deadline, f"seed never marked assigned: {annotations}"
        time.sleep(0.2)
        annotations = system.pod("seed")["metadata"]["annotations"]
    edited = annotations["tessera.dev/assignment"].replace('"index":0', '"index":1')
    refused = system.kubectl(
        "annotate", "pod", "seed", "--overwrite", f"tessera.dev/assignment={edited}", check=False
    )
    assert refused.returncode != 0
    assert (
        "metadata.annotations[tessera.dev/assignment]: written by Tessera only (its binder: "
        "system:serviceaccount:tessera-system:tessera-binder); user 'system:anonymous' may not "
        "set, change or remove it"
    ) in refused.stderr, refused.stderr
    assert system.pod("seed")["metadata"]["annotations"] == annotations


def webhook_knows_the_cluster(system: System, nodes: int) -> None:
    """Wait until the webhook has read every GPU node's inventory (its metric says)."""
    url = f"http://127.0.0.1:{system.endpoints['http_ports']['webhook']}/metrics"
    deadline = time.monotonic() + 30
    while True:
        with urllib.request.urlopen(url, timeout=10) as answer:
            text = answer.read().decode()
        if f"tessera_webhook_cluster_nodes {float(nodes)}" in text:
            return
        assert time.monotonic() < deadline, "the webhook never read the inventories"
        time.sleep(0.2)


@pytest.mark.parametrize(
    ("limits", "line"),
    [
        pytest.param(
            {"tessera.dev/gpu": 1, "tessera.dev/gpu-memory": 200000},
            "limits[tessera.dev/gpu-memory] (container 'cuda'): asks 200000 MiB per GPU; the "
            "largest GPU here has 81920 MiB",
            id="memory",
        ),
        pytest.param(
            {"tessera.dev/gpu": 9},
            "limits[tessera.dev/gpu] (container 'cuda'): asks 9 GPUs; a node here has at most 4 "
            "GPUs",
            id="count",
        ),
        pytest.param(
            {"tessera.dev/gpu": 1, "tessera.dev/gpu-memory": 2000000},
            "limits[tessera.dev/gpu-memory] (container 'cuda'): asks 2000000 MiB per GPU; no GPU "
            "has more than 1048576 MiB (1 TiB)",
            id="beyond-1-tib",
        ),
        pytest.param(
            {"tessera.dev/gpu": 1, "tessera.dev/gpu-memory": "2000m"},
            "limits[tessera.dev/gpu-memory] (container 'cuda'): '2000m' means 2 (m is "
            "thousandths), but tessera.dev/gpu-memory counts MiB and takes a plain number; for "
            "2000 MiB write 2000",
            id="thousandths-of-a-mib",
        ),
    ],
)
def test_what_no_node_could_ever_hold_is_refused_at_kubectl_apply_with_the_number(
    system: System, limits: dict[str, Any], line: str, request: pytest.FixtureRequest
) -> None:
    webhook_knows_the_cluster(system, nodes=2)
    name = f"never-{request.node.callspec.id}"
    refused = system.kubectl("apply", "-f", "-", stdin=manifest(name, limits), check=False)
    assert refused.returncode != 0
    assert (
        'admission webhook "validate.tessera.dev" denied the request: Tessera cannot place this '
        f"pod as written: spec.containers[0].resources.{line}"
    ) in refused.stderr, refused.stderr
    assert system.kubectl("get", "pod", "-n", "team-a", name, check=False).returncode != 0


def test_logs_of_a_pod_not_running_say_so(system: System) -> None:
    # Four whole GPUs: only the T4 node has four, and it takes memory slices only.
    pod = manifest("waits", {"tessera.dev/gpu": 4})
    system.kubectl("apply", "-f", "-", stdin=pod)
    refused = system.kubectl("logs", "-n", "team-a", "waits", check=False)
    assert refused.returncode != 0
    assert 'container "cuda" in pod "waits" is waiting to start' in refused.stderr


def test_a_memory_units_node_too_large_for_1_mib_devices_runs_with_the_unit_it_chose(
    system: System,
) -> None:
    """4 x T4 in memory-units mode: the device plugin chose 2 MiB devices, said so, and a pod
    asking GPU memory runs there with its slice."""
    log = (system.run_dir / "logs" / "deviceplugin-t4m.log").read_text()
    assert "memory unit 2 MiB chosen" in log
    pod = manifest(
        "on-t4",
        {"tessera.dev/gpu": 1, "tessera.dev/gpu-memory": 3000},
        namespace="team-c",
    )
    body = json.loads(pod)
    body["metadata"]["annotations"] = {"tessera.dev/gpu-model": "T4"}
    system.kubectl("apply", "-f", "-", stdin=json.dumps(body))
    running = system.wait_running("on-t4", "team-c")
    assert running["spec"]["nodeName"] == "t4m"
    env = system.kubectl("logs", "-n", "team-c", "on-t4").stdout
    assert "TESSERA_GPU_MEMORY_LIMIT_MIB=3000" in env.splitlines()


def exported_names(port: int) -> set[str]:
    """Every metric name a service's /metrics carries (families without samples included)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            names.add(line.split()[2])
        elif line and not line.startswith("#"):
            names.add(line.split("{")[0].split()[0])
    return names


def test_every_metric_the_alerts_and_the_grafana_dashboard_read_is_exported(
    system: System,
) -> None:
    """Scraped from the live services: the allocation figures from the dashboard, the device
    plugins' registration, the binders' leadership."""
    wanted: set[str] = set()
    for expr in rule_expressions() + dashboard_expressions():
        wanted |= metric_names(expr)
    assert len(wanted) >= 15
    deadline = time.monotonic() + 60
    while True:
        exported: set[str] = set()
        for port in system.endpoints["http_ports"].values():
            exported |= exported_names(port)
        missing = wanted - exported
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(1)  # the placers publish statistics every 10 s
    assert not missing, f"read by the alerts or the dashboard, exported by no service: {missing}"


def explain(
    system: System, *args: str, nats_url: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``tessera explain ARGS`` against the system (waiting up to 10 s for an answer unless ARGS
    say otherwise: placers on a loaded machine may take seconds to answer)."""
    timeout = [] if "--timeout-s" in args else ["--timeout-s", "10"]
    login = []  # the system's own NATS holds per-service identities: log in as its admin
    if nats_url is None and system.endpoints["nats_user"]:
        login = [
            "--nats-user",
            system.endpoints["nats_user"],
            "--nats-password-file",
            system.endpoints["nats_password_file"],
        ]
    return subprocess.run(
        [
            sys.executable, "-m", "tessera.cli", "explain", *args, *timeout,
            "--nats-url", nats_url or system.endpoints["nats_url"], *login,
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=60, env=environment_without_proxies(),
    )  # fmt: skip


def test_explain_says_where_a_pod_went_and_why_one_waits(system: System) -> None:
    placed = system.wait_running("seed")
    told = explain(system, "default/seed")
    assert told.returncode == 0, told.stderr
    lines = told.stdout.splitlines()
    assert lines[0].startswith(f"Pod default/seed (uid {placed['metadata']['uid']}), from placer-")
    assert "  claim: placed on node a100" in told.stdout
    assert "  assignment record: allocated" in told.stdout
    assert "    main: GPU " in told.stdout and ", 4096 MiB, " in told.stdout

    system.kubectl("apply", "-f", "-", stdin=manifest("too-wide", {"tessera.dev/gpu": 3}))
    deadline = time.monotonic() + 30
    while True:  # the placers reject it a moment after it is created
        told = explain(system, "team-a/too-wide", "-o", "json")
        if told.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert told.returncode == 0, told.stderr
    answer = json.loads(told.stdout)
    assert (answer["namespace"], answer["name"]) == ("team-a", "too-wide")
    explanation = answer["explanation"]
    assert "error" not in explanation, explanation
    assert explanation["nodes_fitting"] == 0 and explanation["nodes_total"] == 3
    assert sum(explanation["not_fitting"].values()) == 3
    people = explain(system, "team-a/too-wide").stdout
    assert "  nodes now: 0 of 3 fit" in people


def test_explain_says_clearly_when_it_cannot(system: System, tmp_path: Path) -> None:
    unknown = explain(system, "default/no-such-pod", "--timeout-s", "1")
    assert unknown.returncode == 1
    assert "no placer knows pod default/no-such-pod" in unknown.stderr
    usage = explain(system, "no-namespace")
    assert usage.returncode == 2 and "name the pod as NAMESPACE/POD" in usage.stderr
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    unreachable = explain(system, "default/seed", nats_url=f"nats://127.0.0.1:{closed}")
    assert unreachable.returncode == 3
    assert f"cannot reach NATS: connection refused by 127.0.0.1:{closed}" in unreachable.stderr
    with NatsServer() as lonely:  # a NATS no placer uses
        nobody = explain(system, "default/seed", nats_url=lonely.url)
    assert nobody.returncode == 3
    assert "no placer answers on tessera.placer.explain" in nobody.stderr
