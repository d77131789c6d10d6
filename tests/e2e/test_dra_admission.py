"""DRA pods through kubectl, in real processes (``tessera up``'s system with the webhook): the
README's template and pod, applied together, run on Tessera's scheduler (the webhook learned the
template from the binder's index); the same pod on another scheduler is refused with its line;
and a claim allocated by another allocator holds its GPU until it is deallocated, so Tessera never
books it twice."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml

from tessera.devcluster.resources import POD, RESOURCE_CLAIM
from tessera.up.spec import plan_nodes
from tessera.up.system import LocalSystem, SystemOptions
from tests.devcluster.test_kubectl import kubectl
from tests.e2e.helpers import pending_message, phase, started, until
from tests.test_readme_dra import dra_manifests

pytestmark = [pytest.mark.asyncio(loop_scope="package"), pytest.mark.timeout(240)]

Obj = dict[str, Any]
NODE = "dra-a100"
MERGE = "application/merge-patch+json"


@pytest_asyncio.fixture(scope="module", loop_scope="package")
async def system(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalSystem]:
    run_dir: Path = tmp_path_factory.mktemp("e2e-dra-admission")
    async with started(
        SystemOptions(
            nodes=plan_nodes(f"{NODE}=1xA100-80GB:api=dra"),
            run_dir=run_dir,
            placers=1,
            dashboard=False,
            webhook=True,
            ready_timeout_s=150.0,
        )
    ) as local:
        yield local


def readme(pod_name: str, scheduler: str | None = None) -> str:
    """The README's namespace-less manifests as YAML, the pod renamed (and its scheduler set)."""
    manifests = dra_manifests()
    pod = json.loads(json.dumps(manifests["Pod"]))
    pod["metadata"]["name"] = pod_name
    if scheduler:
        pod["spec"]["schedulerName"] = scheduler
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}}
    return str(yaml.safe_dump_all([namespace, manifests["ResourceClaimTemplate"], pod]))


def current(system: LocalSystem, name: str) -> Obj:
    return system.cluster.api.get(POD, "ml", name)


def running(system: LocalSystem, name: str) -> Obj | None:
    pod = current(system, name)
    return pod if phase(pod) == "Running" else None


def explained(system: LocalSystem, name: str) -> Obj | None:
    """The pod once Pending for want of room (before that it may wait for its claim)."""
    pod = current(system, name)
    return pod if "nodes are available" in pending_message(pod) else None


async def test_readme_pods_run_on_tessera_and_another_scheduler_is_refused(
    system: LocalSystem,
) -> None:
    applied = await kubectl(system.kubeconfig, "apply", "-f", "-", stdin=readme("train"))
    assert applied.returncode == 0, applied.stderr
    pod = await until(
        lambda: running(system, "train"),
        what="the README's pod running",
    )
    assert pod["spec"]["schedulerName"] == "tessera"

    refused = await kubectl(
        system.kubeconfig, "apply", "-f", "-", stdin=readme("train-volcano", "volcano")
    )
    assert refused.returncode != 0
    assert (
        'admission webhook "validate.tessera.dev" denied the request: spec.schedulerName: '
        '"volcano" may not place this pod: spec.resourceClaims[0] (ResourceClaimTemplate '
        '"a100-8gi-quarter") asks for devices of class gpu.tessera.dev, which Tessera alone '
        "allocates (two allocators would book one GPU twice); set spec.schedulerName to "
        '"tessera" or leave it unset'
    ) in refused.stderr, refused.stderr
    # A template nobody made: let through as written after the wait, with a warning kubectl prints.
    unknown = readme("orphan").replace(
        "resourceClaimTemplateName: a100-8gi-quarter", "resourceClaimTemplateName: never-made"
    )
    applied = await kubectl(system.kubeconfig, "apply", "-f", "-", stdin=unknown)
    assert applied.returncode == 0, applied.stderr
    assert (
        'Warning: spec.resourceClaims[0] (ResourceClaimTemplate "never-made") is not known to '
        'Tessera yet: if it asks for gpu.tessera.dev devices, set spec.schedulerName to "tessera"'
    ) in applied.stderr, applied.stderr
    assert current(system, "orphan")["spec"]["schedulerName"] == "default-scheduler"
    for name in ("train", "orphan"):
        deleted = await kubectl(
            system.kubeconfig, "-n", "ml", "delete", "pod", name, "--wait=false"
        )
        assert deleted.returncode == 0, deleted.stderr


async def test_a_claim_another_allocator_took_holds_its_gpu_until_deallocated(
    system: LocalSystem,
) -> None:
    """The node's one GPU taken whole by a claim nobody of Tessera's holds: the README's pod
    waits, explained; once the claim is deallocated, it runs."""
    api = system.cluster.api
    await until(lambda: api.find(POD, "ml", "train") is None, what="the first test's pod gone")
    request = {"name": "gpu", "exactly": {"deviceClassName": "gpu.tessera.dev"}}
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "kube-made"},
        "spec": {"devices": {"requests": [request]}},
    }
    api.create(RESOURCE_CLAIM, claim, "ml")
    result = {"request": "gpu", "driver": "gpu.tessera.dev", "pool": NODE, "device": "gpu-0"}
    selector = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
    status = {
        "allocation": {
            "devices": {"results": [result]},
            "nodeSelector": {"nodeSelectorTerms": [selector]},
        },
        "reservedFor": [{"resource": "pods", "name": "elsewhere", "uid": "u-elsewhere"}],
    }
    api.patch(RESOURCE_CLAIM, "ml", "kube-made", {"status": status}, MERGE, subresource="status")

    applied = await kubectl(system.kubeconfig, "apply", "-f", "-", stdin=readme("waits"))
    assert applied.returncode == 0, applied.stderr
    waiting = await until(
        lambda: explained(system, "waits"),
        what="the pod explained Pending",
    )
    assert phase(waiting) == "Pending"
    assert pending_message(waiting).startswith("0/1 nodes are available"), waiting

    gone = {"status": {"allocation": None, "reservedFor": None}}
    api.patch(RESOURCE_CLAIM, "ml", "kube-made", gone, MERGE, subresource="status")
    await until(
        lambda: running(system, "waits"),
        what="the pod running once the other allocator's claim is deallocated",
    )
