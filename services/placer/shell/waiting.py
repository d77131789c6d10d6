"""Pods that fit nowhere yet: why (published as rejections), the waiting board shared by every
replica (``board.py``), the pods on it placed first when they fit, and the retry loop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from services.placer.core.model import Decision, PodRequest
from services.placer.rules import board, decider, translate
from services.placer.rules.board import Posted
from services.placer.rules.decider import Waiting
from services.placer.shell.context import Shell, log
from services.placer.shell.held import (
    BACKOFF_MAX_S,
    BACKOFF_MIN_S,
    Held,
    HeldPod,
    Outcome,
)
from shared import codec, subjects
from shared.messages.waiting import WaitingPod

REFRESH_S = 1.0
SAFETY_RETRY_S = 60.0
"""A waiting pod is tried again at least this often, even when nothing seemed to change."""
AHEAD_SCAN = 64
"""Board entries ordered before a pod looked at before it commits (``board.first_fitting``)."""
AHEAD_EVALUATIONS = 16
"""Of those, pod shapes decided afresh (the rest are known not to fit since the last freeing)."""
AHEAD_PLACED = 8
"""Waiting pods placed first, at most, before one pod commits."""
BOARD_SWEEP_GRACE_S = 10.0
"""A board entry whose pod is placed or deleted is swept once it is this old."""

Decide = Callable[[HeldPod, Waiting | None, float], Decision | Waiting]
Start = Callable[[HeldPod], None]


class WaitingPods:
    """Rejections, the board and retries for the pods this replica holds waiting.

    ``decide``: decide a held pod on the view now; ``start``: decide it and set its commit
    going, without looking ahead again (both the place loop's)."""

    def __init__(self, *, shell: Shell, held: Held, decide: Decide, start: Start) -> None:
        self._shell = shell
        self._held = held
        self._decide = decide
        self._start = start

    # --- placing waiting pods first ------------------------------------------------------------

    def place_ahead_of(self, item: HeldPod, decision: Decision, now: float) -> Decision | Waiting:
        """Place first the waiting pods on the board ordered before ``item`` that fit now, then
        decide ``item`` again (``board.py`` has why); ``decision`` when there are none."""
        shell = self._shell
        if not len(shell.board) or item.only_node is not None or item.adopted:
            return decision
        key = shell.board.key_of(
            item.request,
            priority_label=item.pod.hints.priority_label,
            created_at=item.pod.created_at,
        )
        if key is None:
            return decision
        assert shell.profile is not None
        profile = shell.profile

        def skip(uid: str) -> bool:
            if uid == item.pod.uid:
                return True
            claim = shell.view.claim(uid)
            if claim is not None and claim.state != "requeued":
                return True  # placed or deleted already
            held = self._held.items.get(uid)
            return held is not None and held.stage != "waiting"

        def fits(request: PodRequest) -> bool:
            shape = request.placement_key()
            if shape in shell.failed_keys:
                return False
            outcome = decider.decide(
                shell.view, profile, request, now=now, spread=shell.config.burst_spread
            )
            if isinstance(outcome, Waiting):
                if not request.counts_pods:
                    shell.failed_keys[shape] = outcome
                return False
            return True

        outcome: Decision | Waiting = decision
        for _ in range(AHEAD_PLACED):
            ahead = board.first_fitting(
                shell.board,
                key,
                skip=skip,
                fits=fits,
                scan=AHEAD_SCAN,
                evaluations=AHEAD_EVALUATIONS,
            )
            if ahead is None:
                break
            self._place_first(ahead, before=item)
            outcome = self._decide(item, None, now)
            if isinstance(outcome, Waiting):
                break
        return outcome

    def _place_first(self, posted: Posted, *, before: HeldPod) -> None:
        """Decide and commit a waiting pod of the board now, ahead of ``before``."""
        shell, held = self._shell, self._held
        uid = posted.uid
        known = held.items.get(uid)
        if known is not None:  # waiting here
            held.waiting.pop(uid, None)
            held.queue.remove(uid)
            known.stage = "queued"
            item = known
        else:
            item = held.items[uid] = HeldPod(
                pod=posted.waiting.pod,
                request=posted.request,
                deliveries=[],
                received=shell.clock.monotonic(),
                adopted=True,
            )
        here = posted.waiting.holder == shell.config.placer_id
        shell.metrics.placed_ahead.labels(holder="here" if here else "other").inc()
        log.info(
            "placing a waiting pod first",
            extra={
                "pod_uid": uid,
                "holder": posted.waiting.holder,
                "ahead_of": before.pod.uid,
            },
        )
        self._start(item)

    # --- the board -----------------------------------------------------------------------------

    async def _post(self, item: HeldPod) -> None:
        """Post ``item`` (held waiting here) on the board, unless it is posted as it is."""
        shell = self._shell
        uid = item.pod.uid
        posted = shell.board.get(uid)
        me = shell.config.placer_id
        if posted is not None and posted.waiting.holder == me and posted.waiting.pod == item.pod:
            return
        now = shell.clock.now()
        waiting = WaitingPod(
            pod=item.pod,
            holder=me,
            since=posted.waiting.since if posted is not None else now,
            updated_at=now,
        )
        try:
            revision = await shell.bus.kv_put(
                subjects.KV_WAITING, subjects.waiting_key(uid), codec.encode(waiting)
            )
        except Exception as error:  # only the order across replicas is weaker until the next try
            log.warning(
                "cannot post a waiting pod on the board",
                extra={"pod_uid": uid, "error": f"{type(error).__name__}: {error}"},
            )
            return
        shell.board.put(waiting, revision)
        if self._held.items.get(uid) is not item or item.stage != "waiting":
            self.unpost(uid)  # placed or gone meanwhile

    def unpost(self, uid: str) -> None:
        """Take ``uid``'s board entry off, if there is one (at the revision seen: a newer post is
        kept). Whoever places or releases a pod does, and its holder when it sees the claim."""
        shell = self._shell
        posted = shell.board.get(uid)
        if posted is None:
            return

        async def delete() -> None:
            try:
                key = subjects.waiting_key(posted.uid)
                deleted = await shell.bus.kv_delete_if(
                    subjects.KV_WAITING, key, revision=posted.revision
                )
            except Exception:  # the sweep takes it off later
                return
            if deleted is not None:
                shell.board.remove(posted.uid, before=posted.revision + 1)

        shell.tasks.spawn(delete(), f"unpost-{uid}")

    def sweep_board(self) -> None:
        """Take off entries of pods placed or deleted (their holder stopped before it could)."""
        shell = self._shell
        now = shell.clock.now()
        for posted in shell.board.posted():
            claim = shell.view.claim(posted.uid)
            if claim is None or claim.state == "requeued":
                continue
            if now - max(posted.waiting.updated_at, claim.updated_at) >= BOARD_SWEEP_GRACE_S:
                self.unpost(posted.uid)

    # --- rejections ----------------------------------------------------------------------------

    async def reject(self, item: HeldPod, waiting: Waiting) -> None:
        """Publish why the pod does not fit (when that changed); keep it waiting or let it go."""
        shell, held = self._shell, self._held
        pod = item.pod
        rejection = waiting.rejection
        message = translate.rejection_message(
            pod,
            rejection.reasons,
            nodes=len(shell.view.everywhere()),
            unresolvable=rejection.unresolvable,
            decided_at=shell.clock.now(),
            placer_id=shell.config.placer_id,
        )
        try:
            if message.message != item.last_message:
                sequence = item.deliveries[0].sequence if item.deliveries else 0
                await shell.bus.js_publish(
                    subjects.PLACEMENTS_REJECTED,
                    codec.encode(message),
                    msg_id=f"rejected.{pod.uid}.{sequence}.{item.rejections}",
                )
                item.rejections += 1
                item.last_message = message.message
                outcome = "unresolvable" if rejection.unresolvable else "rejected"
                shell.metrics.decisions.labels(outcome=outcome).inc()
                log.info(
                    "pod rejected",
                    extra={
                        "pod": f"{pod.namespace}/{pod.name}",
                        "pod_uid": pod.uid,
                        "reasons": message.message,
                        "unresolvable": rejection.unresolvable,
                        "waits_for": "nothing" if waiting.final else waiting.wake,
                    },
                )
            if not item.answered:
                item.answered = True
                shell.metrics.latency.observe(shell.clock.monotonic() - item.received)
        except Exception as error:
            log.warning(
                "cannot publish a rejection; the pod message comes back",
                extra={"pod_uid": pod.uid, "error": f"{type(error).__name__}: {error}"},
            )
            await held.give_back(item, delay=1.0)
            return
        held.remember(
            Outcome(
                pod_uid=pod.uid,
                outcome="unresolvable" if rejection.unresolvable else "waiting",
                reasons=tuple((r.reason, r.nodes) for r in rejection.reasons),
                message=message.message,
                at=shell.clock.now(),
                request=item.request,
            )
        )
        if waiting.final:
            held.let_go(item)
            await held.ack(item.deliveries)
            return
        item.wake = waiting.wake
        item.backoff = min(BACKOFF_MAX_S, max(BACKOFF_MIN_S, item.backoff * 2))
        if held.items.get(pod.uid) is item and item.stage == "waiting":
            await self._post(item)

    def answer_unplaced(self, item: HeldPod, waiting: Waiting) -> None:
        """A pod placed through :meth:`PlacerService.place` does not fit where asked: answer why
        and keep nothing (nothing is published either: kube-scheduler explains the pod itself
        and schedules it again by itself)."""
        shell, held = self._shell, self._held
        rejection = waiting.rejection
        uid = item.pod.uid
        if held.items.get(uid) is item:
            del held.items[uid]
        outcome = "unresolvable" if rejection.unresolvable else "rejected"
        shell.metrics.decisions.labels(outcome=outcome).inc()
        reasons = tuple((r.reason, r.nodes) for r in rejection.reasons)
        answer = Outcome(
            pod_uid=uid,
            outcome="unresolvable" if rejection.unresolvable else "waiting",
            node=item.only_node or "",
            reasons=reasons,
            message="; ".join(reason for reason, _ in reasons),
            at=shell.clock.now(),
            request=item.request,
        )
        held.remember(answer)
        held.resolve(item, answer)
        log.info(
            "pod does not fit where kube-scheduler chose",
            extra={
                "pod": f"{item.pod.namespace}/{item.pod.name}",
                "pod_uid": uid,
                "node": item.only_node,
                "reasons": answer.message,
            },
        )

    async def retry_loop(self) -> None:
        """Put waiting pods back in the queue when something that could let them fit changed."""
        shell, held = self._shell, self._held
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(REFRESH_S):
                    await shell.changed.wait()
            shell.changed.clear()
            now = shell.clock.monotonic()
            if held.waiting:  # other pools' nodes move the counters only once derived
                shell.view.everywhere()
            freed, grown, relabelled, placed = shell.counters()
            for item in list(held.waiting.values()):
                seen = item.seen
                room = item.wake != "grown" and (freed != seen[0] or relabelled != seen[2])
                changed = grown != seen[1] or room or (item.wake == "placed" and placed != seen[3])
                due = now - item.tried >= item.backoff
                if (changed and due) or now - item.tried >= SAFETY_RETRY_S:
                    held.enqueue(item)
            held.count_pending()
            shell.metrics.waiting_scans.inc()
