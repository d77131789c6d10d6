"""The node plugin's DRA side with a simulated kubelet's DRA manager, over real gRPC on unix
sockets: registration through the plugin registry, NodePrepareResources only for what a placer
committed (records and bookings the test writes, as a placer and the binder would), the
container's env from the claim's CDI spec, NodeUnprepareResources removing it, and a restarted
plugin.

The test plays the placer and the scheduler (phase 2 of issue 49 gives that to the binder): it
writes the committed record and allocates the claim in the API double.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest

from services.deviceplugin.draplugin import DraNodePlugin, spec_path
from services.deviceplugin.draserver import GrpcDraServer
from services.deviceplugin.rules.allocate import ResponseOptions
from services.deviceplugin.rules.prepare import ClaimRef, Prepared, advanced_by, plan_prepare
from shared.dra.claims import ask_container
from shared.dra.devices import DEVICE_CLASS, DRIVER
from shared.messages.assignments import AssignmentRecord, ContainerAllocation, RecordView
from shared.messages.inventory import GpuTelemetry
from shared.messages.ledger import Booking
from tessera.devcluster.cluster import SimulatedCluster
from tessera.devcluster.dra import FINALIZER
from tessera.devcluster.kubelet import GpuCapacity, NodeSpec, SimulatedKubelet
from tessera.devcluster.resources import (
    DEVICE_CLASS as DEVICE_CLASSES,
)
from tessera.devcluster.resources import (
    EVENT,
    POD,
    RESOURCE_CLAIM,
    RESOURCE_CLAIM_TEMPLATE,
)
from tests.devcluster import dra_builders as b
from tests.harness import wire
from tests.harness.clock import FakeClock
from tests.harness.commits import booking_of
from tests.harness.wait import eventually

NODE = "node-a"
GPUS = (wire.gpu(0, memory_mib=81920), wire.gpu(1, memory_mib=81920))


@dataclass
class Committed:
    """This node's records and bookings: what the plugin's mirrors hold."""

    records: dict[str, AssignmentRecord] = field(default_factory=dict)
    revisions: dict[str, int] = field(default_factory=dict)
    bookings: dict[str, Booking] = field(default_factory=dict)
    gpus: dict[str, GpuTelemetry] = field(default_factory=lambda: {g.uuid: g for g in GPUS})

    def record_views(self) -> Iterable[RecordView]:
        return [
            RecordView(key=f"{NODE}.{k}", revision=self.revisions[k], record=r)
            for k, r in self.records.items()
        ]

    def place(self, record: AssignmentRecord, *, commit: bool = True) -> None:
        self.records[record.pod_uid] = record
        self.revisions[record.pod_uid] = self.revisions.get(record.pod_uid, 0) + 1
        if commit:
            self.bookings[record.pod_uid] = booking_of(record)

    async def advance(self, view: RecordView, record: AssignmentRecord) -> bool:
        """The records bucket's compare-and-set."""
        if self.revisions.get(record.pod_uid) != view.revision:
            return False
        self.place(record, commit=False)
        return True


class Scene:
    def __init__(self, cluster: SimulatedCluster, workdir: Path) -> None:
        self.cluster = cluster
        self.api = cluster.api
        self.kubelet: SimulatedKubelet = cluster.kubelets[NODE]
        self.state = Committed()
        self.registrations: list[tuple[bool, str]] = []
        self.server: GrpcDraServer | None = None

    async def start_plugin(self) -> None:
        plugin = DraNodePlugin(
            node=NODE,
            state=self.state,
            records=self.state,
            clock=FakeClock(),
            cdi_dir=self.kubelet.cdi_dir,
            options=ResponseOptions(isolation="hami-core", hami_core_library="/opt/libvgpu.so"),
        )
        self.plugin = plugin
        self.server = GrpcDraServer(
            plugin,
            driver=DRIVER,
            endpoint=self.kubelet.plugin_dir / "plugins" / DRIVER / "dra.sock",
            registration_socket=self.kubelet.registry_dir / f"{DRIVER}-reg.sock",
            on_registration=lambda ok, error: self.registrations.append((ok, error)),
        )
        await self.server.start()
        await self.kubelet.dra.wait_registered(DRIVER, timeout=20)

    async def stop_plugin(self) -> None:
        assert self.server is not None
        await self.server.stop()

    def pod(self) -> dict[str, Any]:
        name = f"train-{uuid.uuid4().hex[:6]}"
        return self.api.create(
            POD, b.pod_with_claims(name, [{"name": "gpu", "resourceClaimTemplateName": "slice"}])
        )

    async def claim_of(self, pod: dict[str, Any]) -> dict[str, Any]:
        def generated() -> dict[str, Any] | None:
            current = self.api.get(POD, "default", pod["metadata"]["name"])
            for status in current["status"].get("resourceClaimStatuses") or []:
                return self.api.find(RESOURCE_CLAIM, "default", status["resourceClaimName"])
            return None

        found = await eventually(generated, what="the generated claim")
        assert found is not None
        return found

    def record(self, pod: dict[str, Any], claim: dict[str, Any]) -> AssignmentRecord:
        """The record a placer commits for the pod: the claim's request on GPU 1."""
        return wire.record(
            pod["metadata"]["uid"],
            wire.container(
                ask_container(claim["metadata"]["name"], "gpu"),
                wire.share(1, memory_mib=8192, cores=25),
                devices=0,
            ),
            node=NODE,
            name=pod["metadata"]["name"],
            namespace="default",
            state="bound",
        )

    def allocate_and_bind(self, pod: dict[str, Any], claim: dict[str, Any]) -> None:
        """What the binder will write (phase 2): the allocation, the reservation, the binding."""
        name = claim["metadata"]["name"]
        self.api.patch(
            RESOURCE_CLAIM,
            "default",
            name,
            {"metadata": {"finalizers": [FINALIZER]}},
            "application/merge-patch+json",
        )
        result = b.result(
            "gpu-1", shareID=str(uuid.uuid4()), consumedCapacity={"memory": "8Gi", "compute": "25"}
        )
        status = {
            "allocation": b.allocation({**result, "driver": DRIVER, "pool": NODE}, node=NODE),
            "reservedFor": [b.consumer(pod["metadata"]["name"], pod["metadata"]["uid"])],
        }
        self.api.patch(
            RESOURCE_CLAIM,
            "default",
            name,
            {"status": status},
            "application/merge-patch+json",
            "status",
        )
        self.api.bind(
            "default", pod["metadata"]["name"], {"target": {"kind": "Node", "name": NODE}}
        )

    def phase(self, pod: dict[str, Any]) -> str:
        found = self.api.find(POD, "default", pod["metadata"]["name"])
        return str((found or {}).get("status", {}).get("phase", "gone"))

    async def until(self, pod: dict[str, Any], phase: str) -> None:
        await eventually(lambda: self.phase(pod) == phase, what=f"pod {phase}")

    def events(self, pod: dict[str, Any]) -> list[str]:
        return [
            e["note"]
            for e in self.api.objects(EVENT, "default")
            if e["regarding"].get("uid") == pod["metadata"]["uid"]
            and e["reason"] == "FailedPrepareDynamicResources"
        ]


@pytest.fixture
async def scene() -> AsyncIterator[Scene]:
    workdir = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))  # unix sockets: short paths
    node = NodeSpec(
        name=NODE,
        gpus=tuple(GpuCapacity(g.uuid, g.index, "A100", g.memory_total_mib) for g in GPUS),
    )
    cluster = SimulatedCluster([node], workdir=workdir, kubelet_retry_s=0.05, dra_poll_s=0.02)
    try:
        async with cluster:
            cluster.api.create(DEVICE_CLASSES, b.device_class(DEVICE_CLASS, DRIVER))
            template = b.template(
                "slice",
                {
                    "name": "gpu",
                    "exactly": {
                        "deviceClassName": DEVICE_CLASS,
                        "capacity": {"requests": {"memory": "8Gi", "compute": "25"}},
                    },
                },
            )
            cluster.api.create(RESOURCE_CLAIM_TEMPLATE, template)
            scene = Scene(cluster, workdir)
            await scene.start_plugin()
            yield scene
            await scene.stop_plugin()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


async def test_a_committed_claim_is_prepared_with_the_slice_env_and_unprepared(
    scene: Scene,
) -> None:
    told = await eventually(lambda: scene.registrations, what="the registration status")
    assert told == [(True, "")]
    pod = scene.pod()
    claim = await scene.claim_of(pod)
    scene.state.place(scene.record(pod, claim))
    scene.allocate_and_bind(pod, claim)
    await scene.until(pod, "Running")

    uid = claim["metadata"]["uid"]
    (given,) = [
        c
        for c in scene.kubelet.pods[pod["metadata"]["uid"]].containers
        if c.resource.startswith("resourceclaims/")
    ]
    assert given.device_ids == (f"{DRIVER}/gpu={uid}-gpu",)
    assert given.envs == {
        "NVIDIA_VISIBLE_DEVICES": wire.uuid_of(1),
        "TESSERA_GPU_MEMORY_LIMIT_MIB": "8192",
        "TESSERA_GPU_MEMORY_TOTAL_MIB": "81920",
        "TESSERA_GPU_CORES": "25",
        "CUDA_DEVICE_MEMORY_LIMIT_0": "8192m",
        "CUDA_DEVICE_SM_LIMIT": "25",
        "LD_PRELOAD": "/usr/local/vgpu/libvgpu.so",
    }
    assert given.mounts == (("/usr/local/vgpu/libvgpu.so", "/opt/libvgpu.so", True),)
    (device,) = scene.kubelet.dra.claims[("default", claim["metadata"]["name"])].devices[DRIVER]
    assert (device.pool, device.request_names) == (NODE, ("gpu",))
    assert scene.plugin.prepared() == {uid}
    # Prepared is handed over: the record moved on as an Allocate would move it.
    moved = scene.state.records[pod["metadata"]["uid"]]
    assert moved.state == "allocated"
    assert [(a.container, a.device_ids) for a in moved.allocated] == [
        (ask_container(claim["metadata"]["name"], "gpu"), (f"{DRIVER}/gpu={uid}-gpu",))
    ]

    # A restarted plugin keeps what it prepared: the spec stays, and it is removed on unprepare.
    await scene.stop_plugin()
    await scene.start_plugin()
    assert spec_path(scene.kubelet.cdi_dir, uid).exists()
    scene.api.delete(POD, "default", pod["metadata"]["name"])
    await scene.until(pod, "gone")
    assert not spec_path(scene.kubelet.cdi_dir, uid).exists()


async def test_a_claim_no_placer_committed_is_not_prepared(scene: Scene) -> None:
    pod = scene.pod()
    claim = await scene.claim_of(pod)
    scene.state.place(scene.record(pod, claim), commit=False)  # a record anyone could write
    scene.allocate_and_bind(pod, claim)
    notes = await eventually(lambda: scene.events(pod), what="the kubelet's event")
    assert "is not granted: node node-a's ledger holds nothing for pod" in notes[0], notes
    assert scene.phase(pod) == "Pending"
    assert not spec_path(scene.kubelet.cdi_dir, claim["metadata"]["uid"]).exists()

    scene.state.place(scene.record(pod, claim))  # the placer's commit arrives: it runs
    await scene.until(pod, "Running")


def test_what_is_refused_and_why() -> None:
    claim = ClaimRef(namespace="default", name="c", uid="u-1")
    container = wire.container(ask_container("c", "gpu"), wire.share(0), devices=0)
    bound = wire.record("p1", container, node=NODE, namespace="default", state="bound")
    gpus = {g.uuid: g for g in GPUS}

    def plan(*records: AssignmentRecord, gpus: Mapping[str, GpuTelemetry] = gpus) -> str:
        outcome = plan_prepare(
            claim,
            [RecordView(key=r.pod_uid, revision=1, record=r) for r in records],
            node=NODE,
            gpus=gpus,
            options=ResponseOptions(),
            bookings={r.pod_uid: booking_of(r) for r in records},
        )
        return getattr(outcome, "message", "prepared")

    assert plan(bound) == "prepared"
    assert "no bound assignment record" in plan(
        wire.record("p1", container, node=NODE, namespace="default", state="reserved")
    )
    assert "no bound assignment record" in plan(
        wire.record("p1", container, node=NODE, namespace="other", state="bound")
    )
    moved = wire.container(ask_container("c", "gpu"), wire.share(1), devices=0)
    other = wire.record("p2", moved, node=NODE, namespace="default", state="bound")
    assert "hold it on different GPUs" in plan(bound, other)
    sick = {**gpus, GPUS[0].uuid: wire.gpu(0, memory_mib=81920, health="unhealthy")}
    assert "not in node node-a's inventory or not healthy" in plan(bound, gpus=sick)


def test_a_prepared_claim_moves_on_each_committed_bound_record_that_holds_it() -> None:
    first = ClaimRef(namespace="default", name="c", uid="u-1")
    second = ClaimRef(namespace="default", name="d", uid="u-2")
    gpu_c = wire.container(ask_container("c", "gpu"), wire.share(0), devices=0)
    gpu_d = wire.container(ask_container("d", "gpu"), wire.share(1), devices=0)
    gpus = {g.uuid: g for g in GPUS}

    def advance(
        claims: list[ClaimRef], *records: AssignmentRecord, committed: bool = True
    ) -> list[tuple[str, str, list[tuple[str, tuple[str, ...]]]]]:
        views = [RecordView(key=r.pod_uid, revision=1, record=r) for r in records]
        bookings = {r.pod_uid: booking_of(r) for r in records} if committed else {}
        prepared = [
            plan_prepare(
                claim,
                views,
                node=NODE,
                gpus=gpus,
                options=ResponseOptions(),
                bookings={r.pod_uid: booking_of(r) for r in records},
            )
            for claim in claims
        ]
        assert all(isinstance(p, Prepared) for p in prepared), prepared
        return [
            (view.key, moved.state, [(a.container, a.device_ids) for a in moved.allocated])
            for view, moved in advanced_by(
                [p for p in prepared if isinstance(p, Prepared)], views, bookings=bookings, now=5.0
            )
        ]

    both = wire.record("p1", gpu_c, gpu_d, node=NODE, namespace="default", state="bound")
    c_ids = (f"{DRIVER}/gpu=u-1-gpu",)
    # A pod with two claims: allocated once both are prepared, as after two Allocates.
    assert advance([first], both) == [("p1", "bound", [(gpu_c.container, c_ids)])]
    half = msgspec.structs.replace(
        both,
        allocated=(
            ContainerAllocation(container=gpu_c.container, device_ids=c_ids, allocated_at=4.0),
        ),
    )
    assert advance([second], half) == [
        (
            "p1",
            "allocated",
            [(gpu_c.container, c_ids), (gpu_d.container, (f"{DRIVER}/gpu=u-2-gpu",))],
        )
    ]
    # Both claims in one kubelet call: one write, allocated at once.
    assert advance([first, second], both) == [
        (
            "p1",
            "allocated",
            [(gpu_c.container, c_ids), (gpu_d.container, (f"{DRIVER}/gpu=u-2-gpu",))],
        )
    ]
    # A claim two pods share moves both records; an allocated one, or one no placer
    # committed, is left as it is.
    mate = wire.record("p2", gpu_c, node=NODE, namespace="default", state="bound")
    one = wire.record("p3", gpu_c, node=NODE, namespace="default", state="bound")
    assert [key for key, _, _ in advance([first], one, mate)] == ["p3", "p2"]
    done = wire.record("p3", gpu_c, node=NODE, namespace="default", state="allocated")
    assert advance([first], done) == []
    assert advance([first], one, committed=False) == []
