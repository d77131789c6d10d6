"""The Allocate hand-off under parallel binds, bad input, and kubectl against the cluster."""

from __future__ import annotations

import asyncio
import json

import pytest

from tessera.devcluster.resources import POD
from tessera.up import report
from tessera.up import workload as w
from tessera.up.system import LocalSystem
from tests.e2e.helpers import (
    assert_exact,
    by_name,
    clear,
    kubectl,
    pending_message,
    phase,
    settle,
)

pytestmark = [pytest.mark.asyncio(loop_scope="package"), pytest.mark.timeout(240)]


async def test_hundreds_of_same_size_pods_bound_in_parallel_get_exactly_their_slices(
    system: LocalSystem,
) -> None:
    ns = "handoff"
    count = 240
    for i in range(count):
        system.cluster.create_pod(
            w.pod(
                f"same-{i}",
                [w.container(gpu=1, memory_mib=2048, cores=1, cpu="100m", memory="128Mi")],
                annotations={"tessera.dev/gpu-model": "A100"},
                namespace=ns,
            )
        )
    pods = await settle(system, ns, count, timeout=180)
    assert all(phase(p) == "Running" for p in pods), [
        (p["metadata"]["name"], phase(p), pending_message(p)) for p in pods if phase(p) != "Running"
    ]
    assert {p["spec"]["nodeName"] for p in pods} == {"a100-1", "a100-2"}
    await assert_exact(system, pods)
    summary = system.summary(pods)
    assert summary.mismatched_containers == 0
    assert summary.overcommitted_gpus == 0
    await clear(system, ns, timeout=120)


async def test_malformed_requests_end_as_explained_pending(system: LocalSystem) -> None:
    ns = "malformed"
    bad = {
        "cores-150": w.container(gpu=1, memory_mib=1024, cores=150),
        "memory-without-gpu": w.container(memory_mib=1024),
        "memory-twice": w.container(gpu=1, memory_mib=1024, memory_pct=10),
    }
    for name, container in bad.items():
        system.cluster.create_pod(w.pod(name, [container], namespace=ns))
    typo = w.pod("typo", [w.container(gpu=1)], namespace=ns)
    typo["spec"]["containers"][0]["resources"]["limits"]["tessera.dev/gpu-memroy"] = "1"
    system.cluster.create_pod(typo)
    unknown_policy = w.pod(
        "policy", [w.container(gpu=1)], namespace=ns, annotations={"tessera.dev/gpu-policy": "x"}
    )
    system.cluster.create_pod(unknown_policy)
    # More containers with GPUs than an assignment record holds: placed and bound, it would fail
    # the kubelet's admission (the device plugin refuses its record); refused before that.
    wide = [
        w.container(f"c{i}", gpu=1, memory_mib=256, cpu="10m", memory="16Mi") for i in range(65)
    ]
    system.cluster.create_pod(w.pod("wide", wide, namespace=ns))
    pods = by_name(await settle(system, ns, 6))
    for name, pod in pods.items():
        assert phase(pod) == "Pending" and not pod["spec"].get("nodeName"), name
    assert "tessera.dev/gpu-cores" in pending_message(pods["cores-150"])
    assert "needs tessera.dev/gpu" in pending_message(pods["memory-without-gpu"])
    assert "not both" in pending_message(pods["memory-twice"])
    assert "gpu-memroy" in pending_message(pods["typo"])
    assert "tessera.dev/gpu-policy" in pending_message(pods["policy"])
    assert (
        "spec.containers: 65 containers ask for tessera.dev/gpu; at most 64 per pod can be "
        "handed GPUs" in pending_message(pods["wide"])
    )
    await clear(system, ns)


async def test_a_hostile_assignment_annotation_changes_nothing(system: LocalSystem) -> None:
    ns = "hostile"
    victim_gpu = system.capacities["a100-1"][0]
    lie = {
        "node": "a100-1",
        "containers": [
            {
                "container": "main",
                "gpus": [{"uuid": victim_gpu.uuid, "index": 0, "memory_mib": 81920, "cores": 100}],
            }
        ],
        "decided_at": 0.0,
        "placer_id": "me",
    }
    system.cluster.create_pod(
        w.pod(
            "liar",
            [w.container(gpu=1, memory_mib=1024, cores=5)],
            namespace=ns,
            annotations={"tessera.dev/assignment": json.dumps(lie), "tessera.dev/assigned": "true"},
        )
    )
    pod = (await settle(system, ns, 1))[0]
    assert phase(pod) == "Running"
    annotation = json.loads(pod["metadata"]["annotations"]["tessera.dev/assignment"])
    assert annotation["placer_id"] != "me"
    slices = annotation["containers"][0]["gpus"]
    assert [(s["memory_mib"], s["cores"]) for s in slices] == [(1024, 5)]
    await assert_exact(system, [pod])
    await clear(system, ns)


async def test_kubectl_creates_lists_and_describes(system: LocalSystem) -> None:
    manifest = """
apiVersion: v1
kind: Pod
metadata:
  name: from-kubectl
  namespace: kubectl
spec:
  schedulerName: tessera
  containers:
  - name: main
    image: registry.k8s.io/pause:3.10
    resources:
      limits:
        tessera.dev/gpu: 1
        tessera.dev/gpu-memory: 3072
        tessera.dev/gpu-cores: 15
---
apiVersion: v1
kind: Pod
metadata:
  name: impossible
  namespace: kubectl
spec:
  schedulerName: tessera
  nodeSelector:
    topology.kubernetes.io/zone: nowhere
  containers:
  - name: main
    image: registry.k8s.io/pause:3.10
    resources:
      limits:
        tessera.dev/gpu: 1
        tessera.dev/gpu-memory: 3072
"""
    out = await asyncio.to_thread(kubectl, system, "create", "-f", "-", stdin=manifest)
    assert "pod/from-kubectl created" in out and "pod/impossible created" in out
    pods = by_name(await settle(system, "kubectl", 2))
    running = pods["from-kubectl"]
    assert phase(running) == "Running"
    wide = await asyncio.to_thread(kubectl, system, "get", "pods", "-n", "kubectl", "-o", "wide")
    header, *rows = wide.splitlines()
    assert header.split()[:5] == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert "NODE" in header and "IP" in header
    line = next(r for r in rows if r.startswith("from-kubectl"))
    assert "Running" in line and running["spec"]["nodeName"] in line
    assert running["status"]["podIP"] in line
    assert "Pending" in next(r for r in rows if r.startswith("impossible"))
    nodes = await asyncio.to_thread(kubectl, system, "get", "nodes")
    for name in system.plans:
        assert any(r.split()[:2] == [name, "Ready"] for r in nodes.splitlines()), nodes
    described = await asyncio.to_thread(
        kubectl, system, "describe", "pod", "-n", "kubectl", "impossible"
    )
    assert "FailedScheduling" in described
    assert "didn't match Pod's node affinity/selector" in described
    assert "Status:" in described and "Pending" in described
    node = await asyncio.to_thread(kubectl, system, "describe", "node", "a100-1")
    assert "tessera.dev/gpu:" in node
    await assert_exact(system, list(pods.values()))
    seen = system.seen()[running["metadata"]["uid"]]
    assert report.mismatches(system.cluster.api.get(POD, "kubectl", "from-kubectl"), seen) == []
    await clear(system, "kubectl")
