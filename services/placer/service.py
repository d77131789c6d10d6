"""The placer's shell: NATS in, the pure core, KV commits and NATS out (issue 10).

One placer replica: this module wires the shell's jobs (``services/placer/shell/``: held pods,
KV watches, pods in, the waiting board, releases, upkeep, explain) and runs the
decide-and-commit loop: pods decided one at a time on the view, committed concurrently through
:class:`~.protocol.CommitProtocol`. How it all fits together (inputs, the commit protocol,
order across replicas, waiting pods, releases, telemetry, the extender): ``docs/architecture.md``,
section "The placer's shell".
"""

from __future__ import annotations

import asyncio
import gc
import logging
import secrets
import socket
from collections.abc import Callable

from services.placer.core.framework import Profile
from services.placer.core.model import ClusterSnapshot, Decision
from services.placer.core.queue import PlacementQueue, reference_node
from services.placer.extender import Extender, listen
from services.placer.metrics import PlacerMetrics
from services.placer.protocol import CommitProtocol
from services.placer.rules import decider, translate
from services.placer.rules.decider import Waiting
from services.placer.rules.state import ClusterView
from services.placer.shell.context import MAX_IN_FLIGHT, PlacerConfig, Shell
from services.placer.shell.explainer import Explainer
from services.placer.shell.held import BACKOFF_MAX_S, Held, HeldPod, Outcome
from services.placer.shell.intake import Intake
from services.placer.shell.poolleases import PoolKeeper
from services.placer.shell.releases import Releases
from services.placer.shell.upkeep import Upkeep
from services.placer.shell.waiting import WaitingPods
from services.placer.shell.watches import Watches
from services.placer.writes import Store
from shared import subjects
from shared.clock import Clock
from shared.messages.ledger import Booking
from shared.messages.pods import PodPending
from shared.runtime.bus import Bus
from shared.runtime.edge import Edge
from shared.runtime.health import HttpRoutes, Readiness
from shared.runtime.lifecycle import ServiceContext
from shared.runtime.tasks import finish

__all__ = ["Outcome", "PlacerConfig", "PlacerService", "run_placer"]

log = logging.getLogger(__name__)

CONTENDED_S = 0.5
"""How long this replica keeps new decisions off a node after losing a commit on it."""


class PlacerService:
    """One placer replica: its jobs wired together, and the decide-and-commit loop."""

    def __init__(
        self,
        *,
        config: PlacerConfig,
        bus: Bus,
        edge: Edge,
        clock: Clock,
        metrics: PlacerMetrics,
        readiness: Readiness,
    ) -> None:
        self.config = config
        self.clock = clock
        self.metrics = metrics
        self.readiness = readiness
        self.view = ClusterView(
            inventory_stale_s=config.inventory_stale_s,
            task_mix_window=config.task_mix_window,
            tenancy=config.tenancy,
            pools=config.pools,
        )
        store = Store(
            bus=bus,
            edge=edge,
            view=self.view,
            clock=clock,
            metrics=metrics,
            claims_with_bookings=config.claims_with_bookings,
        )
        protocol = CommitProtocol(
            store=store,
            bus=bus,
            view=self.view,
            clock=clock,
            metrics=metrics,
        )
        self.shell = shell = Shell(
            config=config,
            bus=bus,
            edge=edge,
            clock=clock,
            metrics=metrics,
            view=self.view,
            store=store,
            protocol=protocol,
        )
        self.protocol = protocol
        self.tasks = shell.tasks
        self.held = held = Held(shell=shell)
        self.waiting = WaitingPods(
            shell=shell, held=held, decide=self._decide, start=self._start_without_look_ahead
        )
        self.watches = Watches(shell=shell, held=held, waiting=self.waiting)
        self.releases = Releases(shell=shell, held=held, waiting=self.waiting)
        self.release_requeue = self.releases.release_requeue
        """Give a placement back and place the pod again (the extender's)."""
        self.pools = PoolKeeper(shell=shell) if config.pools > 1 else None
        """The node pools' leases (``--pools`` above 1)."""
        self.intake = Intake(
            shell=shell,
            held=held,
            releases=self.releases,
            holding=self.pools.holding if self.pools is not None else None,
        )
        self.upkeep = Upkeep(shell=shell, held=held, waiting=self.waiting)
        self.explainer = Explainer(shell=shell, held=held)
        self._in_flight = 0
        self._contended: dict[str, float] = {}
        """Node -> until when (monotonic) decisions avoid it after a lost commit there."""
        self.loaded = False
        """Every bucket loaded and reconciled: decisions (and the extender's answers) may run."""
        self.extender_port: int | None = None
        """Where the extender listens, once it does."""
        readiness.set("state", False, "loading inventory, nodes, ledger, claims and records")
        readiness.probe("store", self._store_check)

    @property
    def profile(self) -> Profile | None:
        """The compiled profile; None until the view is loaded."""
        return self.shell.profile

    # --- running -------------------------------------------------------------------------------

    async def run(self, routes: HttpRoutes | None = None) -> None:
        """Load, reconcile, then serve until cancelled."""
        shell = self.shell
        try:
            async with asyncio.TaskGroup() as group:
                for follow in self.watches.follows():
                    group.create_task(self.watches.follow(follow))
                if self.pools is not None:
                    group.create_task(self.pools.follow(), name="pool entries")
                await shell.store.convert_legacy_ledgers()
                await self.watches.all_loaded()
                self.view.finish_load(shell.clock.now())
                self.held.queue = PlacementQueue(
                    reference=reference_node(ClusterSnapshot(nodes=tuple(self.view.everywhere())))
                )
                shell.board.rekey(self.held.queue.reference)
                self.upkeep.rebuild_profile()
                if shell.restored:  # else once the binder restored the store (``upkeep``)
                    await shell.protocol.reconcile(grace_s=self.config.reconcile_interval_s / 2)
                if self.pools is not None:
                    await self.pools.keep()  # ready with its share of the pools, when free
                    group.create_task(self.pools.run(), name="pools")
                log.info(
                    "placer ready",
                    extra={
                        "nodes": self.view.node_count(),
                        "claims": len(self.view.claims),
                        "records": len(self.view.records),
                        "profile": self.config.profile_name,
                    },
                )
                # Everything loaded so far lives as long as the placer: keep the garbage
                # collector from walking it again and again (its full passes are the main
                # source of pauses in a process holding a large cluster).
                gc.collect()
                gc.freeze()
                self.loaded = True
                self.readiness.set("state", True)
                if routes is not None:
                    routes.get("/v1/pods/{uid}", self.explainer.route)
                # Every replica listens (no queue group): those that know the pod answer.
                await shell.bus.subscribe(subjects.PLACER_EXPLAIN, self.explainer.on_request)
                for loop in (
                    self.intake.consume_pods,
                    self.releases.consume_bindings,
                    self._place_loop,
                    self.waiting.retry_loop,
                    self.held.heartbeat_loop,
                    self.upkeep.refresh_loop,
                    self.releases.timeout_loop,
                    self.releases.purge_loop,
                    self.upkeep.reconcile_loop,
                    self.upkeep.mix_loop,
                    self.upkeep.tenancy_loop,
                    self.upkeep.stats_loop,
                ):
                    group.create_task(loop(), name=loop.__name__)
        finally:
            self.loaded = False
            shell.tasks.cancel_all()
            await finish(self.held.give_back_all())
            if self.pools is not None:
                await finish(self.pools.give_back_all())

    def _store_check(self) -> tuple[bool, str]:
        if self.shell.restored:
            return True, ""
        if self.loaded and not self.shell.current:
            return False, "loading the new NATS store into the view (NATS lost its store)"
        return False, (
            f"waiting for the binder to restore the placements of bound pods into this NATS "
            f"store (epoch {self.shell.bus.store_epoch or '?'}); is a binder running?"
        )

    # --- deciding ------------------------------------------------------------------------------

    async def _place_loop(self) -> None:
        while True:
            await self.shell.work.wait()
            self.shell.work.clear()
            while self.held.direct:
                invalid = self.held.direct.pop()
                if self.held.items.get(invalid.pod.uid) is invalid and invalid.stage == "queued":
                    self._start(invalid)
            while self.shell.restored and len(self.held.queue) and self._in_flight < MAX_IN_FLIGHT:
                entry = self.held.queue.pop()
                if entry is None:
                    break
                item = self.held.items.get(entry.uid)
                if item is None or item.stage != "queued":
                    continue
                self._start(item)
                await asyncio.sleep(0)  # let commits and deliveries progress

    def _start(self, item: HeldPod, *, look_ahead: bool = True) -> None:
        """Decide ``item`` now (synchronously, on the view) and set its commit going.

        ``look_ahead``: place first the board's waiting pods ordered before it that fit now.
        """
        uid = item.pod.uid
        self.upkeep.follow_node_kinds()
        claim = self.view.claim(uid)
        if claim is not None and claim.state == "placed" and claim.booking is not None:
            del self.held.items[uid]
            self.tasks.spawn(
                self.held.finish_placed(claim.booking, item.deliveries), f"placed-{uid}"
            )
            already = Outcome(
                pod_uid=uid,
                outcome="duplicate",
                node=claim.booking.node,
                booking=claim.booking,
                message=f"placed on {claim.booking.node} by commit {claim.booking.commit}",
                at=self.clock.now(),
            )
            self.held.resolve(item, already)
            return
        if claim is not None and claim.state == "deleted":
            del self.held.items[uid]
            self.tasks.spawn(self.held.ack(item.deliveries), f"ack-{uid}")
            deleted = Outcome(
                pod_uid=uid, outcome="deleted", message=claim.reason, at=self.clock.now()
            )
            self.held.resolve(item, deleted)
            return
        booked = self.view.bookings_of(uid)
        if booked and claim is None:
            # Booked by a commit that stopped before its claim: finish that one.
            item.stage = "committing"
            self._in_flight += 1
            self.tasks.spawn(self._commit(item, booked[0], None, book=False), f"finish-{uid}")
            return
        assert self.shell.profile is not None
        now = self.clock.now()
        item.tried = self.clock.monotonic()
        item.seen = self.shell.counters()
        key = item.request.placement_key()
        if self.shell.failed_at != item.seen[:3]:
            self.shell.failed_at, self.shell.failed_keys = item.seen[:3], {}
        counts_pods = item.request.counts_pods  # its fit moves with every pod placed: not kept
        known = self.shell.failed_keys.get(key) if item.rejections and not counts_pods else None
        self.metrics.tries.inc()
        self.shell.decisions += 1
        try:
            outcome = self._decide(item, known, now)
            if look_ahead and isinstance(outcome, Decision):
                outcome = self.waiting.place_ahead_of(item, outcome, now)
        except Exception:  # a bug in the core must not stop the placer for every pod
            log.exception("deciding a pod failed", extra={"pod_uid": uid})
            self.metrics.commit_failures.labels(cause="bug").inc()
            self.tasks.spawn(self.held.give_back(item, delay=BACKOFF_MAX_S), f"giveback-{uid}")
            return
        if isinstance(outcome, Waiting) and item.adopted and not item.deliveries:
            del self.held.items[uid]  # its holder keeps it waiting
            return
        if isinstance(outcome, Waiting):
            if item.result is not None:  # the extender's: answered, never held
                self.waiting.answer_unplaced(item, outcome)
                return
            if not counts_pods:
                self.shell.failed_keys[key] = outcome
            item.stage = "waiting"
            self.held.waiting[uid] = item
            self.tasks.spawn(self.waiting.reject(item, outcome), f"reject-{uid}")
            return
        booking = translate.booking_of(
            outcome.reservation,
            item.pod,
            tenant=self.view.tenancy.tenant_of(item.request).tenant,
            commit=f"{self.config.placer_id}.{secrets.token_hex(6)}",
            decided_at=now,
            placer_id=self.config.placer_id,
        )
        if not self.view.owns(booking.node):
            self.metrics.pool_fallbacks.inc()
        ledger, _ = self.view.ledger(booking.node)
        seen = self.view.tentative_commits(booking.node).union(
            b.commit for b in (ledger.bookings if ledger else ())
        )
        self.view.add_tentative(booking)
        item.stage = "committing"
        self._in_flight += 1
        self.tasks.spawn(self._commit(item, booking, outcome, seen=seen), f"commit-{uid}")

    def _start_without_look_ahead(self, item: HeldPod) -> None:
        self._start(item, look_ahead=False)

    def _decide(self, item: HeldPod, known: Waiting | None, now: float) -> Decision | Waiting:
        assert self.shell.profile is not None
        if item.only_node is not None:
            return decider.decide_on(
                self.view, self.shell.profile, item.request, item.only_node, now=now
            )
        return known or decider.decide(
            self.view,
            self.shell.profile,
            item.request,
            now=now,
            avoid=self._avoided(item),
            spread=self.shell.config.burst_spread,
        )

    def _avoided(self, item: HeldPod) -> set[str]:
        """Nodes this pod lost a commit on, and nodes where this replica lost one lately: while
        another replica is packing a node, deciding other pods onto it only loses again."""
        now = self.clock.monotonic()
        if self._contended and len(self._contended) > 64:
            self._contended = {n: t for n, t in self._contended.items() if t > now}
        recent = {n for n, until in self._contended.items() if until > now}
        return item.avoid | recent if recent else item.avoid

    async def _commit(
        self,
        item: HeldPod,
        booking: Booking,
        decision: Decision | None,
        *,
        book: bool = True,
        seen: frozenset[str] | None = None,
    ) -> None:
        """Commit ``booking`` (``book``: it is not in the ledger yet; ``seen``: the bookings its
        decision counted on its node, so that a decision made on a state that is gone is made
        again)."""
        uid = booking.pod_uid
        try:
            refusal, why = (
                await self.protocol.book(booking, request=item.pod, seen=seen) if book else ("", "")
            )
            if refusal:
                self.view.drop_tentative(booking.node, uid)
                if refusal == "node":
                    item.avoid.add(booking.node)
                    self._contended[booking.node] = self.clock.monotonic() + CONTENDED_S
                # else another commit filled the quota first: decided again, the pod waits
                self.held.retry(item, why)
                return
            outcome, placed = await self.protocol.finish(booking, item.pod)
            await self.held.ack(item.deliveries)
            if self.held.items.get(uid) is item:
                del self.held.items[uid]
            self.waiting.unpost(uid)
            self.held.placed(item, outcome, placed, decision if placed is booking else None)
        except Exception as error:  # NATS failed mid-commit: what landed is found again later
            self.view.drop_tentative(booking.node, uid)
            self.metrics.commit_failures.labels(cause="nats").inc()
            log.warning(
                "commit interrupted; the pod message comes back",
                extra={
                    "pod_uid": uid,
                    "node": booking.node,
                    "error": f"{type(error).__name__}: {error}",
                },
            )
            await self.held.give_back(item, delay=1.0)
        finally:
            self._in_flight -= 1
            self.shell.work.set()

    async def place(self, pod: PodPending, *, node: str | None = None) -> Outcome:
        """Decide ``pod`` now (on ``node`` only, when given) and commit it like any other pod.

        For the scheduler extender (issue 14): the answer comes once the decision is committed
        and published, or the rejection published; a pod that does not fit is not kept.
        """
        if pod.uid in self.held.items:
            raise ValueError(f"pod {pod.uid} is already being placed")
        item = HeldPod(
            pod=pod,
            request=translate.pod_request(pod),
            deliveries=[],
            received=self.clock.monotonic(),
            result=asyncio.get_running_loop().create_future(),
            only_node=node,
        )
        self.held.items[pod.uid] = item
        self.held.enqueue(item)
        assert item.result is not None
        return await item.result


async def run_placer(
    context: ServiceContext,
    config: PlacerConfig,
    *,
    started: Callable[[PlacerService], None] | None = None,
    extender_listener: socket.socket | None = None,
) -> None:
    """The service body: run the placer until cancelled (``started`` sees the service first).

    ``extender_listener``: the extender's socket, already bound (else bound here when
    ``config.extender_port`` asks for the extender)."""
    service = PlacerService(
        config=config,
        bus=context.bus,
        edge=context.edge,
        clock=context.clock,
        metrics=PlacerMetrics.create(context.registry),
        readiness=context.readiness,
    )
    extender = (
        Extender(
            service=service,
            bus=context.bus,
            edge=context.edge,
            clock=context.clock,
            metrics=service.metrics,
            bind_timeout_s=config.extender_bind_timeout_s,
        )
        if config.extender_port
        else None
    )
    if started is not None:
        started(service)
    log.info(
        "placer starting",
        extra={
            "placer_id": config.placer_id,
            "profile": config.profile_name,
            "tenancy_file": config.tenancy_file or None,
        },
    )
    if extender is None:
        await service.run(context.routes)
        return
    listener = extender_listener or listen(config.extender_host, config.extender_port)
    service.extender_port = await extender.start(listener)
    log.info(
        "extender listening",
        extra={
            "extender_port": service.extender_port,
            "bind_timeout_s": config.extender_bind_timeout_s,
        },
    )
    try:
        await service.run(context.routes)
    finally:
        await extender.stop()
