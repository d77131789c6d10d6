"""The binder's shell: its parts wired together, leadership, and the process body
(:func:`run_binder`). Kubernetes in, NATS out; placements in, Bindings out; Pending explained.

Always running (leader or standby), so a standby is warm when it takes over:

- the pod and node informers (:mod:`~services.binder.sync`);
- a mirror of the pods' claims (KV watch; :class:`~services.binder.claims.ClaimMirror`): the
  placed ones are the binder's work;
- a mirror of the assignment records (KV watch; :class:`~shared.runtime.records.RecordMirror`);
- leader election on a Lease (``--leader-elect``; :mod:`~services.binder.leader`);
- answers to the placer's extender asking for the pod kube-scheduler binds
  (:mod:`~services.binder.lookups`).

Only the leader writes (to Kubernetes and to NATS), every write fenced by the Lease
(:class:`~services.binder.fenced.FencedGateway`, and a check before each record
compare-and-set and each NATS publish). On becoming leader it
reconciles (:mod:`~services.binder.reconcile`),
republishes every pending pod and node's facts, and starts:

- pod and node workers (:mod:`~services.binder.sync`): ``PodPending``, ``PodDeleted``,
  ``NodeFacts``, and invalid pods explained; the namespaces' labels for the placer's extender
  (:mod:`~services.binder.namespaces`);
- the binds of placed pods (:mod:`~services.binder.binding`);
- the durable consumer ``binder-rejections`` (through
  :func:`~shared.runtime.consumer.consume`), the marking of allocated pods, the Event writer and
  the bound-but-not-allocated watch (:mod:`~services.binder.reporting`).

The pure rules (no I/O) are :mod:`~services.binder.rules.plan`,
:mod:`~services.binder.rules.describe`,
:mod:`~services.binder.rules.nodefacts` and :mod:`~services.binder.rules.restoreplan`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Mapping
from typing import Final, Protocol

from services.binder.binding import PlacementBinder
from services.binder.claims import ClaimMirror
from services.binder.config import BinderConfig, default_identity
from services.binder.draclaims import ClaimApi, DraClaims
from services.binder.draindex import ClaimClassIndex
from services.binder.draslicing import SliceFollower
from services.binder.events import EventRecorder
from services.binder.extender import is_extender_pod
from services.binder.fenced import FencedGateway
from services.binder.gateway import ApiUnavailableError, ClusterGateway, NotLeaderError
from services.binder.informer import Informer
from services.binder.kube import KubeGateway
from services.binder.kubedra import KubeDra
from services.binder.leader import LeaderElector
from services.binder.lookups import PodLookups
from services.binder.metrics import BinderMetrics
from services.binder.reconcile import reconcile
from services.binder.reporting import Reporter
from services.binder.restorer import StoreRestorer
from services.binder.rules.draforeign import ForeignClaims
from services.binder.rules.objects import Node
from services.binder.slicing import SliceApi, SlicePublisher
from services.binder.sync import ClusterSync
from shared import subjects
from shared.clock import Clock
from shared.dra.claims import claim_of_container
from shared.dra.devices import MemoryPolicy
from shared.kubeobjects import Pod
from shared.messages.assignments import RecordView
from shared.messages.nodes import NodeFacts
from shared.messages.placement import PlacementRejected
from shared.messages.pods import PodPending
from shared.podspec import InvalidPod
from shared.runtime.bus import Bus
from shared.runtime.consumer import EXPECTED, consume
from shared.runtime.edge import Edge
from shared.runtime.health import Readiness
from shared.runtime.lifecycle import ServiceContext
from shared.runtime.records import RecordMirror
from shared.runtime.tasks import finish

log = logging.getLogger(__name__)

STOP_STEP_S: Final = 3.0


class DraApi(SliceApi, ClaimApi, Protocol):
    """The ``resource.k8s.io/v1`` calls of DRA mode (``kubedra.KubeDra``)."""


def _as_parsed(_: Pod, parsed: PodPending | InvalidPod) -> PodPending | InvalidPod:
    return parsed  # no DRA: a pod's claims are not read


def _as_made(facts: NodeFacts) -> NodeFacts:
    return facts  # no DRA: no claim holds a GPU


class _LostLeadershipError(Exception):
    """Raised inside the leader's task group to stop every leader-only task."""


class Binder:
    """The binder's parts, and its life as standby and leader (see the module docstring)."""

    def __init__(
        self,
        *,
        config: BinderConfig,
        gateway: ClusterGateway,
        bus: Bus,
        edge: Edge,
        clock: Clock,
        metrics: BinderMetrics,
        readiness: Readiness,
        dra: DraApi | None = None,
    ) -> None:
        self.config = config
        self.identity = config.identity or default_identity()
        self._bus = bus
        self._edge = edge
        self._clock = clock
        self.records = RecordMirror(bus=bus, edge=edge, clock=clock, on_taken=self._record_taken)
        self.claims = ClaimMirror(
            bus=bus, edge=edge, clock=clock, on_placed=lambda uid: self.placements.want(uid)
        )
        self.elector = (
            LeaderElector(
                gateway=gateway,
                clock=clock,
                namespace=config.lease_namespace,
                name=config.lease_name,
                identity=self.identity,
                lease_duration_s=config.lease_duration_s,
                renew_deadline_s=config.renew_deadline_s,
                retry_period_s=config.retry_period_s,
                on_change=lambda leading: metrics.leader.set(1 if leading else 0),
            )
            if config.leader_elect
            else None
        )
        self.writer = FencedGateway(gateway, self.is_leader)
        self.recorder = EventRecorder(
            gateway=self.writer, clock=clock, metrics=metrics, instance=self.identity
        )
        self.reporter = Reporter(
            config=config,
            gateway=gateway,
            writer=self.writer,
            recorder=self.recorder,
            records=self.records,
            bus=bus,
            clock=clock,
            metrics=metrics,
            pod_of=self.pod_of,
            fence=self._fence,
        )
        self.claim_classes = (
            ClaimClassIndex(
                bus=bus,
                gateway=gateway,
                clock=clock,
                metrics=metrics,
                fence=self._fence,
                claims_synced=lambda: self.dra is not None and self.dra.informer.synced,
            )
            if dra is not None
            else None
        )
        self.foreign = (
            ForeignClaims(
                placed=self._placed_claim,
                want_node=lambda node: self.sync.node_queue.add(node),
            )
            if dra is not None
            else None
        )
        self.dra = (
            DraClaims(
                gateway=gateway,
                api=dra,
                clock=clock,
                metrics=metrics,
                pod_of=self.pod_of,
                want_pod=lambda uid: self.sync.pod_queue.add(uid),
                fence=self._fence,
                listeners=(self.claim_classes.claim_changed, self.foreign.claim_changed)
                if self.claim_classes and self.foreign
                else (),
            )
            if dra is not None
            else None
        )
        self.sync = ClusterSync(
            config=config,
            gateway=gateway,
            bus=bus,
            clock=clock,
            metrics=metrics,
            reporter=self.reporter,
            records=self.records,
            fence=self._fence,
            with_claims=self.dra.pending if self.dra is not None else _as_parsed,
            with_node_claims=self.foreign.facts_with if self.foreign is not None else _as_made,
        )
        self.pods: Informer[Pod] = self.sync.pods
        self.nodes: Informer[Node] = self.sync.nodes
        self.restorer = StoreRestorer(
            bus=bus,
            clock=clock,
            identity=self.identity,
            metrics=metrics,
            recorder=self.recorder,
            bound_pods=self.sync.bound_pods,
            republish=self.sync.resync,
        )
        self.placements = PlacementBinder(
            bus=bus,
            reader=gateway,
            writer=self.writer,
            records=self.records,
            claims=self.claims,
            recorder=self.recorder,
            clock=clock,
            metrics=metrics,
            gate_timeout_s=config.gate_timeout_s,
            max_in_flight=config.max_in_flight,
            pod_of=self.pod_of,
            node_of=self.nodes.get,
            is_extender_pod=lambda pod: is_extender_pod(pod, config.extender_scheduler_names),
            fence=self._fence,
            is_leader=self.is_leader,
            restored=self.restorer.restored,
            dra=self.dra,
        )
        self.slices = (
            SliceFollower(
                bus=bus,
                clock=clock,
                publisher=SlicePublisher(api=dra, policy=MemoryPolicy()),
                node_of=self.nodes.get,
            )
            if dra is not None
            else None
        )
        self.lookups = PodLookups(
            config=config,
            gateway=gateway,
            pods=self.pods,
            namespaces=self._namespaces,
            bus=bus,
            edge=edge,
            clock=clock,
        )
        readiness.probe("kubernetes", self._synced)
        readiness.probe("leadership", self._leadership_report)
        if self.elector is None:
            metrics.leader.set(1)

    # --- state ---------------------------------------------------------------------------------

    def is_leader(self) -> bool:
        return self.elector is None or self.elector.is_leader()

    def _fence(self, what: str) -> None:
        if not self.is_leader():
            raise NotLeaderError(what)

    def _record_taken(self, view: RecordView) -> None:
        """A record version the mirror took: the leader binds and marks what it calls for."""
        if self.is_leader():
            self.placements.on_record(view)
            self.reporter.allocated(view)
        if self.foreign is not None and view.record.state == "released":
            self.foreign.record_released(view.record.node)

    def _synced(self) -> tuple[bool, str]:
        waiting = [
            what
            for what, done in (
                ("pods", self.pods.synced),
                ("nodes", self.nodes.synced),
                ("namespaces", self.sync.namespaces.synced),
                ("claims", self.claims.loaded),
                ("resource claims", self.dra is None or self.dra.informer.synced),
                (
                    "resource claim templates",
                    self.claim_classes is None or self.claim_classes.templates.synced,
                ),
                ("assignment records", self.records.loaded),
            )
            if not done
        ]
        if waiting:
            return False, f"loading {', '.join(waiting)}"
        return True, ""

    def _namespaces(self) -> Mapping[str, Mapping[str, str]] | None:
        """Every namespace's labels, once the namespace informer has listed them (None
        before)."""
        return self.sync.namespace_labels if self.sync.namespaces.synced else None

    def _leadership_report(self) -> tuple[bool, str]:
        if self.is_leader():
            return True, "leader"
        holder = self.elector.holder if self.elector is not None else ""
        return True, f"standby (leader: {holder or 'none yet'})"

    def pod_of(self, uid: str) -> Pod | None:
        return self.sync.pod_of(uid)

    def _placed_claim(self, node: str, uid: str, claim: str) -> bool:
        """Whether pod ``uid``'s live assignment record on ``node`` holds claim ``claim``
        (``namespace/name``): its booking counts the claim's GPUs already."""
        view = self.records.get(subjects.assignment_key(node, uid))
        if view is None or view.record.state == "released":
            return False
        record = view.record
        return any(
            (held := claim_of_container(c.container)) is not None
            and f"{record.namespace}/{held[0]}" == claim
            for c in record.containers
        )

    # --- run ---------------------------------------------------------------------------------

    async def run(self) -> None:
        """Watch, elect, and lead when elected, until cancelled."""
        log.info(
            "binder starting",
            extra={
                "identity": self.identity,
                "scheduler_name": self.config.scheduler_name,
                "extender_scheduler_names": list(self.config.extender_scheduler_names),
                "leader_elect": self.config.leader_elect,
                "lease": f"{self.config.lease_namespace}/{self.config.lease_name}",
            },
        )
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self.pods.run(), name="pod-informer")
                group.create_task(self.nodes.run(), name="node-informer")
                group.create_task(self.sync.namespaces.run(), name="namespace-informer")
                group.create_task(self.records.run(), name="records")
                group.create_task(self.claims.run(), name="claims")
                if self.dra is not None:
                    group.create_task(self.dra.informer.run(), name="resourceclaim-informer")
                if self.claim_classes is not None:
                    group.create_task(
                        self.claim_classes.templates.run(), name="resourceclaimtemplate-informer"
                    )
                group.create_task(self.lookups.answer(), name="extender-lookups")
                if self.elector is not None:
                    group.create_task(self.elector.run(), name="leader-election")
                group.create_task(self._serve(), name="serve")
        finally:
            self.sync.stop()
            await finish(self._stop())

    async def _stop(self) -> None:
        """Write the Events still queued, then give the Lease up for a standby to take (each
        bounded: an unreachable API server must not hold up the shutdown)."""
        if self.is_leader():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(STOP_STEP_S):
                    await self.recorder.flush()
        if self.elector is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(STOP_STEP_S):
                    await self.elector.release()

    async def _serve(self) -> None:
        while not self._synced()[0]:
            await self._clock.sleep(0.05)
        log.info(
            "caches synced",
            extra={
                "pods": len(self.pods.cache),
                "nodes": len(self.nodes.cache),
                "records": len(self.records.views()),
            },
        )
        while True:
            while not self.is_leader():
                await self._clock.sleep(0.05)
            try:
                async with asyncio.TaskGroup() as group:
                    group.create_task(self._lead(), name="lead")
                    group.create_task(self._until_not_leader(), name="leadership")
            except* _LostLeadershipError:
                log.warning("no longer the leader: stopped every write; standing by")

    async def _until_not_leader(self) -> None:
        step = min(0.25, self.config.retry_period_s / 4)
        while self.is_leader():
            await self._clock.sleep(step)
        raise _LostLeadershipError

    async def _lead(self) -> None:
        log.info("leading: reconciling and binding", extra={"identity": self.identity})
        self.sync.resync()
        await self.sync.relist_published_nodes()
        consume_ = functools.partial(
            consume,
            bus=self._bus,
            edge=self._edge,
            clock=self._clock,
            max_in_flight=self.config.max_in_flight,
            expected=(ApiUnavailableError, *EXPECTED),
        )
        self.placements.reconcile()
        self.reporter.reconcile()
        reconcile(records=self.records, pod_of=self.pod_of, end_pod=self.sync.end_later)
        async with asyncio.TaskGroup() as group:
            for i in range(self.config.workers):
                group.create_task(self.sync.work_pods(), name=f"pods-{i}")
                group.create_task(self.sync.work_nodes(), name=f"nodes-{i}")
            group.create_task(self.sync.namespace_publisher.run(), name="namespaces")
            group.create_task(self.placements.run(), name="binds")
            if self.slices is not None:
                group.create_task(self.slices.run(), name="resourceslices")
            if self.claim_classes is not None:
                self.claim_classes.resync()
                group.create_task(self.claim_classes.run(), name="claim-classes")
            group.create_task(
                consume_(
                    durable=subjects.DURABLE_BINDER_REJECTIONS,
                    stream=subjects.STREAM_PLACEMENTS,
                    subject=subjects.PLACEMENTS_REJECTED,
                    message_type=PlacementRejected,
                    family="placements",
                    handler=self.reporter.handle_rejection,
                ),
                name="rejections",
            )
            group.create_task(self.reporter.mark_allocated(), name="allocated")
            group.create_task(self.recorder.run(), name="events")
            group.create_task(self.restorer.run(), name="store-restore")
            group.create_task(self.reporter.watch_allocation_delays(), name="allocation-delays")


async def run_binder(
    context: ServiceContext,
    *,
    config: BinderConfig,
    connect: Callable[[BinderMetrics], ClusterGateway],
) -> None:
    """The service body: build the binder around the context's bus and run it."""
    metrics = BinderMetrics.create(context.registry)
    gateway = connect(metrics)
    dra = KubeDra(gateway) if config.dra and isinstance(gateway, KubeGateway) else None
    binder = Binder(
        dra=dra,
        config=config,
        gateway=gateway,
        bus=context.bus,
        edge=context.edge,
        clock=context.clock,
        metrics=metrics,
        readiness=context.readiness,
    )
    try:
        await binder.run()
    finally:
        await finish(gateway.close())
