"""The ``bound`` records of pods that ended or were admitted: withdrawn, settled or kept.

A pod that ends before its GPUs were all allocated has its ``bound`` record withdrawn
(``released``) before ``PodDeleted`` goes out (:meth:`BoundRecords.withdraw`); a pod the kubelet
admitted while its record still waits for an Allocate has the record settled when it is a surplus
record of its shape on the node (:meth:`BoundRecords.settle_served_elsewhere`). Either waits while
a waiting pod of the node may still need the record (``plan.withdrawable``,
``plan.served_elsewhere``): such a record is *kept*, and counted again when a pod of its node is
admitted or ends. Every write is a compare-and-set on the record, fenced by the Lease.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Final, Literal, Protocol

from services.binder.metrics import BinderMetrics
from services.binder.rules.plan import (
    Admission,
    admission_of,
    same_shape,
    served_elsewhere,
    stranded,
    withdrawable,
)
from shared import codec, subjects
from shared.clock import Clock
from shared.kubeobjects import Pod
from shared.messages.assignments import AssignmentRecord, RecordView, released, settled
from shared.runtime.bus import Bus
from shared.runtime.records import RecordMirror

log = logging.getLogger(__name__)

RECOUNT_S: Final = 2.0
"""How soon a ``bound`` record kept for a waiting pod is counted again, whatever happens on its
node meanwhile (an admission or an ending counts it again at once)."""


WITHDREW: Final = "withdrew the record of a pod that ended before its GPUs were allocated"
SETTLED: Final = (
    "settled the record of a pod admitted while it waited for an Allocate: the device plugin "
    "served it from another record of the same slices, whose pod ended first"
)
"""The log messages of a record withdrawn and settled (``benchmarks/chaos.py`` counts them in
the logs of binders it kills, whose counters die with them)."""


Judge = Callable[[AssignmentRecord, list[AssignmentRecord], dict[str, Admission]], bool]
"""``plan.served_elsewhere`` or ``plan.withdrawable``."""


class Transition(Protocol):
    """A record transition of ``shared.messages.assignments`` (``released``, ``settled``)."""

    def __call__(self, record: AssignmentRecord, *, now: float) -> AssignmentRecord: ...


class BoundRecords:
    """See the module docstring. ``requeue`` marks a pod dirty for the pod workers (a kept
    record's pod is synced again), ``later`` does so after a delay."""

    def __init__(
        self,
        *,
        bus: Bus,
        clock: Clock,
        metrics: BinderMetrics,
        records: RecordMirror,
        fence: Callable[[str], None],
        pod_of: Callable[[str], Pod | None],
        requeue: Callable[[str], None],
        later: Callable[[float, Callable[[str], None], str], None],
    ) -> None:
        self._bus = bus
        self._clock = clock
        self._metrics = metrics
        self._records = records
        self._fence = fence
        self._pod_of = pod_of
        self._requeue = requeue
        self._later = later
        self._settling = asyncio.Lock()
        self._unsettled: dict[str, set[str]] = {}
        """Node -> pods whose records are ``bound`` and no surplus yet (``_leave_bound``); a
        node without any is not listed."""

    async def withdraw(self, node: str, uid: str) -> bool:
        """Pod ``uid`` on ``node`` is gone or finished: withdraw its record if its GPUs were
        never all allocated (``plan.withdrawable``); False while a waiting pod needs the record,
        which is kept."""
        outcome = await self._leave_bound(node, uid, withdrawable, released, ended=True)
        if outcome == "rewritten":
            self._metrics.records_withdrawn.inc()
            log.info(
                WITHDREW,
                extra={"record": subjects.assignment_key(node, uid)},
            )
        if outcome == "kept":
            return False
        self._count_unsettled_again(node)
        return True

    async def settle_served_elsewhere(self, pod: Pod) -> None:
        """The kubelet admitted ``pod`` but its record may still wait for an Allocate: settle it
        when it is a surplus record of its shape on the node (``plan.served_elsewhere``)."""
        if admission_of(pod) != "admitted":
            return
        uid = pod.metadata.uid
        outcome = await self._leave_bound(pod.node, uid, served_elsewhere, settled, ended=False)
        if outcome == "moved":  # the common case: allocated by its own Allocate, nothing read
            self._count_unsettled_again(pod.node)
        elif outcome == "rewritten":
            self._metrics.records_settled.inc()
            log.warning(
                SETTLED,
                extra={"record": subjects.assignment_key(pod.node, uid)},
            )

    async def _leave_bound(
        self, node: str, uid: str, may: Judge, rewrite: Transition, *, ended: bool
    ) -> Literal["rewritten", "kept", "moved"]:
        """Move pod ``uid``'s ``bound`` record on ``node`` on by ``rewrite`` when ``may`` allows
        it over the node's records of its shape: ``rewritten`` (done here), ``kept`` (still
        ``bound``: counted again when a pod of the node is admitted or ends, the two things that
        can change the count, ``_unsettled``) or ``moved`` (not ``bound`` any more; nothing
        read when the mirror says so)."""
        key = subjects.assignment_key(node, uid)
        view = self._records.get(key)
        if view is None or not stranded(view.record):
            self._mark_kept(node, uid, kept=False)
            return "moved"
        async with self._settling:  # one count at a time, each over the writes before it
            others = [
                v
                for v in self._records.on_node(node)
                if v.key != key and same_shape(v.record, view.record)
            ]
            # Where the pods are first, their records after: a pod admitted in between counts
            # as waiting, whichever record its Allocate took, so no surplus is seen that is not
            # one. (The other order found one: 16 identical pods admitted during the reads.)
            admission = {
                v.record.pod_uid: admission_of(self._pod_of(v.record.pod_uid)) for v in others
            }
            admission[uid] = "ended" if ended else "admitted"
            own = await self._records.read(key)
            done = False
            if own is not None and stranded(own.record):
                alike = await self._read_backlog(others)
                done = await self._rewrite_record(
                    key,
                    applies=lambda record: may(record, alike, admission),
                    rewrite=rewrite,
                    action="move an assignment record on",
                )
        current = self._records.get(key)
        kept = current is not None and stranded(current.record)
        self._mark_kept(node, uid, kept=kept)
        if kept:  # the pod whose admission frees it may have been seen while this count ran
            self._later(RECOUNT_S, self._requeue, uid)
        return "rewritten" if done else "kept" if kept else "moved"

    async def _read_backlog(self, views: list[RecordView]) -> list[AssignmentRecord]:
        """``views`` as they are now: those the mirror shows ``bound`` (the node's backlog)
        read afresh, as they may have been allocated since. One shown allocated is (records
        never move back)."""
        records: list[AssignmentRecord] = []
        for view in views:
            if view.record.state == "bound":
                fresh = await self._records.read(view.key)
                if fresh is None:
                    continue
                view = fresh
            records.append(view.record)
        return records

    def _mark_kept(self, node: str, uid: str, *, kept: bool) -> None:
        """Note whether pod ``uid``'s ``bound`` record on ``node`` is kept for a waiting pod
        (``_unsettled``, and the gauge an operator reads it from)."""
        unsettled = self._unsettled.get(node, set())
        if kept and uid not in unsettled:
            self._unsettled.setdefault(node, unsettled).add(uid)
            self._metrics.records_kept.inc()
        elif not kept and uid in unsettled:
            unsettled.discard(uid)
            if not unsettled:
                del self._unsettled[node]
            self._metrics.records_kept.dec()

    def _count_unsettled_again(self, node: str) -> None:
        for uid in self._unsettled.get(node, ()):
            self._requeue(uid)

    async def _rewrite_record(
        self,
        key: str,
        *,
        applies: Callable[[AssignmentRecord], bool],
        rewrite: Transition,
        action: str,
    ) -> bool:
        """Rewrite the record at ``key`` with ``rewrite(record, now=...)`` by compare-and-set
        while ``applies`` to it; whether this binder wrote it."""
        view = self._records.get(key)
        while view is not None and applies(view.record):
            self._fence(action)
            record = rewrite(view.record, now=self._clock.now())
            revision = await self._bus.kv_update(
                subjects.KV_ASSIGNMENTS, key, codec.encode(record), revision=view.revision
            )
            if revision is None:  # moved meanwhile (allocated, or released by a placer)
                view = await self._records.read(key)
                continue
            await self._records.remember(RecordView(key=key, revision=revision, record=record))
            return True
        return False
