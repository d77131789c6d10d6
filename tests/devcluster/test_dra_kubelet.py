"""A simulated kubelet's DRA manager with a DRA plugin over real gRPC on unix sockets (the test
driver, ``dra_driver.py``), and kube-controller-manager's claim handling beside the API double.

The test plays the scheduler (Tessera's binder will, in its DRA mode): it allocates the claim
(finalizer, ``status.allocation``, ``reservedFor`` through ``/status``) and binds the pod.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tessera.devcluster.claims import generate_name
from tessera.devcluster.cluster import SimulatedCluster
from tessera.devcluster.dra import FINALIZER, POD_CLAIM_ANNOTATION
from tessera.devcluster.kubelet import GpuCapacity, NodeSpec, SimulatedKubelet
from tessera.devcluster.resources import (
    DEVICE_CLASS,
    EVENT,
    POD,
    RESOURCE_CLAIM,
    RESOURCE_CLAIM_TEMPLATE,
)
from tests.devcluster import dra_builders as b
from tests.devcluster.dra_driver import Gpu, TestDriver
from tests.harness.wait import eventually

pytestmark = pytest.mark.asyncio(loop_scope="module")

Obj = dict[str, Any]
NODE = "node-a"
DRIVER = "gpu.test"
GPUS = (Gpu("gpu-0", "GPU-aaaa-0", 81920), Gpu("gpu-1", "GPU-aaaa-1", 81920))


def make_driver(cluster: SimulatedCluster, name: str, **options: Any) -> TestDriver:
    """A test driver for the node, with the paths and API its kubelet plugin would be given."""
    kubelet = cluster.kubelets[NODE]
    return TestDriver(
        name=name,
        node=NODE,
        registry_dir=kubelet.registry_dir,
        socket_dir=kubelet.plugin_dir / "plugins" / name,
        cdi_dir=kubelet.cdi_dir,
        api_url=cluster.api.url,
        token=cluster.api.token,
        gpus=GPUS,
        **options,
    )


class Scene:
    """The cluster, its one node's kubelet and the test driver registered there."""

    def __init__(self, cluster: SimulatedCluster, driver: TestDriver) -> None:
        self.cluster = cluster
        self.api = cluster.api
        self.kubelet: SimulatedKubelet = cluster.kubelets[NODE]
        self.driver = driver

    def new_driver(self, name: str, **options: Any) -> TestDriver:
        return make_driver(self.cluster, name, **options)

    def pod(self, name: str, claims: list[Obj]) -> Obj:
        return self.api.create(POD, b.pod_with_claims(name, claims))

    def claim_for(self, pod: Obj, entry: str = "gpu") -> Obj | None:
        """The claim generated for the pod's ``entry``, once its name is in the pod's status."""
        current = self.api.get(POD, "default", pod["metadata"]["name"])
        for status in current["status"].get("resourceClaimStatuses") or []:
            if status["name"] == entry:
                return self.api.find(RESOURCE_CLAIM, "default", status["resourceClaimName"])
        return None

    async def generated(self, pod: Obj, entry: str = "gpu") -> Obj:
        """The claim the controller generates for the pod's ``entry``."""
        claim = await eventually(
            lambda: self.claim_for(pod, entry), what=f"the claim generated for {entry}"
        )
        assert claim is not None
        return claim

    async def until(self, pod: Obj, phase: str) -> None:
        await eventually(
            lambda: self.phase(pod) == phase, what=f"{pod['metadata']['name']} {phase}"
        )

    def allocate(self, claim: Obj, pod: Obj, *results: Obj) -> Obj:
        """What an allocator writes: the finalizer, then the allocation and the reservation."""
        meta = claim["metadata"]
        claim = self.api.patch(
            RESOURCE_CLAIM,
            "default",
            meta["name"],
            {"metadata": {"finalizers": [FINALIZER]}},
            "application/merge-patch+json",
        )
        status = {
            "allocation": b.allocation(*[{**r, "driver": DRIVER, "pool": NODE} for r in results]),
            "reservedFor": [b.consumer(pod["metadata"]["name"], pod["metadata"]["uid"])],
        }
        return self.api.patch(
            RESOURCE_CLAIM,
            "default",
            meta["name"],
            {"status": status},
            "application/merge-patch+json",
            "status",
        )

    def bind(self, pod: Obj) -> None:
        self.api.bind(
            "default", pod["metadata"]["name"], {"target": {"kind": "Node", "name": NODE}}
        )

    def phase(self, pod: Obj) -> str:
        found = self.api.find(POD, "default", pod["metadata"]["name"])
        return str((found or {}).get("status", {}).get("phase", "gone"))

    def events(self, pod: Obj, reason: str) -> list[str]:
        return [
            e["note"]
            for e in self.api.objects(EVENT, "default")
            if e["regarding"].get("uid") == pod["metadata"]["uid"] and e["reason"] == reason
        ]

    def record(self, pod: Obj) -> Any:
        return self.kubelet.pods[pod["metadata"]["uid"]]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def scene() -> AsyncIterator[Scene]:
    workdir = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))  # unix sockets: short paths
    node = NodeSpec(
        name=NODE,
        gpus=tuple(GpuCapacity(g.uuid, i, "A100", g.memory_mib) for i, g in enumerate(GPUS)),
    )
    cluster = SimulatedCluster([node], workdir=workdir, kubelet_retry_s=0.05, dra_poll_s=0.02)
    try:
        async with cluster:
            cluster.api.create(DEVICE_CLASS, b.device_class(b.CLASS, DRIVER))
            cluster.api.create(RESOURCE_CLAIM_TEMPLATE, b.template("one-gpu"))
            driver = make_driver(cluster, DRIVER)
            scene = Scene(cluster, driver)
            await driver.start()
            await driver.publish()
            await scene.kubelet.dra.wait_registered(DRIVER, timeout=20)
            yield scene
            await driver.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


async def test_a_registered_driver_gets_a_pod_running_with_the_env_of_its_cdi_spec(
    scene: Scene,
) -> None:
    told = await eventually(lambda: scene.driver.calls.registration, what="registration status")
    assert told == [(True, "")]
    pod = scene.pod(unique("train"), [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}])
    claim = await scene.generated(pod)
    meta = claim["metadata"]
    assert meta["name"].startswith(generate_name(pod["metadata"]["name"], "gpu"))
    assert meta["annotations"] == {POD_CLAIM_ANNOTATION: "gpu"}
    assert meta["ownerReferences"][0]["uid"] == pod["metadata"]["uid"]
    share = str(uuid.uuid4())
    scene.allocate(
        claim, pod, b.result("gpu-1", shareID=share, consumedCapacity={"memory": "20Gi"})
    )
    scene.bind(pod)
    await scene.until(pod, "Running")
    assert scene.driver.calls.prepared[-1] == [meta["name"]]
    (given,) = [r for r in scene.record(pod).containers if r.resource.startswith("resource")]
    assert given.resource == f"resourceclaims/{meta['name']}"
    assert given.device_ids == (f"{DRIVER}/gpu={meta['uid']}-gpu-1",)
    assert given.envs == {
        "DRA_DRIVER": DRIVER,
        "NVIDIA_VISIBLE_DEVICES": "GPU-aaaa-1",
        "TESSERA_GPU_MEMORY_LIMIT_MIB": "20480",
    }
    assert given.device_nodes == ("/dev/nvidia1",)
    (device,) = scene.kubelet.dra.claims[("default", meta["name"])].devices[DRIVER]
    assert device.share_id == share and device.request_names == ("gpu",)
    log = scene.kubelet.logs(scene.api.get(POD, "default", pod["metadata"]["name"]), "main")
    assert "NVIDIA_VISIBLE_DEVICES=GPU-aaaa-1" in log and "device /dev/nvidia1" in log
    assert scene.kubelet.usage()["GPU-aaaa-1"][:2] == (20480, 0)

    scene.api.delete(POD, "default", pod["metadata"]["name"])
    await scene.until(pod, "gone")
    assert scene.driver.calls.unprepared[-1] == [meta["name"]]
    assert scene.record(pod).unprepared == (meta["name"],)
    assert not scene.driver.spec_path(meta["uid"]).exists()
    await eventually(
        lambda: scene.api.find(RESOURCE_CLAIM, "default", meta["name"]) is None,
        what="the generated claim deleted with its pod",
    )


async def test_an_unallocated_claim_keeps_the_pod_pending_with_the_kubelet_s_reason(
    scene: Scene,
) -> None:
    name = unique("shared")
    claim = scene.api.create(RESOURCE_CLAIM, b.claim(name))
    pod = scene.pod(unique("waits"), [{"name": "gpu", "resourceClaimName": name}])
    scene.bind(pod)
    reason = "FailedPrepareDynamicResources"
    notes = await eventually(lambda: scene.events(pod, reason), what="the kubelet's event")
    assert notes == [
        "Failed to prepare dynamic resources: prepare dynamic resources: pod "
        f"{pod['metadata']['name']} ({pod['metadata']['uid']}) is not allowed to use "
        f"ResourceClaim {name} ({claim['metadata']['uid']})"
    ]
    current = scene.api.get(POD, "default", pod["metadata"]["name"])
    assert current["status"]["phase"] == "Pending"
    waiting = current["status"]["containerStatuses"][0]["state"]["waiting"]
    assert waiting == {"reason": "ContainerCreating"}
    assert scene.record(pod).waiting_reason == reason
    calls = len(scene.driver.calls.prepared)

    scene.allocate(claim, pod, b.result("gpu-0"))  # the kubelet tries again, and it runs
    await scene.until(pod, "Running")
    assert len(scene.driver.calls.prepared) == calls + 1
    scene.api.delete(POD, "default", pod["metadata"]["name"])
    await scene.until(pod, "gone")
    assert scene.driver.calls.unprepared[-1] == [name]
    await eventually(
        lambda: scene.api.get(RESOURCE_CLAIM, "default", name)["status"] == {},
        what="the claim deallocated once nothing reserves it",
    )
    assert scene.api.get(RESOURCE_CLAIM, "default", name)["metadata"].get("finalizers") is None


async def test_a_pod_that_never_prepared_is_deleted_without_unprepare(scene: Scene) -> None:
    name = unique("never")
    scene.api.create(RESOURCE_CLAIM, b.claim(name))
    pod = scene.pod(unique("gone"), [{"name": "gpu", "resourceClaimName": name}])
    scene.bind(pod)
    await eventually(lambda: scene.events(pod, "FailedPrepareDynamicResources"))
    calls = list(scene.driver.calls.unprepared)
    scene.api.delete(POD, "default", pod["metadata"]["name"])
    await scene.until(pod, "gone")
    assert scene.driver.calls.unprepared == calls, "nothing was prepared, nothing to undo"


async def test_claims_are_prepared_in_one_call_and_one_left_out_is_asked_again(
    scene: Scene,
) -> None:
    pod = scene.pod(
        unique("two"),
        [
            {"name": "gpu", "resourceClaimTemplateName": "one-gpu"},
            {"name": "spare", "resourceClaimTemplateName": "one-gpu"},
        ],
    )
    first = await scene.generated(pod, "gpu")
    second = await scene.generated(pod, "spare")
    scene.allocate(first, pod, b.result("gpu-0"))
    scene.allocate(second, pod, b.result("gpu-1"))
    scene.driver.skip_once.add(second["metadata"]["name"])
    before = len(scene.driver.calls.prepared)
    scene.bind(pod)
    await scene.until(pod, "Running")
    both = sorted([first["metadata"]["name"], second["metadata"]["name"]])
    calls = [sorted(c) for c in scene.driver.calls.prepared[before:]]
    assert calls == [both, both], "both in one call; asked again for what was left out"
    notes = scene.events(pod, "FailedPrepareDynamicResources")
    assert notes == [
        "Failed to prepare dynamic resources: prepare dynamic resources: NodePrepareResources "
        "skipped 1 ResourceClaims"
    ]
    env = {k: v for r in scene.record(pod).containers for k, v in r.envs.items()}
    assert env["NVIDIA_VISIBLE_DEVICES"] in ("GPU-aaaa-0", "GPU-aaaa-1")
    scene.api.delete(POD, "default", pod["metadata"]["name"])
    await scene.until(pod, "gone")
    assert sorted(scene.driver.calls.unprepared[-1]) == both


async def test_an_error_for_a_claim_is_the_pod_s_reason_until_the_driver_prepares_it(
    scene: Scene,
) -> None:
    pod = scene.pod(unique("err"), [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}])
    claim = await scene.generated(pod)
    scene.driver.errors[claim["metadata"]["name"]] = "device gpu-0 is being reset"
    scene.allocate(claim, pod, b.result("gpu-0"))
    scene.bind(pod)
    note = await eventually(lambda: scene.events(pod, "FailedPrepareDynamicResources"))
    assert note[0].endswith(
        f"NodePrepareResources failed for ResourceClaim {claim['metadata']['name']}: device "
        "gpu-0 is being reset"
    )
    del scene.driver.errors[claim["metadata"]["name"]]
    await scene.until(pod, "Running")
    scene.api.delete(POD, "default", pod["metadata"]["name"])
    await scene.until(pod, "gone")


async def test_a_cdi_name_without_a_spec_fails_the_container(scene: Scene) -> None:
    pod = scene.pod(unique("nocdi"), [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}])
    claim = await scene.generated(pod)
    scene.driver.no_spec.add(claim["metadata"]["name"])
    scene.allocate(claim, pod, b.result("gpu-0"))
    scene.bind(pod)

    def waiting() -> Obj | None:
        statuses = scene.api.get(POD, "default", pod["metadata"]["name"])["status"]
        for status in statuses.get("containerStatuses") or []:
            state = status["state"].get("waiting") or {}
            if state.get("reason") == "CreateContainerError":
                return state
        return None

    state = await eventually(waiting, what="CreateContainerError")
    assert state is not None
    assert state["message"] == (
        "Error: CDI device injection failed: unresolvable CDI devices "
        f"{DRIVER}/gpu={claim['metadata']['uid']}-gpu-0"
    )
    assert scene.phase(pod) == "Pending"
    scene.api.delete(POD, "default", pod["metadata"]["name"])
    await scene.until(pod, "gone")
    assert scene.driver.calls.unprepared[-1] == [claim["metadata"]["name"]]


async def test_over_commit_checks_cover_dra_pods(scene: Scene) -> None:
    """Two pods' claims share gpu-0 (consumable capacity) beyond its memory: the kubelet's
    check of what containers hold against the real GPU sees it, as for device-plugin pods."""
    pods = []
    for _ in range(2):
        pod = scene.pod(unique("big"), [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}])
        claim = await scene.generated(pod)
        scene.allocate(
            claim,
            pod,
            b.result("gpu-0", shareID=str(uuid.uuid4()), consumedCapacity={"memory": "50Gi"}),
        )
        scene.bind(pod)
        pods.append(pod)
    for pod in pods:
        await scene.until(pod, "Running")
    over = [o for o in scene.kubelet.overcommits if o.gpu == "GPU-aaaa-0"]
    assert over and over[-1].memory_mib == 102400 and over[-1].memory_total_mib == 81920
    assert sorted(over[-1].pods) == sorted(f"default/{p['metadata']['name']}" for p in pods)
    for pod in pods:
        scene.api.delete(POD, "default", pod["metadata"]["name"])
    for pod in pods:
        await scene.until(pod, "gone")


async def test_a_plugin_that_restarts_registers_again(scene: Scene) -> None:
    registrations = scene.kubelet.dra.registrations
    await scene.driver.stop()
    await eventually(lambda: DRIVER not in scene.kubelet.dra.plugins, what="deregistered")
    pod = scene.pod(unique("later"), [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}])
    claim = await scene.generated(pod)
    scene.allocate(claim, pod, b.result("gpu-0"))
    scene.bind(pod)
    notes = await eventually(lambda: scene.events(pod, "FailedPrepareDynamicResources"))
    assert notes[0].endswith(f"DRA driver {DRIVER} is not registered")
    await scene.driver.start()
    await scene.until(pod, "Running")
    assert scene.kubelet.dra.registrations == registrations + 1
    scene.api.delete(POD, "default", pod["metadata"]["name"])
    await scene.until(pod, "gone")


async def test_a_plugin_registering_again_mid_prepare_fails_that_call_and_the_pod_starts(
    scene: Scene,
) -> None:
    # The kubelet closes the old registration's channel, which cancels the call in flight: the
    # call fails as Go's client fails it, and the node's pod worker carries on.
    scene.driver.held = release = asyncio.Event()
    try:
        pod = scene.pod(unique("mid"), [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}])
        claim = await scene.generated(pod)
        scene.allocate(claim, pod, b.result("gpu-0"))
        scene.bind(pod)
        name = claim["metadata"]["name"]
        await eventually(
            lambda: any(name in call for call in scene.driver.calls.prepared), what="a prepare"
        )
        registrations = scene.kubelet.dra.registrations
        await scene.driver.register_again()
        # Also "not registered", when the pod is tried again before the plugin is back.
        cut_off = (
            "NodePrepareResources: rpc error: code = Cancelled desc = grpc: the client "
            "connection is closing"
        )
        await eventually(
            lambda: any(
                note.endswith(cut_off)
                for note in scene.events(pod, "FailedPrepareDynamicResources")
            ),
            what="the call cut off",
        )
        await eventually(
            lambda: scene.kubelet.dra.registrations == registrations + 1, what="registered again"
        )
    finally:
        scene.driver.held = None
        release.set()
    await scene.until(pod, "Running")
    scene.api.delete(POD, "default", pod["metadata"]["name"])
    await scene.until(pod, "gone")


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        pytest.param(
            {"services": ("v1beta1.DRAPlugin",)},
            'none of services supported by the plugin (["v1beta1.DRAPlugin"]) are supported by '
            'the kubelet (["v1.DRAPlugin"])',
            id="unsupported-service",
        ),
        pytest.param(
            {"services": ()},
            "empty list of supported gRPC services (aka supported versions)",
            id="no-service",
        ),
        pytest.param(
            {"plugin_type": "CSIPlugin"},
            "no handler registered for plugin type: CSIPlugin",
            id="not-dra",
        ),
    ],
)
async def test_a_plugin_the_kubelet_cannot_use_is_told_why(
    scene: Scene, options: dict[str, Any], problem: str
) -> None:
    name = unique("x") + ".test"
    driver = scene.new_driver(name, **options)
    await driver.start()
    try:
        registered, error = await eventually(
            lambda: driver.calls.registration and driver.calls.registration[-1],
            what="the registration status",
        )
        assert not registered and problem in error
        assert name not in scene.kubelet.dra.plugins
    finally:
        await driver.stop()


async def test_a_missing_template_is_a_warning_until_it_appears(scene: Scene) -> None:
    template = unique("later")
    pod = scene.pod(unique("tpl"), [{"name": "gpu", "resourceClaimTemplateName": template}])
    notes = await eventually(lambda: scene.events(pod, "FailedResourceClaimCreation"))
    assert notes[0] == (
        f'PodResourceClaim gpu: resource claim template "{template}": '
        f'resourceclaimtemplate.resource.k8s.io "{template}" not found'
    )
    scene.api.create(RESOURCE_CLAIM_TEMPLATE, b.template(template))
    claim = await scene.generated(pod)
    assert claim["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == b.CLASS
    scene.api.delete(POD, "default", pod["metadata"]["name"])
    await eventually(
        lambda: scene.api.find(RESOURCE_CLAIM, "default", claim["metadata"]["name"]) is None,
        what="the claim collected with its unbound pod",
    )
