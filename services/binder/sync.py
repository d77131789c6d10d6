"""Kubernetes in, NATS out: the pod and node informers, and what the leader publishes of them.

The pod informer watches every non-terminated pod (``status.phase!=Succeeded,status.phase!=Failed``,
the selector kube-scheduler uses): Tessera's pods (``spec.schedulerName``, or extender-mode pods:
:mod:`~services.binder.extender`) and the CPU and memory every pod requests on its node. Informer
changes mark a pod uid or node name dirty (:class:`~services.binder.workqueue.WorkQueue`); the
leader's workers then publish ``PodPending`` (when what the placer reads changed; never for
extender-mode pods, whose node kube-scheduler picks), ``PodDeleted`` (pod gone or finished, after
withdrawing its record when it ended before its GPUs were allocated: ``settling.py``), or
have an invalid pod explained (:mod:`~services.binder.reporting`; nothing pending published),
and ``NodeFacts`` on change (subject + KV: ``factspublisher.py``). Every write is fenced by the
Lease (``fence``).

A pod with scheduling gates is not published while any is left (its ``PodScheduled`` says so).
The pods on each node that are not Tessera's go into its facts (``neighbours.py``); the namespace
informer resolves pod-affinity namespace selectors, and a namespace change has the pods whose
terms name one read again, and is published for the placer's extender (``namespaces.py``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

import msgspec

from services.binder.config import BinderConfig
from services.binder.extender import is_extender_pod, is_ours
from services.binder.factspublisher import NodeFactsPublisher
from services.binder.gateway import ClusterGateway
from services.binder.informer import Informer
from services.binder.metrics import BinderMetrics
from services.binder.namespaces import NamespacePublisher
from services.binder.reporting import Reporter
from services.binder.rules.describe import SCHEDULER_ERROR, not_queued_message
from services.binder.rules.neighbours import NodePods, existing_pod
from services.binder.rules.nodefacts import (
    Requested,
    pod_requested,
)
from services.binder.rules.objects import Namespace, Node
from services.binder.settling import BoundRecords
from services.binder.workqueue import WorkQueue
from shared import codec, subjects
from shared.clock import Clock
from shared.kubeobjects import Pod
from shared.messages.nodes import NodeFacts
from shared.messages.pods import PodDeleted, PodPending
from shared.podspec import InvalidPod, parse_pending
from shared.runtime.bus import Bus, BusUnavailableError, OutcomeUnknownError
from shared.runtime.consumer import RETRY_S
from shared.runtime.grouped import GroupedPublisher
from shared.runtime.records import RecordMirror
from shared.runtime.tasks import checkpoint
from shared.scheduling import gated_message, scheduling_gates, uses_namespace_selector

log = logging.getLogger(__name__)

NON_TERMINATED: Final = "status.phase!=Succeeded,status.phase!=Failed"


@dataclass(frozen=True)
class PodRef:
    """Where a pod was: what ``PodDeleted`` names once the pod itself is gone."""

    namespace: str
    name: str
    node: str | None


class ClusterSync:
    """The informers, Tessera's pods among them, CPU and memory requested per node, and the
    workers that publish them."""

    def __init__(
        self,
        *,
        config: BinderConfig,
        gateway: ClusterGateway,
        bus: Bus,
        clock: Clock,
        metrics: BinderMetrics,
        reporter: Reporter,
        records: RecordMirror,
        fence: Callable[[str], None],
        with_claims: Callable[[Pod, PodPending | InvalidPod], PodPending | InvalidPod] = (
            lambda _, parsed: parsed
        ),
        with_node_claims: Callable[[NodeFacts], NodeFacts] = lambda facts: facts,
    ) -> None:
        self._with_claims = with_claims
        """Adds a pod's DRA claims to what is published of it (``draclaims.DraClaims``)."""
        self._config = config
        self._bus = bus
        self._clock = clock
        self._metrics = metrics
        self._reporter = reporter
        self._fence = fence
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
        self.namespaces: Informer[Namespace] = Informer(
            name="namespaces",
            kind=Namespace,
            gateway=gateway,
            on_change=self._namespace_changed,
            clock=clock,
            metrics=metrics,
        )
        self.namespace_labels: dict[str, dict[str, str]] = {}
        self.namespace_publisher = NamespacePublisher(
            bus=bus, clock=clock, labels=self.namespace_labels, fence=fence
        )
        """The leader's writer of the namespaces' labels into KV (the extender's)."""
        self._neighbours = NodePods()
        """The pods on each node that are not Tessera's (its facts carry them)."""
        # Tessera's pods: uid -> informer key; those that left, until PodDeleted is out.
        self._ours: dict[str, str] = {}
        self._gone: dict[str, PodRef] = {}
        self._published_pending: dict[str, PodPending] = {}
        self._pods_out = GroupedPublisher(bus=bus, stream=subjects.STREAM_PODS)
        """``PodPending`` and ``PodDeleted``, in groups: under a burst the workers publish
        together and a group is answered once."""
        # CPU and memory requested per node, and each bound pod's share of it.
        self._requested: dict[str, Requested] = {}
        self._contribution: dict[str, tuple[str, Requested]] = {}
        self.pod_queue: WorkQueue[str] = WorkQueue()
        self.node_queue: WorkQueue[str] = WorkQueue()
        self._background: set[asyncio.Task[None]] = set()
        self._facts = NodeFactsPublisher(
            bus=bus,
            clock=clock,
            metrics=metrics,
            fence=fence,
            refresh_s=config.node_facts_refresh_s,
            nodes=self.nodes,
            requested_on=self.requested_on,
            neighbours=self._neighbours,
            requeue=self.node_queue.add,
            later=self._later,
            with_claims=with_node_claims,
        )
        """The node worker's side: each node's facts, published on change."""
        self._bound = BoundRecords(
            bus=bus,
            clock=clock,
            metrics=metrics,
            records=records,
            fence=fence,
            pod_of=self.pod_of,
            requeue=self.pod_queue.add,
            later=self._later,
        )
        """Withdraws and settles the ``bound`` records of pods that ended or were admitted."""

    # --- state ---------------------------------------------------------------------------------

    def pod_of(self, uid: str) -> Pod | None:
        key = self._ours.get(uid)
        return self.pods.get(key) if key is not None else None

    def bound_pods(self) -> list[Pod]:
        """Tessera's pods bound to a node (what a store that lost its records restores)."""
        bound = (self.pod_of(uid) for uid in list(self._ours))
        return [pod for pod in bound if pod is not None and pod.node]

    def requested_on(self, node: str) -> Requested:
        return self._requested.get(node, Requested())

    def is_ours(self, pod: Pod) -> bool:
        return is_ours(
            pod,
            scheduler_name=self._config.scheduler_name,
            extender_scheduler_names=self._config.extender_scheduler_names,
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
        self._count_neighbour(key, new)
        if not self.is_ours(pod):
            return
        uid = pod.metadata.uid
        if new is None:
            self._ours.pop(uid, None)
            self._gone[uid] = PodRef(pod.metadata.namespace, pod.metadata.name, pod.node or None)
        else:
            self._ours[uid] = key
        self.pod_queue.add(uid)

    def _count_neighbour(self, key: str, pod: Pod | None) -> None:
        """Count ``pod`` (None: gone) on its node's facts when it is bound, running and not
        Tessera's."""
        counted = (
            pod is not None and bool(pod.node) and not pod.terminating and not self.is_ours(pod)
        )
        if pod is not None and counted:
            changed = self._neighbours.put(key, pod.node, existing_pod(pod, self.namespace_labels))
        else:
            changed = self._neighbours.put(key, None, None)
        for node in changed:
            self.node_queue.add(node)

    def _namespace_changed(self, old: Namespace | None, new: Namespace | None) -> None:
        """Read again the pods whose pod-affinity terms name a namespace selector."""
        namespace = new or old
        assert namespace is not None
        name = namespace.metadata.name
        labels = dict(new.metadata.labels or {}) if new is not None else None
        if self.namespace_labels.get(name) == labels:
            return
        if labels is None:
            self.namespace_labels.pop(name, None)
        else:
            self.namespace_labels[name] = labels
        self.namespace_publisher.changed()
        for key, pod in self.pods.cache.items():
            if not uses_namespace_selector(pod):
                continue
            if self.is_ours(pod):
                self.pod_queue.add(pod.metadata.uid)
            else:
                self._count_neighbour(key, pod)

    def _node_changed(self, old: Node | None, new: Node | None) -> None:
        node = new or old
        assert node is not None
        self.node_queue.add(node.metadata.name)

    # --- the leader's workers ------------------------------------------------------------------

    def resync(self) -> None:
        """Publish everything again (the previous leader's last messages may be missing)."""
        self._published_pending.clear()
        self._reporter.reset()
        self._facts.resync()
        self.namespace_publisher.resync()
        for uid in [*self._ours, *self._gone]:
            self.pod_queue.add(uid)
        for name in [*self.nodes.cache, *self._requested]:
            self.node_queue.add(name)

    async def relist_published_nodes(self) -> None:
        await self._facts.relist_published_nodes()

    async def work_pods(self) -> None:
        await self._work(self.pod_queue, self._sync_pod)

    async def work_nodes(self) -> None:
        await self._work(self.node_queue, self._facts.sync)

    def stop(self) -> None:
        for task in self._background:
            task.cancel()

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
                PodRef(pod.metadata.namespace, pod.metadata.name, None) if pod else None
            )
            if ref is not None and not await self._end_pod(uid, ref):
                return  # its record is kept for a waiting pod: ended again later
            self._gone.pop(uid, None)
            self._published_pending.pop(uid, None)
            self._reporter.forget(uid)
            return
        if pod.node or is_extender_pod(pod, self._config.extender_scheduler_names):
            # Bound, or kube-scheduler's to place (it explains such a pod itself).
            self._published_pending.pop(uid, None)
            self._reporter.forget(uid)
            if pod.node:
                await self._bound.settle_served_elsewhere(pod)
            return
        gates, _ = scheduling_gates(pod)
        if gates:  # the API lets gates only be removed: it was never published as pending
            await self._reporter.gated(pod, gated_message(gates))
            return
        parsed = self._with_claims(pod, parse_pending(pod, self.namespace_labels))
        if isinstance(parsed, InvalidPod):
            if self._published_pending.pop(uid, None) is not None:
                await self.publish_deleted(
                    uid, PodRef(pod.metadata.namespace, pod.metadata.name, None)
                )
            await self._reporter.explain(pod, parsed.reason, cause="invalid")
            await self._reporter.publish_invalid(parsed)
            return
        fingerprint = msgspec.structs.replace(parsed, resource_version="")
        if self._published_pending.get(uid) == fingerprint:
            return
        self._fence("publish PodPending")
        try:
            await self._pods_out.publish(
                subjects.PODS_PENDING,
                codec.encode(parsed),
                msg_id=f"pending.{uid}.{parsed.resource_version}",
            )
        except (BusUnavailableError, OutcomeUnknownError) as error:
            # The pod is not being placed at all: say so on it (it stayed Pending with no
            # reason while JetStream could not store pod work), then try again (``_work``).
            self._metrics.publish_failures.labels(kind="pending").inc()
            await self._reporter.explain(
                pod, not_queued_message(error), cause="not-queued", reason=SCHEDULER_ERROR
            )
            raise
        self._published_pending[uid] = fingerprint
        self._metrics.pods_published.labels(kind="pending").inc()

    def end_later(self, uid: str, ref: PodRef) -> None:
        """End pod ``uid``, found gone elsewhere (a new leader's reconciliation), through the pod
        workers as one the informer saw go: one pod is ended by one worker at a time, so
        ``PodDeleted`` goes out once however many found it gone."""
        self._gone.setdefault(uid, ref)
        self.pod_queue.add(uid)

    async def _end_pod(self, uid: str, ref: PodRef) -> bool:
        """The pod is gone or finished: withdraw its record if its GPUs were never all
        allocated (``plan.withdrawable``), then publish ``PodDeleted``. Withdrawing first closes
        the window in which a device plugin could serve another pod's Allocate from that record
        while the placer has not handled ``PodDeleted`` yet. A ``bound`` record a waiting pod
        needs is kept, and the pod's end waits (False) until that pod's Allocate took it or
        the record is no longer needed."""
        if ref.node is not None and not await self._bound.withdraw(ref.node, uid):
            self._gone[uid] = ref
            return False
        await self.publish_deleted(uid, ref)
        return True

    async def publish_deleted(self, uid: str, ref: PodRef) -> None:
        self._fence("publish PodDeleted")
        message = PodDeleted(
            uid=uid,
            namespace=ref.namespace,
            name=ref.name,
            node=ref.node,
            deleted_at=self._clock.now(),
        )
        try:
            await self._pods_out.publish(
                subjects.PODS_DELETED, codec.encode(message), msg_id=f"deleted.{uid}"
            )
        except (BusUnavailableError, OutcomeUnknownError):
            self._metrics.publish_failures.labels(kind="deleted").inc()
            raise
        self._metrics.pods_published.labels(kind="deleted").inc()
