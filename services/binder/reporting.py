"""Reporting outcomes on the pods: why one is Pending, that its GPUs are allocated, and that an
allocation is late.

- An invalid pod (``shared.podspec``): ``PodScheduled=False`` + Warning Event, and
  ``PodInvalid`` on ``tessera.placements.invalid`` (the dashboard counts it Pending);
- a placer's rejection (consumer ``binder-rejections``): ``PodScheduled=False`` + aggregated
  Warning Event;
- a record the device plugin moved to ``allocated`` (seen in the record mirror):
  ``tessera.dev/assigned: "true"`` on its pod (:meth:`Reporter.allocated`, written by the
  leader's :meth:`Reporter.mark_allocated`; a new leader looks at every allocated record);
- a record bound but not allocated past ``allocation_warning_s``: a Warning Event.

What to write is decided by the pure :mod:`~services.binder.rules.describe`; writes go through the
fenced gateway (only the leader writes).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable

from services.binder.config import BinderConfig
from services.binder.events import EventRecorder
from services.binder.fenced import FencedGateway
from services.binder.gateway import ClusterGateway
from services.binder.metrics import BinderMetrics
from services.binder.rules import describe
from services.binder.workqueue import WorkQueue
from shared import annotations as names
from shared import codec, subjects
from shared.clock import Clock
from shared.kubeobjects import Pod
from shared.messages.assignments import RecordView
from shared.messages.placement import PlacementRejected, PodInvalid
from shared.podspec import InvalidPod
from shared.runtime.bus import Bus
from shared.runtime.consumer import RETRY_S
from shared.runtime.records import RecordMirror
from shared.runtime.tasks import checkpoint

log = logging.getLogger(__name__)


class Reporter:
    """What the binder said on each pod, so it says it once (see the module docstring)."""

    def __init__(
        self,
        *,
        config: BinderConfig,
        gateway: ClusterGateway,
        writer: FencedGateway,
        recorder: EventRecorder,
        records: RecordMirror,
        bus: Bus,
        clock: Clock,
        metrics: BinderMetrics,
        pod_of: Callable[[str], Pod | None],
        fence: Callable[[str], None],
    ) -> None:
        self._config = config
        self._gateway = gateway
        self._writer = writer
        self._recorder = recorder
        self._records = records
        self._bus = bus
        self._clock = clock
        self._metrics = metrics
        self._pod_of = pod_of
        self._fence = fence
        self._explained: dict[str, str] = {}
        """The PodScheduled=False message last written per pending pod (the informer may lag)."""
        self._invalid_published: dict[str, str] = {}
        """Pod uid -> the reason last published on ``tessera.placements.invalid``."""
        self._warned: set[str] = set()
        self._allocated: WorkQueue[str] = WorkQueue()
        """Keys of records seen ``allocated`` whose pods are still to be marked."""
        self._retrying: set[asyncio.Task[None]] = set()

    def forget(self, uid: str) -> None:
        """The pod is gone or no longer pending: what was said of it no longer holds."""
        self._explained.pop(uid, None)
        self._invalid_published.pop(uid, None)

    def reset(self) -> None:
        """Say it again (a new leader: the previous leader's last writes may be missing)."""
        self._explained.clear()

    async def publish_invalid(self, invalid: InvalidPod) -> None:
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

    async def explain(
        self, pod: Pod, message: str, *, cause: str, reason: str = describe.UNSCHEDULABLE
    ) -> None:
        """``PodScheduled=False`` with ``reason`` and ``message`` (unless the pod says so
        already) and a Warning Event. A placer rejection is an occurrence each time (repeats
        count into the Event's series); an invalid request, or a request NATS did not store, is
        one occurrence until the message changes."""
        meta = pod.metadata
        said = self._explained.get(meta.uid) == message
        if said and cause in ("invalid", "not-queued"):
            return
        if not said and describe.reports_unschedulable(pod, message, reason=reason):
            self._explained[meta.uid] = message  # written before (a previous leader)
        elif not said:
            if cause == "invalid":
                self._metrics.invalid_pods.inc()
            self._explained[meta.uid] = message  # before the write: repeats meanwhile skip it
            try:
                answer = await self._writer.patch_pod_status(
                    meta.namespace,
                    meta.name,
                    describe.unschedulable_patch(
                        uid=meta.uid,
                        message=message,
                        now=describe.status_time(self._clock.now()),
                        reason=reason,
                    ),
                )
            except BaseException:
                self._explained.pop(meta.uid, None)
                raise
            if not answer.ok:
                self._explained.pop(meta.uid, None)
                log.info(
                    "pending pod not explained",
                    extra={"pod": meta.key, "code": answer.code, "detail": answer.message},
                )
                return
            self._metrics.explained.labels(cause=cause).inc()
        self._recorder.emit(
            regarding=describe.regarding_pod(
                namespace=meta.namespace, name=meta.name, uid=meta.uid
            ),
            event_type="Warning",
            reason="FailedScheduling",
            action="Scheduling",
            note=message,
        )

    async def gated(self, pod: Pod, message: str) -> None:
        """``PodScheduled=False`` (reason ``SchedulingGated``, as the API server sets it) with
        ``message``, once per message; no Event, as kube-scheduler writes none for a gated
        pod."""
        meta = pod.metadata
        if self._explained.get(meta.uid) == message or describe.reports_unschedulable(
            pod, message, reason=describe.GATED
        ):
            self._explained[meta.uid] = message
            return
        self._explained[meta.uid] = message
        answer = await self._writer.patch_pod_status(
            meta.namespace,
            meta.name,
            describe.unschedulable_patch(
                uid=meta.uid,
                message=message,
                now=describe.status_time(self._clock.now()),
                reason=describe.GATED,
            ),
        )
        if not answer.ok:
            self._explained.pop(meta.uid, None)
            return
        self._metrics.explained.labels(cause="gated").inc()

    async def handle_rejection(self, rejected: PlacementRejected) -> None:
        """Explain on the pod why it is Pending."""
        pod = self._pod_of(rejected.pod_uid)
        if pod is None or pod.node:
            return  # gone, or placed since
        await self.explain(pod, describe.unschedulable_message(rejected), cause="rejected")

    def allocated(self, view: RecordView) -> None:
        """A record version the mirror took: mark its pod once it is ``allocated``."""
        if view.record.state == "allocated":
            self._allocated.add(view.key)

    def reconcile(self) -> None:
        """A new leader: mark the pod of every allocated record (not marked yet)."""
        for view in self._records.views():
            self.allocated(view)

    async def mark_allocated(self) -> None:
        """Mark each pod whose record turned ``allocated`` (the leader's; runs until cancelled);
        one the API could not take is tried again shortly."""
        while True:
            key = await self._allocated.get()
            try:
                checkpoint()
                await self._mark(key)
            except Exception as error:  # the API away: try it again shortly
                log.warning("cannot mark an allocated pod yet", extra={"error": repr(error)})
                self._later(key)
            finally:
                self._allocated.done(key)

    def _later(self, key: str) -> None:
        async def again() -> None:
            await self._clock.sleep(RETRY_S)
            self._allocated.add(key)

        task = asyncio.create_task(again())
        self._retrying.add(task)
        task.add_done_callback(self._retrying.discard)

    async def _mark(self, key: str) -> None:
        view = self._records.get(key)
        if view is None or view.record.state != "allocated":
            return  # released or gone since
        record = view.record
        pod = self._pod_of(record.pod_uid)
        if pod is None:
            pod = await self._gateway.read_pod(record.namespace, record.name)
            if pod is None or pod.metadata.uid != record.pod_uid:
                return
        if (pod.metadata.annotations or {}).get(names.ASSIGNED) == "true":
            return
        answer = await self._writer.patch_pod(
            record.namespace, record.name, describe.assigned_patch(uid=record.pod_uid)
        )
        if not answer.ok:  # gone or replaced meanwhile (404, 422): nothing left to mark
            log.info(
                "allocated pod not marked",
                extra={
                    "pod": f"{record.namespace}/{record.name}",
                    "code": answer.code,
                    "detail": answer.message,
                },
            )

    async def watch_allocation_delays(self) -> None:
        """Warn (log and Event) once per record bound but not allocated past
        ``allocation_warning_s``."""
        warning_s = self._config.allocation_warning_s
        period = max(0.2, min(5.0, warning_s / 4))
        while True:
            await self._clock.sleep(period)
            now = self._clock.now()
            live = set()
            for view in self._records.views():
                record = view.record
                live.add(view.key)
                if view.key in self._warned:
                    continue
                waited = describe.allocation_delay(record, now=now, warning_s=warning_s)
                if waited is None:
                    continue
                self._warned.add(view.key)
                if self._pod_of(record.pod_uid) is None:
                    continue
                log.warning(
                    "bound but not allocated",
                    extra={
                        "pod": f"{record.namespace}/{record.name}",
                        "node": record.node,
                        "waited_s": round(waited),
                    },
                )
                self._recorder.emit(
                    regarding=describe.regarding_pod(
                        namespace=record.namespace, name=record.name, uid=record.pod_uid
                    ),
                    event_type="Warning",
                    reason="AllocationDelayed",
                    action="Allocating",
                    note=describe.allocation_delayed_note(record, waited),
                )
            self._warned &= live
