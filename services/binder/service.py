"""The binder's shell: Kubernetes in, NATS out; decisions in, Bindings out; Pending explained.

Always running (leader or standby), so a standby is warm when it takes over:

- a pod informer over every non-terminated pod (``status.phase!=Succeeded,status.phase!=Failed``,
  the selector kube-scheduler uses): Tessera's pods (``spec.schedulerName``, or extender-mode pods:
  :mod:`~services.binder.extender`) and the CPU and memory every pod requests on its node;
- a node informer; a mirror of the assignment records (KV watch);
- leader election on a Lease (``--leader-elect``);
- answers to the placer's extender asking for the pod kube-scheduler binds
  (``tessera.extender.pods``, a queue group of every binder: read-only, so standbys answer too).

Only the leader writes (to Kubernetes and to NATS), every write fenced by the Lease
(:class:`~services.binder.fenced.FencedGateway`, and a check before each record
compare-and-set and each NATS publish). On becoming leader it
reconciles (records whose pod is gone -> ``PodDeleted``; a ``reserved`` record whose pod is
already bound there -> ``bound``; a ``bound`` record whose pod is not bound yet -> bound now),
republishes every pending pod and node's facts, and starts:

- pod and node workers: informer changes mark a pod uid or node name dirty; a worker publishes
  ``PodPending`` (when what the placer reads changed; never for extender-mode pods, whose node
  kube-scheduler picks), ``PodDeleted`` (pod gone or finished), or explains an invalid pod
  (``PodScheduled=False`` + Warning Event, nothing published), and ``NodeFacts`` on change
  (subject + KV);
- the durable consumers ``binder-decisions`` (:mod:`~services.binder.binding`),
  ``binder-rejections`` (``PodScheduled=False`` + aggregated Warning Event) and
  ``binder-allocations`` (``tessera.dev/assigned: "true"``), each through
  :func:`~shared.runtime.consumer.consume`;
- the Event writer and the bound-but-not-allocated watch.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import itertools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final, TypeVar

import msgspec

from services.binder import explain
from services.binder.binding import DecisionBinder
from services.binder.config import BinderConfig, default_identity
from services.binder.events import EventRecorder
from services.binder.extender import is_extender_pod, is_ours, lookup_reply
from services.binder.fenced import FencedGateway
from services.binder.gateway import ApiUnavailableError, ClusterGateway, NotLeaderError
from services.binder.informer import Informer
from services.binder.leader import LeaderElector
from services.binder.metrics import BinderMetrics
from services.binder.nodefacts import Requested, gone_facts, node_facts, pod_requested, same_facts
from services.binder.objects import Node
from services.binder.plan import decision_of
from services.binder.restoring import StoreRestorer
from services.binder.workqueue import WorkQueue
from shared import annotations as names
from shared import codec, subjects
from shared.clock import Clock
from shared.kubeobjects import Pod
from shared.messages.allocations import AllocationEvent
from shared.messages.assignments import holds_gpus
from shared.messages.extender import PodLookup, PodLookupReply
from shared.messages.nodes import NodeFacts
from shared.messages.placement import PlacementDecision, PlacementRejected, PodInvalid
from shared.messages.pods import PodDeleted, PodPending
from shared.podspec import InvalidPod, parse_pending
from shared.runtime.bus import Bus, Delivery
from shared.runtime.consumer import EXPECTED, RETRY_S, AlreadyHandlingError, consume, retry_delay
from shared.runtime.edge import Edge
from shared.runtime.health import Readiness
from shared.runtime.lifecycle import ServiceContext
from shared.runtime.records import RecordMirror
from shared.runtime.tasks import checkpoint, finish

log = logging.getLogger(__name__)

NON_TERMINATED: Final = "status.phase!=Succeeded,status.phase!=Failed"
LOOKUP_QUEUE: Final = "tessera-binder"
STOP_STEP_S: Final = 3.0
T = TypeVar("T")


class _LostLeadershipError(Exception):
    """Raised inside the leader's task group to stop every leader-only task."""


@dataclass(frozen=True)
class _PodRef:
    namespace: str
    name: str
    node: str | None


class Binder:
    """The binder's state and behaviour (see the module docstring)."""

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
    ) -> None:
        self.config = config
        self.identity = config.identity or default_identity()
        self._gateway = gateway
        self._bus = bus
        self._edge = edge
        self._clock = clock
        self._metrics = metrics
        self.pods: Informer[Pod] = Informer(
            name="pods",
            kind=Pod,
            gateway=gateway,
            on_change=self._pod_changed,
            clock=clock,
            metrics=metrics,
            field_selector=NON_TERMINATED,
        )
        self.nodes: Informer[Node] = Informer(
            name="nodes",
            kind=Node,
            gateway=gateway,
            on_change=self._node_changed,
            clock=clock,
            metrics=metrics,
        )
        self.records = RecordMirror(bus=bus, edge=edge, clock=clock)
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
        # Tessera's pods: uid -> informer key; those that left, until PodDeleted is out.
        self._ours: dict[str, str] = {}
        self._gone: dict[str, _PodRef] = {}
        self._published_pending: dict[str, PodPending] = {}
        self._explained: dict[str, str] = {}
        self._invalid_published: dict[str, str] = {}
        """Pod uid -> the reason last published on ``tessera.placements.invalid``."""
        """The PodScheduled=False message last written per pending pod (the informer may lag)."""
        # CPU and memory requested per node, and each bound pod's share of it.
        self._requested: dict[str, Requested] = {}
        self._contribution: dict[str, tuple[str, Requested]] = {}
        self._published_facts: dict[str, NodeFacts] = {}
        self.pod_queue: WorkQueue[str] = WorkQueue()
        self.node_queue: WorkQueue[str] = WorkQueue()
        self.decisions = DecisionBinder(
            bus=bus,
            reader=gateway,
            writer=self.writer,
            records=self.records,
            recorder=self.recorder,
            clock=clock,
            metrics=metrics,
            gate_timeout_s=config.gate_timeout_s,
            pod_of=self.pod_of,
            node_of=self.nodes.get,
            fence=self._fence,
        )
        self.restorer = StoreRestorer(
            bus=bus,
            clock=clock,
            identity=self.identity,
            metrics=metrics,
            bound_pods=self._bound_pods,
            republish=self._resync,
        )
        self._warned: set[str] = set()
        self._background: set[asyncio.Task[None]] = set()
        readiness.probe("kubernetes", self._synced)
        readiness.probe("leadership", self._leadership_report)
        if self.elector is None:
            metrics.leader.set(1)

    # --- state ---------------------------------------------------------------------------------

    def is_leader(self) -> bool:
        return self.elector is None or self.elector.is_leader()

    def _synced(self) -> tuple[bool, str]:
        waiting = [
            what
            for what, done in (
                ("pods", self.pods.synced),
                ("nodes", self.nodes.synced),
                ("assignment records", self.records.loaded),
            )
            if not done
        ]
        if waiting:
            return False, f"loading {', '.join(waiting)}"
        return True, ""

    def _leadership_report(self) -> tuple[bool, str]:
        if self.is_leader():
            return True, "leader"
        holder = self.elector.holder if self.elector is not None else ""
        return True, f"standby (leader: {holder or 'none yet'})"

    def pod_of(self, uid: str) -> Pod | None:
        key = self._ours.get(uid)
        return self.pods.get(key) if key is not None else None

    def _bound_pods(self) -> list[Pod]:
        """Tessera's pods bound to a node (what a store that lost its records restores)."""
        bound = (self.pod_of(uid) for uid in list(self._ours))
        return [pod for pod in bound if pod is not None and pod.node]

    def requested_on(self, node: str) -> Requested:
        return self._requested.get(node, Requested())

    def is_ours(self, pod: Pod) -> bool:
        return is_ours(
            pod,
            scheduler_name=self.config.scheduler_name,
            extender_scheduler_names=self.config.extender_scheduler_names,
        )

    # --- informer handlers (synchronous, quick) --------------------------------------------------

    def _pod_changed(self, old: Pod | None, new: Pod | None) -> None:
        pod = new or old
        assert pod is not None
        key = pod.metadata.key
        before = self._contribution.pop(key, None)
        after = (
            (new.node, pod_requested(new, ours=self.is_ours(new)))
            if new is not None and new.node
            else None
        )
        if before != after:
            if before is not None:
                self._requested[before[0]] = self.requested_on(before[0]) - before[1]
                self.node_queue.add(before[0])
            if after is not None:
                self._requested[after[0]] = self.requested_on(after[0]) + after[1]
                self.node_queue.add(after[0])
        if after is not None:
            self._contribution[key] = after
        if not self.is_ours(pod):
            return
        uid = pod.metadata.uid
        if new is None:
            self._ours.pop(uid, None)
            self._gone[uid] = _PodRef(pod.metadata.namespace, pod.metadata.name, pod.node or None)
        else:
            self._ours[uid] = key
        self.pod_queue.add(uid)

    def _node_changed(self, old: Node | None, new: Node | None) -> None:
        node = new or old
        assert node is not None
        self.node_queue.add(node.metadata.name)

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
                group.create_task(self.records.run(), name="records")
                group.create_task(self._answer_lookups(), name="extender-lookups")
                if self.elector is not None:
                    group.create_task(self.elector.run(), name="leader-election")
                group.create_task(self._serve(), name="serve")
        finally:
            for task in self._background:
                task.cancel()
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
        self._resync()
        try:
            for key in await self._bus.kv_keys(subjects.KV_NODES):
                self.node_queue.add(subjects.node_from_token(key))  # facts of nodes gone meanwhile
        except Exception as error:  # NATS away: the node watch will publish as nodes change
            log.warning("cannot list published node facts", extra={"error": repr(error)})
        async with asyncio.TaskGroup() as group:
            group.create_task(self._reconcile(), name="reconcile")
            for i in range(self.config.workers):
                group.create_task(self._work(self.pod_queue, self._sync_pod), name=f"pods-{i}")
                group.create_task(self._work(self.node_queue, self._sync_node), name=f"nodes-{i}")
            group.create_task(
                self._consume(
                    durable=subjects.DURABLE_BINDER_DECISIONS,
                    stream=subjects.STREAM_PLACEMENTS,
                    subject=subjects.ASSIGNMENTS_ALL,
                    message_type=PlacementDecision,
                    family="assignments",
                    handler=self.decisions.handle,
                ),
                name="decisions",
            )
            group.create_task(
                self._consume(
                    durable=subjects.DURABLE_BINDER_REJECTIONS,
                    stream=subjects.STREAM_PLACEMENTS,
                    subject=subjects.PLACEMENTS_REJECTED,
                    message_type=PlacementRejected,
                    family="placements",
                    handler=self.handle_rejection,
                ),
                name="rejections",
            )
            group.create_task(
                self._consume(
                    durable=subjects.DURABLE_BINDER_ALLOCATIONS,
                    stream=subjects.STREAM_ALLOCATIONS,
                    subject=subjects.ALLOCATIONS_ALL,
                    message_type=AllocationEvent,
                    family="allocations",
                    handler=self.handle_allocation,
                ),
                name="allocations",
            )
            group.create_task(self.recorder.run(), name="events")
            group.create_task(self.restorer.run(), name="store-restore")
            group.create_task(self._watch_allocation_delays(), name="allocation-delays")

    def _resync(self) -> None:
        """Publish everything again (the previous leader's last messages may be missing)."""
        self._published_pending.clear()
        self._explained.clear()
        self._published_facts.clear()
        for uid in [*self._ours, *self._gone]:
            self.pod_queue.add(uid)
        for name in [*self.nodes.cache, *self._requested]:
            self.node_queue.add(name)

    # --- workers ---------------------------------------------------------------------------------

    async def _work(self, queue: WorkQueue[str], sync: Callable[[str], Awaitable[None]]) -> None:
        while True:
            item = await queue.get()
            try:
                checkpoint()
                await sync(item)
            except Exception as error:  # the API or NATS away: try the item again shortly
                log.warning("will retry", extra={"item": item, "error": repr(error)})
                self._later(RETRY_S, queue.add, item)
            finally:
                queue.done(item)

    def _later(self, delay: float, action: Callable[[str], None], item: str) -> None:
        async def run() -> None:
            await self._clock.sleep(delay)
            action(item)

        task = asyncio.create_task(run())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _sync_pod(self, uid: str) -> None:
        pod = self.pod_of(uid)
        if pod is None or (pod.terminating and not pod.node):
            ref = self._gone.get(uid) or (
                _PodRef(pod.metadata.namespace, pod.metadata.name, None) if pod else None
            )
            if ref is not None:
                await self._publish_deleted(uid, ref)
            self._gone.pop(uid, None)
            self._published_pending.pop(uid, None)
            self._explained.pop(uid, None)
            self._invalid_published.pop(uid, None)
            return
        if pod.node or is_extender_pod(pod, self.config.extender_scheduler_names):
            # Bound, or kube-scheduler's to place (it explains such a pod itself).
            self._published_pending.pop(uid, None)
            self._explained.pop(uid, None)
            self._invalid_published.pop(uid, None)
            return
        parsed = parse_pending(pod)
        if isinstance(parsed, InvalidPod):
            if self._published_pending.pop(uid, None) is not None:
                await self._publish_deleted(
                    uid, _PodRef(pod.metadata.namespace, pod.metadata.name, None)
                )
            await self._explain(pod, parsed.reason, cause="invalid")
            await self._publish_invalid(parsed)
            return
        fingerprint = msgspec.structs.replace(parsed, resource_version="")
        if self._published_pending.get(uid) == fingerprint:
            return
        self._fence("publish PodPending")
        await self._bus.js_publish(
            subjects.PODS_PENDING,
            codec.encode(parsed),
            msg_id=f"pending.{uid}.{parsed.resource_version}",
        )
        self._published_pending[uid] = fingerprint
        self._metrics.pods_published.labels(kind="pending").inc()

    async def _publish_deleted(self, uid: str, ref: _PodRef) -> None:
        self._fence("publish PodDeleted")
        message = PodDeleted(
            uid=uid,
            namespace=ref.namespace,
            name=ref.name,
            node=ref.node,
            deleted_at=self._clock.now(),
        )
        await self._bus.js_publish(
            subjects.PODS_DELETED, codec.encode(message), msg_id=f"deleted.{uid}"
        )
        self._metrics.pods_published.labels(kind="deleted").inc()

    async def _sync_node(self, name: str) -> None:
        node = self.nodes.get(name)
        if node is None:
            entry = await self._bus.kv_get(subjects.KV_NODES, subjects.node_token(name))
            known = self._published_facts.pop(name, None)
            if entry is None and known is None:
                return
            if entry is not None and known is None:
                with contextlib.suppress(codec.DecodeError):
                    if codec.decode(entry.value, NodeFacts).deleted:
                        return
            await self._publish_facts(gone_facts(name, now=self._clock.now()))
            return
        facts = node_facts(node, self.requested_on(name), now=self._clock.now())
        if same_facts(self._published_facts.get(name), facts):
            return
        await self._publish_facts(facts)
        self._published_facts[name] = facts

    async def _publish_facts(self, facts: NodeFacts) -> None:
        self._fence("publish NodeFacts")
        data = codec.encode(facts)
        await self._bus.kv_put(subjects.KV_NODES, subjects.node_token(facts.node), data)
        await self._bus.publish(subjects.nodes(facts.node), data)
        self._metrics.node_facts.inc()

    def _fence(self, what: str) -> None:
        if not self.is_leader():
            raise NotLeaderError(what)

    async def _consume(
        self,
        *,
        durable: str,
        stream: str,
        subject: str,
        message_type: type[T],
        family: str,
        handler: Callable[[T], Awaitable[None]],
    ) -> None:
        await consume(
            bus=self._bus,
            edge=self._edge,
            clock=self._clock,
            max_in_flight=self.config.max_in_flight,
            durable=durable,
            stream=stream,
            subject=subject,
            message_type=message_type,
            family=family,
            handler=handler,
            expected=(ApiUnavailableError, *EXPECTED),
        )

    # --- rejections and allocations ------------------------------------------------------------

    async def _publish_invalid(self, invalid: InvalidPod) -> None:
        """Say on ``tessera.placements.invalid`` that the pod cannot be placed as written (the
        dashboard counts it Pending); once per message, de-duplicated across leaders."""
        if self._invalid_published.get(invalid.uid) == invalid.reason:
            return
        self._fence("publish PodInvalid")
        message = PodInvalid(
            pod_uid=invalid.uid,
            namespace=invalid.namespace,
            name=invalid.name,
            message=invalid.reason,
            fields=tuple(error.field for error in invalid.errors),
            at=self._clock.now(),
        )
        await self._bus.js_publish(
            subjects.PLACEMENTS_INVALID,
            codec.encode(message),
            msg_id=f"invalid.{invalid.uid}.{hashlib.sha256(invalid.reason.encode()).hexdigest()[:16]}",
        )
        self._invalid_published[invalid.uid] = invalid.reason

    async def _explain(self, pod: Pod, message: str, *, cause: str) -> None:
        """``PodScheduled=False`` with ``message`` (unless the pod says so already) and a Warning
        Event. A placer rejection is an occurrence each time (repeats count into the Event's
        series); an invalid request is one occurrence until the message changes."""
        meta = pod.metadata
        said = self._explained.get(meta.uid) == message
        if said and cause == "invalid":
            return
        if not said and explain.reports_unschedulable(pod, message):
            self._explained[meta.uid] = message  # written before (a previous leader)
        elif not said:
            if cause == "invalid":
                self._metrics.invalid_pods.inc()
            self._explained[meta.uid] = message  # before the write: repeats meanwhile skip it
            try:
                answer = await self.writer.patch_pod_status(
                    meta.namespace,
                    meta.name,
                    explain.unschedulable_patch(
                        uid=meta.uid, message=message, now=_seconds(self._clock.now())
                    ),
                )
            except BaseException:
                self._explained.pop(meta.uid, None)
                raise
            if not answer.ok:
                self._explained.pop(meta.uid, None)
                log.info(
                    "pending pod not explained",
                    extra={"pod": meta.key, "code": answer.code, "message": answer.message},
                )
                return
            self._metrics.explained.labels(cause=cause).inc()
        self.recorder.emit(
            regarding=explain.regarding_pod(namespace=meta.namespace, name=meta.name, uid=meta.uid),
            event_type="Warning",
            reason="FailedScheduling",
            action="Scheduling",
            note=message,
        )

    async def handle_rejection(self, rejected: PlacementRejected) -> None:
        """Explain on the pod why it is Pending."""
        pod = self.pod_of(rejected.pod_uid)
        if pod is None or pod.node:
            return  # gone, or placed since
        await self._explain(pod, explain.unschedulable_message(rejected), cause="rejected")

    async def handle_allocation(self, event: AllocationEvent) -> None:
        """Mark a pod whose GPUs the device plugin has allocated."""
        if not event.complete:
            return
        pod = self.pod_of(event.pod_uid)
        if pod is None:
            pod = await self._gateway.read_pod(event.namespace, event.name)
            if pod is None or pod.metadata.uid != event.pod_uid:
                return
        if (pod.metadata.annotations or {}).get(names.ASSIGNED) == "true":
            return
        answer = await self.writer.patch_pod(
            event.namespace, event.name, explain.assigned_patch(uid=event.pod_uid)
        )
        if not answer.ok:  # gone or replaced meanwhile (404, 422): nothing left to mark
            log.info(
                "allocated pod not marked",
                extra={
                    "pod": f"{event.namespace}/{event.name}",
                    "code": answer.code,
                    "message": answer.message,
                },
            )

    async def _watch_allocation_delays(self) -> None:
        period = max(0.2, min(5.0, self.config.allocation_warning_s / 4))
        while True:
            await self._clock.sleep(period)
            now = self._clock.now()
            live = set()
            for view in self.records.views():
                record = view.record
                live.add(view.key)
                if (
                    record.state != "bound"
                    or record.bound_at is None
                    or view.key in self._warned
                    or not holds_gpus(record)  # nothing to allocate: no device plugin comes
                ):
                    continue
                waited = now - record.bound_at
                if waited < self.config.allocation_warning_s:
                    continue
                self._warned.add(view.key)
                if self.pod_of(record.pod_uid) is None:
                    continue
                log.warning(
                    "bound but not allocated",
                    extra={
                        "pod": f"{record.namespace}/{record.name}",
                        "node": record.node,
                        "waited_s": round(waited),
                    },
                )
                self.recorder.emit(
                    regarding=explain.regarding_pod(
                        namespace=record.namespace, name=record.name, uid=record.pod_uid
                    ),
                    event_type="Warning",
                    reason="AllocationDelayed",
                    action="Allocating",
                    note=explain.allocation_delayed_note(record, waited),
                )
            self._warned &= live

    # --- the extender's pod lookups ------------------------------------------------------------

    async def _answer_lookups(self) -> None:
        """Answer the placer's extender until cancelled (any binder, leader or standby)."""
        while True:
            try:
                subscription = await self._bus.subscribe(
                    subjects.EXTENDER_PODS, self._on_lookup, queue=LOOKUP_QUEUE
                )
                break
            except Exception as error:  # NATS away: try again shortly
                log.warning("cannot answer pod lookups yet", extra={"error": repr(error)})
                await self._clock.sleep(RETRY_S)
        try:
            await asyncio.Event().wait()
        finally:
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()

    async def _on_lookup(self, delivery: Delivery) -> None:
        lookup = await self._edge.accept(delivery, PodLookup, family="extender")
        if lookup is None or not delivery.reply:
            return
        try:
            reply = lookup_reply(
                lookup,
                await self._find_pod(lookup),
                scheduler_name=self.config.scheduler_name,
                extender_scheduler_names=self.config.extender_scheduler_names,
            )
        except Exception as error:  # the API away: the extender answers kube-scheduler with it
            reply = PodLookupReply(uid=lookup.uid, error=f"cannot read the pod: {error}")
        with contextlib.suppress(Exception):  # the extender times out and says so
            await self._bus.publish(delivery.reply, codec.encode(reply))

    async def _find_pod(self, lookup: PodLookup) -> Pod | None:
        """The pod from the informer, else from the API server (the informer may lag behind
        kube-scheduler, which saw the pod first)."""
        pod = self.pods.get(f"{lookup.namespace}/{lookup.name}")
        if pod is not None and pod.metadata.uid == lookup.uid:
            return pod
        return await self._gateway.read_pod(lookup.namespace, lookup.name)

    # --- reconcile ---------------------------------------------------------------------------

    async def _reconcile(self) -> None:
        """Finish what a previous leader left half done (module docstring). Runs beside the
        consumers; a step that fails (API or NATS away) is tried again until it succeeds."""
        work: list[Callable[[], Awaitable[None]]] = []
        for view in self.records.views():
            record = view.record
            pod = self.pod_of(record.pod_uid)
            if pod is None:
                ref = _PodRef(record.namespace, record.name, record.node)
                work.append(functools.partial(self._publish_deleted, record.pod_uid, ref))
            elif (record.state == "reserved" and pod.node) or (
                record.state == "bound" and not pod.node
            ):
                work.append(functools.partial(self.decisions.handle, decision_of(record)))
        if not work:
            return
        log.info("reconciling assignment records", extra={"actions": len(work)})
        limit = asyncio.Semaphore(32)

        async def until_done(step: Callable[[], Awaitable[None]]) -> None:
            for attempt in itertools.count(1):
                async with limit:
                    try:
                        await step()
                        return
                    except AlreadyHandlingError:
                        return  # its decision message is being handled right now
                    except Exception as error:
                        log.warning(
                            "reconcile step failed; will retry",
                            extra={"error": repr(error), "attempt": attempt},
                        )
                await self._clock.sleep(retry_delay(attempt))
                checkpoint()

        await asyncio.gather(*(until_done(step) for step in work))


def _seconds(at: float) -> str:
    return names.time_value(at)[:19] + "Z"


async def run_binder(
    context: ServiceContext,
    *,
    config: BinderConfig,
    connect: Callable[[BinderMetrics], ClusterGateway],
) -> None:
    """The service body: build the binder around the context's bus and run it."""
    metrics = BinderMetrics.create(context.registry)
    gateway = connect(metrics)
    binder = Binder(
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
