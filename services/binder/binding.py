"""Binding what placers committed: a placed claim's booking -> record ``bound`` -> Binding.

The binder's work is the pods' claims (:class:`~services.binder.claims.ClaimMirror`): a placed
claim names the booking that places its pod. :meth:`PlacementBinder.want` marks a pod to look
at (its claim changed, its record changed, a new leader reconciling); the leader binds each
marked pod in its own task, at most ``max_in_flight`` at once and one at a time per pod, and
tries one that failed (the API or NATS away) again with a growing delay. Exactly once: the
binder looks at the *current* claim and record each time, and the record's write (create-only,
or compare-and-set at the revision read) is what makes a bind happen once; a binder stopped
between the write and the Binding finds the record ``bound`` and creates the Binding then.

For each pod: plan with :func:`plan.plan_bind` under the node's lock, so two pods on one node
never pass the ambiguity gate together; write the record ``bound`` (a lost race is read again and
planned again; a write that times out has an unknown outcome and is read back, and counts as
bound at the gate until it is: :class:`~services.binder.gate.GateRecords` reads and writes the
records); create the Binding (the assignment annotations ride on it and
land with ``spec.nodeName`` in one write; 409 with the pod already on this node counts as done).
A pod held at the gate waits for the record it waits on to move, at most ``gate_timeout_s`` for
each record it waits on (a queue that moves never times out), then fails back to the placer. The
gate waits only for records a device plugin would grant: those that match their booking
(``shared.commits.booking_problem``, read when a record first holds a pod back); a record anyone
else made up holds no real pod back, and is counted in ``tessera_binder_gate_ignored_total``.
Failures publish a ``BindingResult`` ``failed`` or ``gone`` (stored: the placer releases the
placement); ``bound`` goes out on core NATS only for a pod kube-scheduler placed through the
extender, which waits for it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Final, TypeVar

from services.binder.claims import ClaimMirror
from services.binder.draalloc import ClaimAllocation
from services.binder.events import EventRecorder
from services.binder.gate import GateRecords
from services.binder.gateway import ApiUnavailableError, ClusterGateway
from services.binder.metrics import BinderMetrics
from services.binder.rules import describe
from services.binder.rules.nodefacts import extended_allocatable
from services.binder.rules.objects import Node
from services.binder.rules.plan import (
    Bind,
    BindPlan,
    Drop,
    ObservedPod,
    Report,
    Wait,
    gate_resources,
    observe,
    plan_bind,
)
from shared import codec, subjects
from shared.clock import Clock
from shared.commits import record_of
from shared.kubeobjects import Pod
from shared.messages.assignments import AssignmentRecord, RecordView
from shared.messages.bindings import BindingResult, BindOutcome
from shared.messages.ledger import Booking
from shared.runtime.bus import Bus, BusUnavailableError
from shared.runtime.consumer import retry_delay
from shared.runtime.records import RecordMirror
from shared.runtime.tasks import checkpoint

log = logging.getLogger(__name__)

T = TypeVar("T")

MAX_WRITE_ATTEMPTS: Final = 16

BOUND_HERE: Final = 10_000
"""Pods this binder bound lately (pod UID -> commit), so a look at one before the pod informer
shows it bound creates no second Binding."""


class PlacementBinder:
    """Binds placed pods (see the module docstring)."""

    def __init__(
        self,
        *,
        bus: Bus,
        reader: ClusterGateway,
        writer: ClusterGateway,
        records: RecordMirror,
        claims: ClaimMirror,
        recorder: EventRecorder,
        clock: Clock,
        metrics: BinderMetrics,
        gate_timeout_s: float,
        max_in_flight: int,
        pod_of: Callable[[str], Pod | None],
        node_of: Callable[[str], Node | None],
        is_extender_pod: Callable[[Pod], bool],
        fence: Callable[[str], None],
        is_leader: Callable[[], bool],
        restored: Callable[[], bool],
        dra: ClaimAllocation | None = None,
    ) -> None:
        self._dra = dra
        self._restored = restored
        """Whether the store in use is restored (``StoreRestorer.restored``)."""
        self._bus = bus
        self._gateway = reader
        self._writer = writer
        self._records = records
        self._claims = claims
        self._recorder = recorder
        self._clock = clock
        self._metrics = metrics
        self._gate_timeout_s = gate_timeout_s
        self._pod_of = pod_of
        self._node_of = node_of
        self._is_extender_pod = is_extender_pod
        self._fence = fence
        self._is_leader = is_leader
        self._slots = asyncio.Semaphore(max_in_flight)
        self._wanted: OrderedDict[str, None] = OrderedDict()
        """Pods to look at, in the order they were marked."""
        self._woken = asyncio.Event()
        self._running: set[str] = set()
        self._again: set[str] = set()
        """Pods marked while a task binds them: looked at again once it ends."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._node_locks: dict[str, asyncio.Lock] = {}
        self._bound_here: OrderedDict[str, str] = OrderedDict()
        self._gate = GateRecords(
            bus=bus, records=records, clock=clock, metrics=metrics, fence=fence
        )

    # --- what to look at -----------------------------------------------------------------------

    def want(self, pod_uid: str) -> None:
        """Look at ``pod_uid``'s placement (the leader binds it if it is not bound yet)."""
        if not self._is_leader():
            return  # a new leader looks at every placed claim (:meth:`reconcile`)
        if pod_uid in self._running:
            self._again.add(pod_uid)
            return
        self._wanted[pod_uid] = None
        self._woken.set()

    def on_record(self, view: RecordView) -> None:
        """A record version the mirror took: look at its pod again when its placement may now
        be bound (a record of another commit released, one an earlier placer wrote)."""
        booking = self._claims.booking(view.record.pod_uid)
        if booking is None or booking.node != view.record.node:
            return
        if view.record.commit != booking.commit or view.record.state == "reserved":
            self.want(booking.pod_uid)

    def reconcile(self) -> None:
        """A new leader: look at every placed claim (the previous leader may have stopped
        anywhere between a record's write and its Binding)."""
        for uid in self._claims.placed_pods():
            self.want(uid)

    async def run(self) -> None:
        """Bind what is wanted, for as long as this binder leads (cancelled when it stops)."""
        try:
            while True:
                while not self._wanted:
                    self._woken.clear()
                    await self._woken.wait()
                uid, _ = self._wanted.popitem(last=False)
                await self._slots.acquire()
                self._running.add(uid)
                task = asyncio.create_task(self._bind_until_done(uid), name=f"bind-{uid}")
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        finally:
            for task in list(self._tasks):
                task.cancel()
            self._wanted.clear()
            self._again.clear()

    async def _bind_until_done(self, uid: str) -> None:
        try:
            for attempt in itertools.count(1):
                booking = self._claims.booking(uid)
                if booking is None:
                    return  # no longer placed: nothing to bind
                try:
                    await self.bind(booking)
                    return
                except Exception as error:  # the API or NATS away: look again later
                    log.warning(
                        "bind failed; will retry",
                        extra={"pod_uid": uid, "error": repr(error), "attempt": attempt},
                    )
                await self._clock.sleep(retry_delay(attempt))
        finally:
            self._running.discard(uid)
            self._slots.release()
            if uid in self._again:
                self._again.discard(uid)
                self.want(uid)

    # --- planning ------------------------------------------------------------------------------

    def _node_lock(self, node: str) -> asyncio.Lock:
        lock = self._node_locks.get(node)
        if lock is None:
            lock = self._node_locks[node] = asyncio.Lock()
        return lock

    async def _observe(self, booking: Booking) -> tuple[ObservedPod | None, bool]:
        """The pod as the binder sees it, and whether it is kube-scheduler's (extender mode)."""
        pod = self._pod_of(booking.pod_uid)
        if pod is None:  # not (or no longer) in the cache: ask the API server
            pod = await self._gateway.read_pod(booking.namespace, booking.name)
        if pod is None or pod.metadata.uid != booking.pod_uid:
            return None, False
        return observe(pod), self._is_extender_pod(pod)

    def _gate_resources(self, node_name: str, record: AssignmentRecord) -> frozenset[str]:
        node = self._node_of(node_name)
        advertised = extended_allocatable(node) if node is not None else {}
        return gate_resources(advertised, record)

    async def _plan(self, booking: Booking) -> tuple[BindPlan, int, bool]:
        """Plan under the node's lock and write the record it asks for. Returns the plan, the
        mirror's version it was made at and whether the pod is kube-scheduler's."""
        key = subjects.assignment_key(booking.node, booking.pod_uid)
        resources = self._gate_resources(booking.node, record_of(booking))
        fresh = False
        for _ in range(MAX_WRITE_ATTEMPTS):
            pod, extender = await self._observe(booking)
            async with self._node_lock(booking.node):
                version = self._records.changed.version
                record = await self._gate.latest(key, fresh=fresh)
                while True:
                    plan = plan_bind(
                        booking=booking,
                        pod=pod,
                        record=record,
                        node_records=self._gate.waitable(booking.node),
                        resources=resources,
                        now=self._clock.now(),
                    )
                    if not isinstance(plan, Wait) or await self._gate.grantable(plan.blocker):
                        break
                to_write = plan if isinstance(plan, Bind) and plan.write is not None else None
                if to_write is not None and not await self._gate.write(key, to_write):
                    fresh = True  # someone wrote the record meanwhile: read it, plan again
                    continue
                return plan, version, extender
        raise ApiUnavailableError(
            "update assignment record", f"{key} kept changing under {MAX_WRITE_ATTEMPTS} writes"
        )

    # --- binding -------------------------------------------------------------------------------

    async def bind(self, booking: Booking) -> None:
        """Bind ``booking`` once: plan, wait at the gate, write the record, create the Binding
        (raises when the API or NATS is away: :meth:`want` tries again later)."""
        gate_deadline = 0.0
        blocked_by: tuple[str, int] | None = None
        pod = f"{booking.namespace}/{booking.name}"
        while True:
            checkpoint()
            if not self._restored():
                raise BusUnavailableError("NATS lost its store; binding waits for its restore")
            plan, version, extender = await self._plan(booking)
            if not isinstance(plan, Wait):
                break
            now = self._clock.monotonic()
            if blocked_by is None:
                log.info("held by the ambiguity gate", extra={"pod": pod, "reason": plan.reason})
            blocker = (plan.blocker.key, plan.blocker.revision)
            if blocker != blocked_by:
                # The node's queue moved (another pod got its devices, or the one waited on
                # advanced): wait again in full. Only a blocker that stays put fails the pod
                # back; a deadline counted from the first wait failed the tail of every burst
                # queued on one node, and its requeue landed on the same node again.
                blocked_by = blocker
                gate_deadline = now + self._gate_timeout_s
            if now >= gate_deadline:
                self._metrics.gate_waits.labels(outcome="timed_out").inc()
                await self._report(
                    booking,
                    "failed",
                    f"{plan.reason}; gave up after {self._gate_timeout_s:g} s without it moving",
                    extender=extender,
                )
                return
            await self._records.changed.wait_past(version, min(1.0, gate_deadline - now))
        if blocked_by is not None:
            self._metrics.gate_waits.labels(outcome="passed").inc()
        if isinstance(plan, Drop):
            self._metrics.binds.labels(outcome="dropped").inc()
            log.info("placement dropped", extra={"pod": pod, "reason": plan.reason})
        elif isinstance(plan, Report):
            await self._report(booking, plan.outcome, plan.reason, extender=extender)
        elif not plan.binding:
            await self._report(
                booking, "bound", "the pod was already bound to this node", extender=extender
            )
        elif self._bound_here.get(booking.pod_uid) == booking.commit:
            return  # bound here a moment ago; the pod informer has not shown it yet
        else:
            refused = await self._dra.allocate(booking) if self._dra is not None else ""
            outcome, reason = await self._create_binding(booking, plan, refused=refused)
            done_now = outcome == "bound" and not reason
            if outcome == "bound":
                self._bound_here[booking.pod_uid] = booking.commit
                while len(self._bound_here) > BOUND_HERE:
                    self._bound_here.popitem(last=False)
            await self._report(
                booking,
                outcome,
                reason,
                extender=extender,
                record=plan.record if done_now else None,
            )

    async def _create_binding(
        self, booking: Booking, plan: Bind, *, refused: str = ""
    ) -> tuple[BindOutcome, str]:
        """Create the Binding: ("bound", "") when this call bound the pod, else the outcome
        and why (``refused``: its DRA claims could not be allocated, so it is not bound)."""
        if refused:
            return "failed", refused
        answer = await self._writer.bind_pod(
            booking.namespace,
            booking.name,
            uid=booking.pod_uid,
            node=booking.node,
            annotations=plan.annotations,
        )
        if answer.ok:
            return "bound", ""
        if answer.code == 404:
            return "gone", "the pod no longer exists"
        if answer.code == 409:
            pod = await self._gateway.read_pod(booking.namespace, booking.name)
            if pod is None or pod.metadata.uid != booking.pod_uid:
                return "gone", "the pod no longer exists (its name now belongs to another pod)"
            if pod.node == booking.node:
                return "bound", "already bound to this node"
            if pod.node:
                return "failed", f"the pod is already bound to node {pod.node}"
            if pod.terminating:
                return "gone", "the pod is being deleted"
        return (
            "failed",
            f"the API refused the Binding: HTTP {answer.code} {answer.reason}: {answer.message}",
        )

    async def _report(
        self,
        booking: Booking,
        outcome: BindOutcome,
        reason: str,
        *,
        extender: bool,
        record: AssignmentRecord | None = None,
    ) -> None:
        """Publish the BindingResult (a ``bound`` one only for kube-scheduler's pods) and count
        it; for a pod this call bound (``record``), observe the latency and write the Scheduled
        Event."""
        result = BindingResult(
            pod_uid=booking.pod_uid,
            namespace=booking.namespace,
            name=booking.name,
            node=booking.node,
            outcome=outcome,
            reason=reason,
            at=self._clock.now(),
        )
        if outcome != "bound":
            self._fence("publish BindingResult")
            await self._bus.js_publish(
                subjects.bindings(booking.node),
                codec.encode(result),
                msg_id=f"binding.{booking.pod_uid}.{subjects.node_token(booking.node)}."
                f"{booking.decided_at!r}.{outcome}",
            )
        elif extender:
            # Nothing is left for the placer to do (the record says bound): only an extender
            # waiting for this bind listens, so no stream stores it.
            self._fence("publish BindingResult")
            await self._bus.publish(subjects.bound(booking.node), codec.encode(result))
        self._metrics.binds.labels(outcome=outcome).inc()
        pod = f"{booking.namespace}/{booking.name}"
        if outcome != "bound":
            log.warning(
                "not bound",
                extra={"pod": pod, "node": booking.node, "outcome": outcome, "reason": reason},
            )
            return
        if record is None:
            return  # work done before (a placement seen again)
        self._metrics.bind_seconds.observe(max(0.0, self._clock.now() - booking.decided_at))
        log.info("bound", extra={"pod": pod, "node": booking.node})
        self._recorder.emit(
            regarding=describe.regarding_pod(
                namespace=booking.namespace, name=booking.name, uid=booking.pod_uid
            ),
            event_type="Normal",
            reason="Scheduled",
            action="Binding",
            note=describe.scheduled_note(record),
        )
