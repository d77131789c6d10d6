"""The pods one placer replica holds: their messages, the order they are decided in, the ones
waiting, and the last outcome of each pod (for ``tessera explain`` and the extender)."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Literal

import msgspec

from services.placer.core.model import Decision, PodRequest, Rejection
from services.placer.core.queue import PlacementQueue
from services.placer.rules import decider
from services.placer.shell.context import Shell, log
from shared.messages.ledger import Booking, PodClaim
from shared.messages.pods import PodPending
from shared.runtime.bus import Delivery

BACKOFF_MIN_S = 0.5
BACKOFF_MAX_S = 10.0
RETRY_LATER_S = 0.5
"""Delay before a pod whose commit kept losing comes back (doubled at most, at random)."""
EXPLAINED_PODS = 10_000
"""Last outcomes kept for ``GET /v1/pods/{uid}``."""

Stage = Literal["queued", "committing", "waiting"]


class Outcome(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """What became of a pod (``GET /v1/pods/{uid}`` and the extender's answer)."""

    pod_uid: str
    outcome: str
    """placed, waiting, unresolvable, duplicate, deleted, failed."""
    node: str = ""
    booking: Booking | None = None
    score: float = 0.0
    scores: dict[str, float] = {}
    reasons: tuple[tuple[str, int], ...] = ()
    message: str = ""
    at: float = 0.0
    request: PodRequest | None = None


@dataclass
class HeldPod:
    """A pod this replica holds, with every message of it it received."""

    pod: PodPending
    request: PodRequest
    deliveries: list[Delivery]
    received: float
    """Monotonic time the first message arrived (decision latency starts here)."""
    stage: Stage = "queued"
    attempts: int = 0
    wake: decider.Wake = "freed"
    seen: tuple[int, int, int, int] = (0, 0, 0, 0)
    """The shell's change counters (``Shell.counters``) when it was last tried."""
    tried: float = 0.0
    backoff: float = BACKOFF_MIN_S
    last_message: str = ""
    rejections: int = 0
    answered: bool = False
    """A decision or rejection was published (latency observed)."""
    result: asyncio.Future[Outcome] | None = None
    """Set for a pod placed through :meth:`PlacerService.place` (answered, never held)."""
    only_node: str | None = None
    adopted: bool = False
    """A pod another replica holds waiting, placed here first (from the board): its message is
    not held here, so it is never kept waiting or retried here."""
    avoid: set[str] = field(default_factory=set)
    """Nodes where a commit of this pod lost to another writer: decided away from them."""


class Held:
    """The pods this replica holds (by UID), the queue that orders them, and what became of
    the pods it decided lately."""

    def __init__(self, *, shell: Shell) -> None:
        self._shell = shell
        self.items: dict[str, HeldPod] = {}
        self.waiting: dict[str, HeldPod] = {}
        self.queue = PlacementQueue()
        self.direct: list[HeldPod] = []
        """Pods the queue refused to order (invalid): decided at once, to be rejected."""
        self.outcomes: OrderedDict[str, Outcome] = OrderedDict()
        self._pending_shown: dict[str, int] = {}
        depth = shell.metrics.queue_depth
        self._depth_waiting = depth.labels(stage="waiting")
        self._depth_deciding = depth.labels(stage="deciding")

    def enqueue(self, item: HeldPod) -> None:
        """Queue ``item`` to be decided (again)."""
        self.waiting.pop(item.pod.uid, None)
        item.stage = "queued"
        queued = self.queue.push(
            item.request,
            priority_label=item.pod.hints.priority_label,
            created_at=item.pod.created_at,
        )
        if isinstance(queued, Rejection):
            self.direct.append(item)
        self._shell.work.set()

    def let_go(self, item: HeldPod) -> None:
        """Hold ``item`` no more (when it is still the one held under its UID)."""
        if self.items.get(item.pod.uid) is item:
            del self.items[item.pod.uid]
        self.waiting.pop(item.pod.uid, None)

    def remember(self, outcome: Outcome) -> None:
        self.outcomes[outcome.pod_uid] = outcome
        self.outcomes.move_to_end(outcome.pod_uid)
        while len(self.outcomes) > EXPLAINED_PODS:
            self.outcomes.popitem(last=False)

    @staticmethod
    def resolve(item: HeldPod, outcome: Outcome) -> None:
        """Answer :meth:`PlacerService.place` for ``item`` (once; nothing for a pod from the
        queue)."""
        if item.result is not None and not item.result.done():
            item.result.set_result(outcome)

    @staticmethod
    async def ack(deliveries: list[Delivery]) -> None:
        for delivery in deliveries:
            with contextlib.suppress(Exception):  # an ack that is lost means a harmless redelivery
                await delivery.ack()

    async def give_back(self, item: HeldPod, *, delay: float) -> None:
        """Let ``item`` go and hand its messages back to JetStream after ``delay``."""
        self.let_go(item)
        self.resolve(
            item,
            Outcome(
                pod_uid=item.pod.uid,
                outcome="failed",
                message="the commit kept losing to other writers or NATS failed; try again",
                at=self._shell.clock.now(),
            ),
        )
        for delivery in item.deliveries:
            with contextlib.suppress(Exception):
                await delivery.nak(delay)

    async def give_back_all(self) -> None:
        """On stop: nak every held pod message so another replica takes it at once."""
        held = [d for item in self.items.values() for d in item.deliveries]
        for item in self.items.values():
            self.resolve(
                item, Outcome(pod_uid=item.pod.uid, outcome="failed", message="placer stopping")
            )
        self.items.clear()
        self.waiting.clear()
        if held:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(3.0):
                    await asyncio.gather(*(d.nak(None) for d in held), return_exceptions=True)
            log.info("handed back held pods", extra={"messages": len(held)})

    async def finish_placed(self, booking: Booking, deliveries: list[Delivery]) -> None:
        """Ack the messages of a pod placed already (by ``booking``), once it is booked. One
        that cannot be booked again now (after NATS lost its store, a node's inventory may not
        be back yet) is handed back to come again later: acked, its pod would be neither booked
        nor placed again."""
        try:
            refused = await self._shell.protocol.keep_booked(booking)
        except Exception as error:
            refused = f"{type(error).__name__}: {error}"
        if refused:
            log.warning(
                "cannot finish an already placed pod yet; its message comes back",
                extra={"pod_uid": booking.pod_uid, "error": refused},
            )
            for delivery in deliveries:
                with contextlib.suppress(Exception):
                    await delivery.nak(1.0)
            return
        self._shell.metrics.decisions.labels(outcome="duplicate").inc()
        await self.ack(deliveries)

    def retry(self, item: HeldPod, why: str) -> None:
        """Decide ``item`` again after its commit was refused (``why``), or, once it was
        refused too often, hand its message back for later."""
        shell = self._shell
        if item.adopted and not item.deliveries:  # its holder keeps it
            if self.items.get(item.pod.uid) is item:
                del self.items[item.pod.uid]
            return
        item.attempts += 1
        shell.metrics.retries.inc()
        if item.attempts > shell.config.max_commit_retries:
            shell.metrics.commit_failures.labels(cause="retries").inc()
            log.warning(
                "commit retries exhausted; the pod message comes back later",
                extra={"pod_uid": item.pod.uid, "attempts": item.attempts, "reason": why},
            )
            delay = RETRY_LATER_S * (1 + random.random())  # jittered: replicas fall out of step
            shell.tasks.spawn(self.give_back(item, delay=delay), f"giveback-{item.pod.uid}")
            return
        if self.items.get(item.pod.uid) is item:
            self.enqueue(item)

    def placed(
        self, item: HeldPod, outcome: str, booking: Booking, decision: Decision | None
    ) -> None:
        """Count, log, remember and answer ``item`` placed by ``booking`` (``outcome``: placed,
        or found placed already)."""
        shell = self._shell
        elapsed = shell.clock.monotonic() - item.received
        if not item.answered:
            item.answered = True
            shell.metrics.latency.observe(elapsed)
        shell.metrics.decisions.labels(outcome=outcome).inc()
        gpus = [
            f"{s.uuid}:{s.memory_mib}MiB:{s.core_milli // 10}%"
            for c in booking.containers
            for s in c.gpus
        ]
        log.info(
            "pod placed" if outcome == "placed" else f"pod {outcome}",
            extra={
                "pod": f"{item.pod.namespace}/{item.pod.name}",
                "pod_uid": item.pod.uid,
                "node": booking.node,
                "gpus": gpus,
                "score": round(decision.score, 3) if decision else None,
                "feasible_nodes": decision.feasible_nodes if decision else None,
                "attempts": item.attempts + 1,
                "latency_ms": round(elapsed * 1000, 2),
                "commit": booking.commit,
            },
        )
        self.remember(
            Outcome(
                pod_uid=item.pod.uid,
                outcome=outcome,
                node=booking.node,
                booking=booking,
                score=decision.score if decision else 0.0,
                scores=dict(decision.scores) if decision else {},
                at=shell.clock.now(),
                request=item.request,
            )
        )
        self.resolve(item, self.outcomes[item.pod.uid])

    def claimed_elsewhere(self, pod_uid: str, claim: PodClaim) -> None:
        """A claim appeared for a pod held waiting here: it was placed or deleted elsewhere."""
        item = self.items.get(pod_uid)
        if item is None or item.stage != "waiting":
            return
        del self.items[pod_uid]
        self.waiting.pop(pod_uid, None)
        self.queue.remove(pod_uid)
        tasks = self._shell.tasks
        if claim.state == "placed" and claim.booking is not None:
            tasks.spawn(self.finish_placed(claim.booking, item.deliveries), f"placed-{pod_uid}")
        else:
            tasks.spawn(self.ack(item.deliveries), f"ack-{pod_uid}")

    async def heartbeat_loop(self) -> None:
        """Keep every held message in progress so JetStream does not hand it to another replica."""
        while True:
            await self._shell.clock.sleep(max(0.2, self._shell.config.ack_wait_s / 3))
            held = [d for item in list(self.items.values()) for d in item.deliveries]
            for start in range(0, len(held), 500):
                await asyncio.gather(
                    *(d.in_progress() for d in held[start : start + 500]), return_exceptions=True
                )

    def count_pending(self) -> None:
        """Set the gauges of waiting pods (by their first reason) and of pods being decided."""
        metrics = self._shell.metrics
        by_reason: dict[str, int] = {}
        for item in self.waiting.values():
            outcome = self.outcomes.get(item.pod.uid)
            reason = outcome.reasons[0][0] if outcome and outcome.reasons else "unknown"
            by_reason[reason] = by_reason.get(reason, 0) + 1
        # Set again only when it changed: the retry loop counts at every change of the view,
        # hundreds of times a second under a steady stream of pods, nearly always none waiting.
        if by_reason != self._pending_shown:
            metrics.pending.clear()
            for reason, count in by_reason.items():
                metrics.pending.labels(reason=reason).set(count)
            self._pending_shown = by_reason
        self._depth_waiting.set(len(self.waiting))
        self._depth_deciding.set(len(self.items) - len(self.waiting))
