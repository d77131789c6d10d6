"""Carrying out placement decisions: record ``reserved -> bound``, Binding, BindingResult.

For each decision (:meth:`DecisionBinder.handle`): plan with :func:`plan.plan_bind` under the
node's lock, so two decisions on one node never pass the ambiguity gate together; move the record
``reserved -> bound`` by compare-and-set (the record is the mirror's when it holds it reserved
for this decision, else read from the bucket; a lost race is read again and planned again; one
that times out has an unknown outcome and is read back, and counts as bound at the gate until it
is); create the Binding (the assignment
annotations ride on it and land with ``spec.nodeName`` in one write; 409 with the pod already on
this node counts as done); publish the ``BindingResult``. A decision whose commit's record is in
neither the mirror nor the bucket waits up to ``record_wait_s`` for the mirror to take it (the
placer writes the record and publishes the decision at once); then it is delivered again later
while the pod's claim names its commit, else dropped. A decision held
at the gate waits for the record it waits on to move, at most ``gate_timeout_s`` for each record
it waits on (a queue that moves never times out), then fails back to the placer. The gate
waits only for records that stand for a placer's commit, or one a placer is withdrawing
(``shared.commits``: the pod's claim and the node's ledger entry, read when a record first holds
a decision back): a record anyone else made up holds no real pod back, and is counted in
``tessera_binder_gate_ignored_total``. Failures after the compare-and-set publish ``failed`` or
``gone``, stored, so the placer releases the booking (``bound`` goes out on core NATS only, for
an extender waiting on the bind); an API or NATS outage raises, and the message is delivered
again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Final, TypeVar

from services.binder import explain
from services.binder.events import EventRecorder
from services.binder.gateway import ApiUnavailableError, ClusterGateway
from services.binder.metrics import BinderMetrics
from services.binder.nodefacts import extended_allocatable
from services.binder.objects import Node
from services.binder.plan import (
    Advance,
    AwaitRecord,
    Bind,
    BindPlan,
    Drop,
    ObservedPod,
    Report,
    Wait,
    claim_of,
    gate_resources,
    matches,
    observe,
    plan_bind,
    record_on_its_way,
)
from shared import codec, subjects
from shared.clock import Clock
from shared.commits import commit_problem, withdrawing
from shared.kubeobjects import Pod
from shared.messages.assignments import AssignmentRecord, RecordView
from shared.messages.bindings import BindingResult, BindOutcome
from shared.messages.ledger import Booking, PodClaim
from shared.messages.placement import PlacementDecision
from shared.runtime.bus import Bus
from shared.runtime.consumer import AlreadyHandlingError
from shared.runtime.records import RecordMirror
from shared.runtime.tasks import checkpoint

log = logging.getLogger(__name__)

T = TypeVar("T")

MAX_CAS_ATTEMPTS: Final = 16

COMMIT_RECHECK_S: Final = 5.0
"""A record found to match no commit is checked again after this long (a claim may be rebuilt)."""

MAX_COMMIT_CHECKS: Final = 10_000
"""Records whose commit check is remembered; beyond it, those of records gone are forgotten."""


class RecordPendingError(TimeoutError):
    """A decision's record has not come yet but its commit stands: deliver it again later
    (a ``TimeoutError``: the consumer naks it with a growing delay, logging a warning)."""


class DecisionBinder:
    """Binds decided pods (see the module docstring)."""

    def __init__(
        self,
        *,
        bus: Bus,
        reader: ClusterGateway,
        writer: ClusterGateway,
        records: RecordMirror,
        recorder: EventRecorder,
        clock: Clock,
        metrics: BinderMetrics,
        gate_timeout_s: float,
        record_wait_s: float,
        pod_of: Callable[[str], Pod | None],
        node_of: Callable[[str], Node | None],
        fence: Callable[[str], None],
    ) -> None:
        self._bus = bus
        self._gateway = reader
        self._writer = writer
        self._records = records
        self._recorder = recorder
        self._clock = clock
        self._metrics = metrics
        self._gate_timeout_s = gate_timeout_s
        self._record_wait_s = record_wait_s
        self._pod_of = pod_of
        self._node_of = node_of
        self._fence = fence
        self._binding: set[str] = set()
        self._node_locks: dict[str, asyncio.Lock] = {}
        self._committed: dict[str, int] = {}
        """Record key -> the revision found to match its commit."""
        self._uncommitted: dict[str, tuple[int, float]] = {}
        """Record key -> (revision, when checked) found to match no commit."""
        self._in_doubt: dict[str, RecordView] = {}
        """Record key -> the ``bound`` version this binder wrote with an unknown outcome that it
        could not read back: the gate counts it as bound until the key is read or seen anew."""

    async def handle(self, decision: PlacementDecision) -> None:
        """Bind one decided pod (idempotent: a redelivery finds the work done)."""
        if decision.pod_uid in self._binding:
            raise AlreadyHandlingError(decision.pod_uid)
        self._binding.add(decision.pod_uid)
        try:
            await self._bind(decision)
        finally:
            self._binding.discard(decision.pod_uid)

    def _node_lock(self, node: str) -> asyncio.Lock:
        lock = self._node_locks.get(node)
        if lock is None:
            lock = self._node_locks[node] = asyncio.Lock()
        return lock

    async def _observe(self, decision: PlacementDecision) -> ObservedPod | None:
        pod = self._pod_of(decision.pod_uid)
        if pod is None:  # not (or no longer) in the cache: ask the API server
            pod = await self._gateway.read_pod(decision.namespace, decision.name)
        if pod is None or pod.metadata.uid != decision.pod_uid:
            return None
        return observe(pod)

    def _gate_resources(self, node_name: str, record: AssignmentRecord) -> frozenset[str]:
        node = self._node_of(node_name)
        advertised = extended_allocatable(node) if node is not None else {}
        return gate_resources(advertised, record)

    async def _plan(self, decision: PlacementDecision) -> tuple[BindPlan, int]:
        """Plan under the node's lock and carry out the record compare-and-set it asks for.
        Returns the plan and the mirror's version it was made at."""
        key = subjects.assignment_key(decision.node, decision.pod_uid)
        fresh = False
        for _ in range(MAX_CAS_ATTEMPTS):
            pod = await self._observe(decision)
            async with self._node_lock(decision.node):
                version = self._records.changed.version
                record = await self._record_of(key, decision, fresh=fresh)
                while True:
                    plan = plan_bind(
                        decision=decision,
                        pod=pod,
                        record=record,
                        node_records=self._gate_records(decision.node),
                        resources=self._gate_resources(decision.node, record.record)
                        if record is not None
                        else frozenset(),
                        now=self._clock.now(),
                    )
                    if not isinstance(plan, Wait) or await self._stands_for_commit(plan.blocker):
                        break
                step = claim_of(plan)
                if step is not None and not await self._claim(*step):
                    fresh = True  # someone wrote the record meanwhile: read it and plan again
                    continue
                return plan, version
        raise ApiUnavailableError(
            "update assignment record", f"{key} kept changing under {MAX_CAS_ATTEMPTS} claims"
        )

    async def _record_of(
        self, key: str, decision: PlacementDecision, *, fresh: bool
    ) -> RecordView | None:
        """The record ``decision`` binds: the mirror's when it holds it reserved for this very
        decision (the compare-and-set that moves it on fails if it is not current, and the
        bucket is read then), else the bucket's (``fresh``: always the bucket's, as for a
        record whose last compare-and-set had an unknown outcome)."""
        if key in self._in_doubt:
            view = await self._records.read(key)
            self._in_doubt.pop(key, None)  # the mirror now holds what the bucket holds
            return view
        if not fresh:
            held = self._records.get(key)
            if (
                held is not None
                and held.record.state == "reserved"
                and matches(held.record, decision)
            ):
                return held
        return await self._records.read(key)

    def _gate_records(self, node: str) -> list[RecordView]:
        """The node's records the gate may wait for: all but those found to match no commit,
        with a record this binder may have bound (:attr:`_in_doubt`) counted as bound."""
        now = self._clock.monotonic()
        views = {view.key: view for view in self._records.on_node(node)}
        for key, doubt in list(self._in_doubt.items()):
            if self._records.revision(key) > doubt.revision:
                del self._in_doubt[key]  # the mirror has seen what became of it
            elif doubt.record.node == node:
                views[key] = doubt
        return [
            view
            for view in views.values()
            if not (
                (found := self._uncommitted.get(view.key)) is not None
                and found[0] == view.revision
                and now - found[1] < COMMIT_RECHECK_S
            )
        ]

    async def _read(self, bucket: str, key: str, kind: type[T]) -> T | None:
        """The entry as ``kind``; None when absent or undecodable (only placers write the
        claims and the ledger this reads)."""
        entry = await self._bus.kv_get(bucket, key)
        if entry is None:
            return None
        try:
            return codec.decode(entry.value, kind)
        except codec.DecodeError:
            return None

    async def _record_on_its_way(self, decision: PlacementDecision) -> bool:
        claim = await self._read(subjects.KV_CLAIMS, subjects.claim_key(decision.pod_uid), PodClaim)
        return record_on_its_way(decision, claim)

    async def _stands_for_commit(self, view: RecordView) -> bool:
        """Whether ``view`` is what a placer committed (reads its claim and its booking once per
        revision); one that is not is remembered, counted and logged."""
        if self._committed.get(view.key) == view.revision:
            return True
        record = view.record
        claim = await self._read(subjects.KV_CLAIMS, subjects.claim_key(record.pod_uid), PodClaim)
        booking = await self._read(
            subjects.KV_LEDGER, subjects.booking_key(record.node, record.pod_uid), Booking
        )
        problem = commit_problem(record, claim=claim, booking=booking)
        if len(self._committed) + len(self._uncommitted) > MAX_COMMIT_CHECKS:
            held = self._records.get
            self._committed = {k: r for k, r in self._committed.items() if held(k)}
            self._uncommitted = {k: c for k, c in self._uncommitted.items() if held(k)}
        if problem is None or withdrawing(record, claim=claim):
            # A withdrawn commit's record may be granted until its placer fences it (a new
            # revision), so the gate waits for it as for a committed one.
            self._committed[view.key] = view.revision
            return True
        self._uncommitted[view.key] = (view.revision, self._clock.monotonic())
        self._metrics.gate_ignored.inc()
        log.warning(
            "the ambiguity gate ignores a record that matches no commit",
            extra={"record": view.key, "reason": problem},
        )
        return False

    async def _claim(self, claim: RecordView, record: AssignmentRecord) -> bool:
        """Compare-and-set ``claim`` -> ``record``; False when someone else wrote first."""
        self._fence("update assignment record")
        data = codec.encode(record)
        try:
            revision = await self._bus.kv_update(
                subjects.KV_ASSIGNMENTS, claim.key, data, revision=claim.revision
            )
        except Exception as error:
            log.warning(
                "record update outcome unknown; reading it back",
                extra={"key": claim.key, "error": repr(error)},
            )
            # Until it is read back, the record may be bound: a chaos run bound a pod with
            # other slices beside it, and the device plugin served each from the other's record.
            self._in_doubt[claim.key] = RecordView(
                key=claim.key, revision=claim.revision, record=record
            )
            current = await self._records.read(claim.key)
            self._in_doubt.pop(claim.key, None)
            return current is not None and current.record == record
        if revision is None:
            return False
        await self._records.remember(RecordView(key=claim.key, revision=revision, record=record))
        return True

    async def _record_taken(self, key: str, after: int, version: int, deadline: float) -> None:
        """Wait until the mirror has taken a version of ``key`` newer than revision ``after``,
        or ``deadline`` passed (only a change of this key is worth planning again for)."""
        while self._records.revision(key) <= after:
            left = deadline - self._clock.monotonic()
            if left <= 0:
                return
            await self._records.changed.wait_past(version, left)
            version = self._records.changed.version

    async def _bind(self, decision: PlacementDecision) -> None:
        gate_deadline = 0.0
        blocked_by: tuple[str, int] | None = None
        record_deadline: float | None = None
        while True:
            checkpoint()
            plan, version = await self._plan(decision)
            if isinstance(plan, AwaitRecord):
                now = self._clock.monotonic()
                if record_deadline is None:
                    record_deadline = now + self._record_wait_s
                if now < record_deadline:
                    key = subjects.assignment_key(decision.node, decision.pod_uid)
                    await self._record_taken(key, plan.after, version, record_deadline)
                    continue  # plan again: from the mirror, or one last read of the bucket
                if await self._record_on_its_way(decision):
                    self._metrics.record_waits.labels(outcome="pending").inc()
                    raise RecordPendingError(
                        f"no record of commit {decision.commit} of "
                        f"{decision.namespace}/{decision.name} after {self._record_wait_s:g} s; "
                        "its claim still names it: delivered again later"
                    )
                self._metrics.record_waits.labels(outcome="dropped").inc()
                plan = Drop(
                    reason=f"{plan.reason} after {self._record_wait_s:g} s, and the pod's claim "
                    "no longer names it"
                )
            elif record_deadline is not None:
                self._metrics.record_waits.labels(outcome="arrived").inc()
                record_deadline = None
            if isinstance(plan, Wait):
                now = self._clock.monotonic()
                if blocked_by is None:
                    log.info(
                        "held by the ambiguity gate",
                        extra={
                            "pod": f"{decision.namespace}/{decision.name}",
                            "reason": plan.reason,
                        },
                    )
                blocker = (plan.blocker.key, plan.blocker.revision)
                if blocker != blocked_by:
                    # The node's queue moved (another pod got its devices, or the one waited on
                    # advanced): wait again in full. Only a blocker that stays put fails the pod
                    # back; a deadline counted from the first wait failed the tail of every
                    # burst queued on one node, and its requeue landed on the same node again.
                    blocked_by = blocker
                    gate_deadline = now + self._gate_timeout_s
                if now >= gate_deadline:
                    self._metrics.gate_waits.labels(outcome="timed_out").inc()
                    await self._report(
                        decision,
                        "failed",
                        f"{plan.reason}; gave up after {self._gate_timeout_s:g} s without "
                        "it moving",
                    )
                    return
                await self._records.changed.wait_past(version, min(1.0, gate_deadline - now))
                continue
            if blocked_by is not None:
                self._metrics.gate_waits.labels(outcome="passed").inc()
            break
        if isinstance(plan, Drop):
            self._metrics.binds.labels(outcome="dropped").inc()
            log.info(
                "decision dropped",
                extra={"pod": f"{decision.namespace}/{decision.name}", "reason": plan.reason},
            )
        elif isinstance(plan, Report):
            await self._report(decision, plan.outcome, plan.reason)
        elif isinstance(plan, Advance):
            await self._report(decision, "bound", "the pod was already bound to this node")
        elif isinstance(plan, Bind):
            outcome, reason = await self._create_binding(decision, plan)
            done_now = outcome == "bound" and not reason
            await self._report(decision, outcome, reason, record=plan.record if done_now else None)

    async def _create_binding(
        self, decision: PlacementDecision, plan: Bind
    ) -> tuple[BindOutcome, str]:
        """Create the Binding: ("bound", "") when this call bound the pod, else the outcome
        and why."""
        answer = await self._writer.bind_pod(
            decision.namespace,
            decision.name,
            uid=decision.pod_uid,
            node=decision.node,
            annotations=plan.annotations,
        )
        if answer.ok:
            return "bound", ""
        if answer.code == 404:
            return "gone", "the pod no longer exists"
        if answer.code == 409:
            pod = await self._gateway.read_pod(decision.namespace, decision.name)
            if pod is None or pod.metadata.uid != decision.pod_uid:
                return "gone", "the pod no longer exists (its name now belongs to another pod)"
            if pod.node == decision.node:
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
        decision: PlacementDecision,
        outcome: BindOutcome,
        reason: str,
        *,
        record: AssignmentRecord | None = None,
    ) -> None:
        """Publish the BindingResult and count it; for a pod this call bound (``record``),
        observe the latency and write the Scheduled Event."""
        self._fence("publish BindingResult")
        result = BindingResult(
            pod_uid=decision.pod_uid,
            namespace=decision.namespace,
            name=decision.name,
            node=decision.node,
            outcome=outcome,
            reason=reason,
            at=self._clock.now(),
        )
        if outcome == "bound":
            # Nothing is left for the placer to do (the record says bound): only an extender
            # waiting for this bind listens, so no stream stores it.
            await self._bus.publish(subjects.bound(decision.node), codec.encode(result))
        else:
            await self._bus.js_publish(
                subjects.bindings(decision.node),
                codec.encode(result),
                msg_id=f"binding.{decision.pod_uid}.{subjects.node_token(decision.node)}."
                f"{decision.decided_at!r}.{outcome}",
            )
        self._metrics.binds.labels(outcome=outcome).inc()
        pod = f"{decision.namespace}/{decision.name}"
        if outcome != "bound":
            log.warning(
                "not bound",
                extra={"pod": pod, "node": decision.node, "outcome": outcome, "reason": reason},
            )
            return
        if record is None:
            return  # a redelivery of work already done
        self._metrics.bind_seconds.observe(max(0.0, self._clock.now() - decision.decided_at))
        log.info("bound", extra={"pod": pod, "node": decision.node})
        self._recorder.emit(
            regarding=explain.regarding_pod(
                namespace=decision.namespace, name=decision.name, uid=decision.pod_uid
            ),
            event_type="Normal",
            reason="Scheduled",
            action="Binding",
            note=explain.scheduled_note(record),
        )
