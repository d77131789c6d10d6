"""The DRA parts of ``tessera up`` that need no process: a workload file of pods, claims and
templates, the built-in DRA mix, and the summary's checks of DRA containers against their
claims' allocations (an env that is not the allocation, a shared claim held once)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from shared.dra.devices import DRIVER
from tessera.up import dramix, report, workload
from tessera.up.command import configure, nodes_and_pods

WORKLOAD = """\
apiVersion: v1
kind: Pod
metadata: {name: infer}
spec:
  resourceClaims: [{name: gpu, resourceClaimTemplateName: a100-8g-25}]
  containers: [{name: main, image: x, resources: {claims: [{name: gpu}]}}]
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: a100-8g-25}
spec: {spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: gpu.tessera.dev}}]}}}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: shared}
spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: gpu.tessera.dev}}]}}
"""


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    configure(parser)
    return parser.parse_args(list(argv))


def test_a_workload_file_holds_pods_claims_and_templates_created_claims_first(
    tmp_path: Path,
) -> None:
    path = tmp_path / "w.yaml"
    path.write_text(WORKLOAD)
    objects = workload.from_file(path)
    assert [o["kind"] for o in objects] == ["Pod", "ResourceClaimTemplate", "ResourceClaim"]
    assert objects[0]["spec"]["schedulerName"] == "tessera"
    ordered = [o["kind"] for o in workload.in_create_order(objects)]
    assert ordered == ["ResourceClaimTemplate", "ResourceClaim", "Pod"]
    path.write_text("kind: Deployment\n")
    with pytest.raises(workload.WorkloadError, match="found Deployment"):
        workload.from_file(path)


def test_the_dra_mix_asks_through_templates_of_tessera_s_class() -> None:
    nodes, objects = nodes_and_pods(_args("--dra", "--nodes", "2", "--pods", "13"))
    assert all(n.dra for n in nodes)
    templates = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ResourceClaimTemplate"}
    pods = [o for o in objects if o["kind"] == "Pod"]
    assert len(pods) == 13
    named = {
        c["resourceClaimTemplateName"] for p in pods for c in p["spec"].get("resourceClaims", [])
    }
    assert named == set(templates)
    for made in templates.values():
        (request,) = made["spec"]["spec"]["devices"]["requests"]
        assert request["exactly"]["deviceClassName"] == DRIVER
    assert not any(
        "tessera.dev/gpu" in str(c["resources"].get("limits", {}))
        for p in pods
        for c in p["spec"]["containers"]
    )
    with pytest.raises(workload.WorkloadError, match="--dra"):
        nodes_and_pods(_args("--dra", "--trace", "x.csv"))


def _claim(name: str, results: list[tuple[str, int, str, str]]) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "d"},
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}
        },
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpu",
                            "driver": DRIVER,
                            "pool": pool,
                            "device": f"gpu-{index}",
                            "consumedCapacity": {"memory": memory, "compute": compute},
                        }
                        for pool, index, memory, compute in results
                    ]
                }
            },
            "reservedFor": [{"resource": "pods", "name": "x", "uid": "x"}],
        },
    }


def _pod(uid: str, claim: str) -> dict[str, Any]:
    assignment = {"node": "n", "decided_at": 100.0, "placer_id": "p", "containers": []}
    return {
        "metadata": {
            "uid": uid,
            "namespace": "d",
            "name": uid,
            "annotations": {"tessera.dev/assignment": json.dumps(assignment)},
        },
        "spec": {
            "containers": [{"name": "main", "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}],
        },
        "status": {
            "phase": "Running",
            "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": claim}],
        },
    }


def _seen(uid: str, claim: str, envs: dict[str, str]) -> report.PodSeen:
    return report.PodSeen(
        uid=uid,
        node="n",
        containers=(report.ContainerSeen("main", envs, resource=f"resourceclaims/{claim}"),),
        allocated_at=100.5,
        running_at=100.6,
    )


GPUS = [report.GpuSeen(uuid="GPU-a", node="n", memory_mib=16384, index=0)]
SLICE = {
    "NVIDIA_VISIBLE_DEVICES": "GPU-a",
    "TESSERA_GPU_MEMORY_LIMIT_MIB": "12288",
    "TESSERA_GPU_CORES": "60",
}


def test_a_claim_shared_by_two_pods_is_held_once_and_matches_its_allocation() -> None:
    claim = _claim("shared", [("n", 0, "12Gi", "60")])
    pods = [_pod("p1", "shared"), _pod("p2", "shared")]
    seen = {uid: _seen(uid, "shared", SLICE) for uid in ("p1", "p2")}
    summary = report.summarize(
        pods, seen, created_at={}, gpus=GPUS, observed=[], claims=[claim, _claim("other", [])]
    )
    assert summary.mismatched_containers == 0
    assert summary.overcommitted_gpus == 0  # 12 GiB of 16 held once, not twice
    assert summary.gpu_share_allocated["memory_pct"] == 75.0
    assert summary.claims == {"total": 2, "allocated": 2, "reserved": 2, "pending": 0}


def test_an_env_that_is_not_the_claim_s_allocation_is_mismatched() -> None:
    pods = [_pod("p1", "c1"), _pod("p2", "c2"), _pod("p3", "gone")]
    claims = [_claim("c1", [("n", 0, "8Gi", "60")]), _claim("c2", [("n", 1, "12Gi", "60")])]
    seen = {uid: _seen(uid, claim, SLICE) for uid, claim in (("p1", "c1"), ("p2", "c2"))}
    summary = report.summarize(pods, seen, created_at={}, gpus=GPUS, observed=[], claims=claims)
    wrong = sorted(summary.mismatches)
    assert "TESSERA_GPU_MEMORY_LIMIT_MIB=12288 (decided 8192)" in wrong[0]  # p1: 8 GiB claimed
    assert "device n/gpu-1 unknown" in wrong[1]  # p2: a GPU the node has not
    assert "claim 'gpu' not found" in wrong[2]  # p3: its claim is gone
    assert summary.mismatched_containers == 3


def test_a_burst_is_one_template_and_a_claim_per_pod() -> None:
    objects = dramix.slice_burst(3, gpu_memory="8Gi", compute="25")
    assert [o["kind"] for o in objects] == ["ResourceClaimTemplate"] + ["Pod"] * 3
    requests = objects[0]["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"]
    assert requests == {"requests": {"memory": "8Gi", "compute": "25"}}
