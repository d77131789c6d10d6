"""The real kubectl against the simulated cluster's ``resource.k8s.io/v1``: discovery, apply,
the claim kube-controller-manager generates for a pod, get (with the claim's state) and describe,
and the API server's refusals as kubectl shows them."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio

from tessera.devcluster.cluster import SimulatedCluster
from tessera.devcluster.kubelet import NodeSpec
from tessera.devcluster.resources import POD, RESOURCE_CLAIM
from tests.devcluster import dra_builders as b
from tests.harness.wait import eventually

pytestmark = pytest.mark.asyncio(loop_scope="module")

KUBECTL = Path(sys.executable).parent / "kubectl"
MANIFESTS = """
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: test-gpu
spec:
  selectors:
  - cel:
      expression: device.driver == "gpu.test"
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: one-gpu
  namespace: team-a
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: test-gpu
          capacity:
            requests:
              memory: 8Gi
---
apiVersion: v1
kind: Pod
metadata:
  name: notebook
  namespace: team-a
spec:
  resourceClaims:
  - name: gpu
    resourceClaimTemplateName: one-gpu
  containers:
  - name: main
    image: cuda:12
    resources:
      claims:
      - name: gpu
"""


@dataclass
class Kubectl:
    cluster: SimulatedCluster
    kubeconfig: Path

    async def __call__(self, *args: str, stdin: str = "") -> tuple[int, str, str]:
        process = await asyncio.create_subprocess_exec(
            str(KUBECTL),
            "--kubeconfig",
            str(self.kubeconfig),
            *args,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        out, err = await process.communicate(stdin.encode())
        return process.returncode or 0, out.decode(), err.decode()


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def kubectl() -> AsyncIterator[Kubectl]:
    workdir = Path(tempfile.mkdtemp(prefix="kc-", dir="/tmp"))
    try:
        async with SimulatedCluster([NodeSpec("node-a")], workdir=workdir) as cluster:
            yield Kubectl(cluster, cluster.write_kubeconfig(workdir / "kubeconfig"))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


async def test_api_resources_lists_the_dra_kinds(kubectl: Kubectl) -> None:
    code, out, err = await kubectl("api-resources", "--api-group=resource.k8s.io")
    assert code == 0, err
    rows = {line.split()[0]: line.split() for line in out.splitlines()[1:]}
    assert sorted(rows) == [
        "deviceclasses",
        "resourceclaims",
        "resourceclaimtemplates",
        "resourceslices",
    ]
    assert rows["resourceclaims"][1:] == ["resource.k8s.io/v1", "true", "ResourceClaim"]


async def test_apply_a_class_a_template_and_a_pod_then_get_and_describe_its_claim(
    kubectl: Kubectl,
) -> None:
    code, out, err = await kubectl("apply", "-f", "-", stdin=MANIFESTS)
    assert code == 0, err
    assert out.split("\n")[:3] == [
        "deviceclass.resource.k8s.io/test-gpu created",
        "resourceclaimtemplate.resource.k8s.io/one-gpu created",
        "pod/notebook created",
    ]
    api = kubectl.cluster.api

    def generated() -> str:
        statuses = api.get(POD, "team-a", "notebook")["status"].get("resourceClaimStatuses")
        return str(statuses[0]["resourceClaimName"]) if statuses else ""

    claim = await eventually(generated, what="the generated claim's name in the pod status")
    code, out, err = await kubectl("get", "resourceclaims", "-n", "team-a")
    assert code == 0, err
    assert out.splitlines()[0].split() == ["NAME", "STATE", "AGE"]
    assert out.splitlines()[1].split()[:2] == [claim, "pending"]

    code, out, err = await kubectl("describe", "resourceclaim", "-n", "team-a", claim)
    assert code == 0, err
    described: dict[str, str] = {}  # each label's first value (owner references repeat some)
    for key, _, value in (line.partition(":") for line in out.splitlines()):
        if value.strip():
            described.setdefault(key.strip(), value.strip())
    assert described["Name"] == claim and described["Namespace"] == "team-a"
    assert described["Annotations"] == "resource.kubernetes.io/pod-claim-name: gpu"
    assert described["Kind"] == "ResourceClaim"
    assert described["Device Class Name"] == "test-gpu"
    assert described["Memory"] == "8Gi" and described["Allocation Mode"] == "ExactCount"
    assert "Owner References:" in out and "Name:                  notebook" in out

    pod = api.get(POD, "team-a", "notebook")
    api.patch(
        RESOURCE_CLAIM,
        "team-a",
        claim,
        {
            "status": {
                "allocation": b.allocation(b.result(driver="gpu.test")),
                "reservedFor": [b.consumer("notebook", pod["metadata"]["uid"])],
            }
        },
        "application/merge-patch+json",
        "status",
    )
    code, out, err = await kubectl("get", "resourceclaim", "-n", "team-a", claim)
    assert code == 0 and out.splitlines()[1].split()[1] == "allocated,reserved", (out, err)

    code, out, err = await kubectl("apply", "-f", "-", stdin=MANIFESTS)
    assert code == 0, err
    assert "deviceclass.resource.k8s.io/test-gpu unchanged" in out
    assert "pod/notebook unchanged" in out


async def test_kubectl_shows_the_api_server_s_refusals(kubectl: Kubectl) -> None:
    slice_body = b.resource_slice(
        "too-many", devices=[b.device(f"gpu-{i}") for i in range(129)], driver="gpu.test"
    )
    code, _, err = await kubectl("create", "-f", "-", stdin=_json(slice_body))
    assert code != 0
    assert 'The ResourceSlice "too-many" is invalid' in err, err

    claim = b.claim("colourful", b.request(colour="green"))
    code, _, err = await kubectl("apply", "-f", "-", stdin=_json(claim))
    assert code != 0
    assert (
        "BadRequest" in err
        and ('strict decoding error: unknown field "spec.devices.requests[0].exactly.colour"')
        in err
    )


def _json(body: object) -> str:
    return json.dumps(body)
