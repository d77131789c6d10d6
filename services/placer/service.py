"""The placer's shell: NATS in, the pure core, KV commits and NATS out (issue 10).

Wiring and the decide-and-commit loop of one placer replica: KV watches into the
:class:`~.state.ClusterView`, pods from the shared durable consumer, decisions from the core,
commits through :class:`~.protocol.CommitProtocol`, waiting pods held and posted on the board,
releases, upkeep and ``tessera explain``. How it all fits together (inputs, the commit protocol,
order across replicas, waiting pods, releases, telemetry, the extender): ``docs/architecture.md``,
section "The placer's shell".
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import random
import secrets
import socket
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import msgspec
from aiohttp import web

from services.placer import board, decider, mix, stats, translate
from services.placer.board import Posted, WaitingBoard
from services.placer.config import ConfigFileError, parse_tenancy
from services.placer.core.fragmentation import FragmentationModel, TypicalTask
from services.placer.core.framework import Profile
from services.placer.core.groups import TenancyConfig
from services.placer.core.model import ClusterSnapshot, Decision, PodRequest, Rejection
from services.placer.core.profiles import (
    BUILTIN,
    DEFAULT_TYPICAL_TASKS,
    ProfileSpec,
    build_profile,
)
from services.placer.core.queue import PlacementQueue, ReferenceNode, reference_node
from services.placer.decider import Waiting
from services.placer.extender import Extender, listen
from services.placer.metrics import PlacerMetrics
from services.placer.protocol import CommitProtocol
from services.placer.state import ClusterView
from services.placer.store import Store
from shared import codec, subjects
from shared.clock import Clock
from shared.messages.assignments import AssignmentRecord
from shared.messages.bindings import BindingResult
from shared.messages.explain import ExplainReply, ExplainRequest
from shared.messages.inventory import NodeInventory
from shared.messages.ledger import Booking, NodeLedger, PodClaim, TenantLedger
from shared.messages.nodes import NodeFacts
from shared.messages.pods import PodDeleted, PodPending, PodRestore
from shared.messages.store import StoreRestored
from shared.messages.waiting import WaitingPod
from shared.runtime.bus import Bus, Delivery, KvEntry
from shared.runtime.edge import Edge
from shared.runtime.follow import FETCH_BATCH, deliveries
from shared.runtime.follow import follow as shared_follow
from shared.runtime.health import HttpRoutes, Readiness
from shared.runtime.lifecycle import ServiceContext
from shared.runtime.tasks import finish

log = logging.getLogger(__name__)

MAX_IN_FLIGHT = 64
"""Commits one replica runs at once."""
MAX_HELD = 100_000
"""The pod consumer's ``max_ack_pending``: pods held (deciding or waiting) across replicas."""
BACKOFF_MIN_S = 0.5
BACKOFF_MAX_S = 10.0
SAFETY_RETRY_S = 60.0
"""A waiting pod is tried again at least this often, even when nothing seemed to change."""
CONTENDED_S = 0.5
"""How long this replica keeps new decisions off a node after losing a commit on it."""
RETRY_LATER_S = 0.5
"""Delay before a pod whose commit kept losing comes back (doubled at most, at random)."""
MIX_CHECK_S = 5.0
TENANCY_CHECK_S = 2.0
REFRESH_S = 1.0
EXPLAINED_PODS = 10_000
"""Last outcomes kept for ``GET /v1/pods/{uid}``."""
VERDICTS_SHOWN = 20
EXPLAIN_DEFER_S = 0.3
"""A replica not holding a waiting pod answers ``tessera explain`` this much later than the one
holding it, whose answer (with its last rejection) the asker takes first."""
STATS_INTERVAL_S = 10.0
AHEAD_SCAN = 64
"""Board entries ordered before a pod looked at before it commits (``board.first_fitting``)."""
AHEAD_EVALUATIONS = 16
"""Of those, pod shapes decided afresh (the rest are known not to fit since the last freeing)."""
AHEAD_PLACED = 8
"""Waiting pods placed first, at most, before one pod commits."""
BOARD_SWEEP_GRACE_S = 10.0
"""A board entry whose pod is placed or deleted is swept once it is this old."""


@dataclass(frozen=True)
class PlacerConfig:
    """The placer's settings, checked (see ``command.py``)."""

    placer_id: str
    profile: ProfileSpec | str = "tessera"
    tenancy_file: str = ""
    tenancy: TenancyConfig | None = None
    """The tenancy file's content at start (already parsed and checked)."""
    reserve_timeout_s: float = 120.0
    release_retention_s: float = 3600.0
    inventory_stale_s: float = 30.0
    max_commit_retries: int = 8
    task_mix_window: int = mix.WINDOW
    ack_wait_s: float = 30.0
    reconcile_interval_s: float = 30.0
    mix_check_s: float = MIX_CHECK_S
    """How often the learned task mix is compared with the one the profile was compiled with."""
    tenancy_check_s: float = TENANCY_CHECK_S
    """How often the tenancy file is read for a new version."""
    stats_interval_s: float = STATS_INTERVAL_S
    """How often the cluster statistics (``ClusterStats``, for the dashboard) are published."""
    extender_port: int = 0
    """Serve kube-scheduler's extender on this port (0: off)."""
    extender_host: str = "0.0.0.0"
    extender_bind_timeout_s: float = 4.0
    """The extender answers ``bind`` within this (below kube-scheduler's ``httpTimeout``)."""


Stage = Literal["queued", "committing", "waiting"]


@dataclass
class _Item:
    """A pod this replica holds, with every message of it it received."""

    pod: PodPending
    request: PodRequest
    deliveries: list[Delivery]
    received: float
    """Monotonic time the first message arrived (decision latency starts here)."""
    stage: Stage = "queued"
    attempts: int = 0
    wake: decider.Wake = "freed"
    seen: tuple[int, int] = (0, 0)
    """The view's (freed, grown) counters when it was last tried."""
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


class Outcome(msgspec.Struct, frozen=True, kw_only=True):
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


def service_profile(profile: ProfileSpec | str) -> ProfileSpec:
    """The profile as the service runs it: a built-in one breaks ties by a draw seeded by the
    pod's UID instead of by node name, so replicas (and this replica's commits in flight) that
    decide different pods at once spread over equally good nodes instead of all racing for the
    first one; deterministic for a pod, and as good as the simulator's seeded node order. A
    profile file's own ``tie_break`` is kept."""
    if isinstance(profile, ProfileSpec):
        return profile
    spec = BUILTIN[profile]
    return msgspec.structs.replace(spec, tie_break="random")


@dataclass(frozen=True)
class _Follow:
    """One bucket the view follows: how to apply a value, which keys the view holds, how to
    forget one that vanished while no watch ran."""

    bucket: str
    apply: Callable[[KvEntry], Awaitable[None]]
    name: str
    held: Callable[[], set[str]] = set
    forget: Callable[[str], None] = lambda key: None
    durable: bool = False
    """Never deleted by Tessera (ledger, tenants): a vanished entry is forgotten only when NATS
    lost its whole store (a new epoch); the placements it held come back when the binder restores
    them."""


class PlacerService:
    """See the module docstring."""

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
        self.bus = bus
        self.edge = edge
        self.clock = clock
        self.metrics = metrics
        self.readiness = readiness
        self.view = ClusterView(
            inventory_stale_s=config.inventory_stale_s,
            task_mix_window=config.task_mix_window,
            tenancy=config.tenancy,
        )
        self.store = Store(bus=bus, edge=edge, view=self.view, clock=clock, metrics=metrics)
        self.board = WaitingBoard()
        self.protocol = CommitProtocol(
            store=self.store,
            bus=bus,
            view=self.view,
            clock=clock,
            metrics=metrics,
            profile_name=self._profile_name,
        )
        self.profile: Profile | None = None
        self._typical: tuple[Any, ...] | None = None
        self._stats_model: tuple[tuple[TypicalTask, ...], FragmentationModel] | None = None
        self._queue = PlacementQueue()
        self._direct: list[_Item] = []
        """Pods the queue refused to order (invalid): decided at once, to be rejected."""
        self._items: dict[str, _Item] = {}
        self._waiting: dict[str, _Item] = {}
        self._in_flight = 0
        self._work = asyncio.Event()
        self._changed = asyncio.Event()
        self._seen_change = (0, 0)
        self._failed_at: tuple[int, int] = (-1, -1)
        self._failed_keys: dict[PodRequest, Waiting] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._releasing: set[str] = set()
        self._contended: dict[str, float] = {}
        """Node -> until when (monotonic) decisions avoid it after a lost commit there."""
        self._outcomes: OrderedDict[str, Outcome] = OrderedDict()
        self._tenancy_text: bytes | None = None
        self.loaded = False
        """Every bucket loaded and reconciled: decisions (and the extender's answers) may run."""
        self.extender_port: int | None = None
        """Where the extender listens, once it does."""
        readiness.set("state", False, "loading inventory, nodes, ledger, claims and records")
        readiness.probe("store", self._store_check)
        self._restored_epoch = ""

    # --- running -------------------------------------------------------------------------------

    async def run(self, routes: HttpRoutes | None = None) -> None:
        """Load, reconcile, then serve until cancelled."""
        buckets = (
            "inventory",
            "nodes",
            "ledger",
            "claims",
            "records",
            "tenants",
            "waiting",
            "meta",
        )
        loaded = {name: asyncio.Event() for name in buckets}
        try:
            async with asyncio.TaskGroup() as group:
                view = self.view
                follows = (
                    _Follow(
                        subjects.KV_INVENTORY,
                        self._on_inventory,
                        "inventory",
                        view.inventory_keys,
                        view.forget_inventory,
                    ),
                    _Follow(
                        subjects.KV_NODES,
                        self._on_facts,
                        "nodes",
                        view.facts_keys,
                        view.forget_facts,
                    ),
                    _Follow(
                        subjects.KV_LEDGER,
                        self._on_ledger,
                        "ledger",
                        view.ledger_keys,
                        view.forget_ledger,
                        durable=True,
                    ),
                    _Follow(
                        subjects.KV_CLAIMS,
                        self._on_claim,
                        "claims",
                        lambda: set(view.claims),
                        view.forget_claim,
                    ),
                    _Follow(
                        subjects.KV_ASSIGNMENTS,
                        self._on_record,
                        "records",
                        lambda: set(view.records),
                        view.forget_record,
                    ),
                    _Follow(
                        subjects.KV_TENANTS,
                        self._on_tenant,
                        "tenants",
                        view.tenant_keys,
                        view.forget_tenant,
                        durable=True,
                    ),
                    _Follow(
                        subjects.KV_WAITING,
                        self._on_waiting,
                        "waiting",
                        self.board.uids,
                        self._forget_post,
                    ),
                    _Follow(subjects.KV_META, self._on_meta, "meta"),
                )
                for follow in follows:
                    group.create_task(self._follow(follow, loaded[follow.name]))
                await asyncio.gather(*(event.wait() for event in loaded.values()))
                self.view.finish_load(self.clock.now())
                self._queue = PlacementQueue(reference=self._reference())
                self.board.rekey(self._queue.reference)
                self._rebuild_profile()
                await self.protocol.reconcile(grace_s=self.config.reconcile_interval_s / 2)
                log.info(
                    "placer ready",
                    extra={
                        "nodes": self.view.node_count(),
                        "claims": len(self.view.claims),
                        "records": len(self.view.records),
                        "profile": self._profile_name,
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
                    routes.get("/v1/pods/{uid}", self._explain)
                # Every replica listens (no queue group): those that know the pod answer.
                await self.bus.subscribe(subjects.PLACER_EXPLAIN, self._on_explain)
                for loop in (
                    self._consume_pods,
                    self._consume_bindings,
                    self._place_loop,
                    self._retry_loop,
                    self._heartbeat_loop,
                    self._refresh_loop,
                    self._timeout_loop,
                    self._purge_loop,
                    self._reconcile_loop,
                    self._mix_loop,
                    self._tenancy_loop,
                    self._stats_loop,
                ):
                    group.create_task(loop(), name=loop.__name__)
        finally:
            self.loaded = False
            for task in list(self._tasks):
                task.cancel()
            await finish(self._give_back_held())

    @property
    def _profile_name(self) -> str:
        spec = self.config.profile
        return spec if isinstance(spec, str) else spec.name

    def _reference(self) -> ReferenceNode:
        return reference_node(ClusterSnapshot(nodes=tuple(self.view.index)))

    def _spawn(self, work: Coroutine[Any, Any, Any], name: str) -> None:
        task = asyncio.create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("placer task failed", exc_info=task.exception())

    async def _give_back_held(self) -> None:
        """On stop: nak every held pod message so another replica takes it at once."""
        held = [d for item in self._items.values() for d in item.deliveries]
        for item in self._items.values():
            self._resolve(
                item, Outcome(pod_uid=item.pod.uid, outcome="failed", message="placer stopping")
            )
        self._items.clear()
        self._waiting.clear()
        if held:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(3.0):
                    await asyncio.gather(*(d.nak(None) for d in held), return_exceptions=True)
            log.info("handed back held pods", extra={"messages": len(held)})

    # --- KV watches ----------------------------------------------------------------------------

    async def _follow(self, follow: _Follow, loaded: asyncio.Event) -> None:
        """Apply every value of the bucket to the view, forever.

        A watch that ends or fails is started again; its initial values then also tell which
        keys were deleted while no watch ran (``held`` keys it no longer lists are forgotten;
        those of a durable bucket only when the store is a new one).
        """
        epoch = ""

        async def on_entry(entry: KvEntry) -> None:
            await follow.apply(entry)
            self._poke()

        async def on_loaded(listed: set[str]) -> None:
            nonlocal epoch
            lost = epoch != self.bus.store_epoch
            if loaded.is_set() and (lost or not follow.durable):
                for key in follow.held() - listed:
                    follow.forget(key)
            epoch = self.bus.store_epoch
            loaded.set()

        await shared_follow(
            self.bus, follow.bucket, on_entry=on_entry, on_loaded=on_loaded, clock=self.clock
        )

    def _poke(self) -> None:
        """Wake the retry loop when the view's change counters moved."""
        seen = (self.view.freed, self.view.grown)
        if seen != self._seen_change:
            self._seen_change = seen
            self._changed.set()

    async def _decode(self, entry: KvEntry, bucket: str, message: type[Any], family: str) -> Any:
        return await self.edge.accept(_kv_delivery(entry, bucket), message, family=family)

    async def _on_inventory(self, entry: KvEntry) -> None:
        node = subjects.node_from_token(entry.key)
        if entry.deleted:
            self.view.drop_inventory(node)
            return
        inventory = await self._decode(entry, subjects.KV_INVENTORY, NodeInventory, "inventory")
        if not isinstance(inventory, NodeInventory):
            return
        if subjects.node_token(inventory.node) != entry.key:
            await self._reject_entry(entry, subjects.KV_INVENTORY, "inventory", inventory.node)
            return
        problem = self.view.set_inventory(inventory, now=self.clock.now())
        if problem:
            await self.edge.reject(
                _kv_delivery(entry, subjects.KV_INVENTORY),
                family="inventory",
                reason=problem,
                kind="validate",
            )

    async def _on_facts(self, entry: KvEntry) -> None:
        node = subjects.node_from_token(entry.key)
        if entry.deleted:
            self.view.drop_facts(node)
            return
        facts = await self._decode(entry, subjects.KV_NODES, NodeFacts, "nodes")
        if isinstance(facts, NodeFacts):
            if subjects.node_token(facts.node) != entry.key:
                await self._reject_entry(entry, subjects.KV_NODES, "nodes", facts.node)
                return
            self.view.set_facts(facts)

    async def _on_ledger(self, entry: KvEntry) -> None:
        node = subjects.node_from_token(entry.key)
        if entry.revision <= self.view.ledger(node)[1]:
            return  # our own write coming back (or older): nothing new, nothing to decode
        if entry.deleted:
            self.view.set_ledger(node, None, entry.revision)
            return
        ledger = await self._decode(entry, subjects.KV_LEDGER, NodeLedger, "ledger")
        if isinstance(ledger, NodeLedger):
            self.view.set_ledger(ledger.node, ledger, entry.revision)
        else:
            self.view.set_ledger_unreadable(node, entry.revision)

    async def _on_claim(self, entry: KvEntry) -> None:
        if entry.revision <= self.view.claim_revisions.get(entry.key, 0):
            return
        if entry.deleted:
            self.view.set_claim(entry.key, None, entry.revision)
            return
        claim = await self._decode(entry, subjects.KV_CLAIMS, PodClaim, "claims")
        if isinstance(claim, PodClaim):
            self.view.set_claim(claim.pod_uid, claim, entry.revision)
            if claim.state != "requeued":
                self._drop_held(claim.pod_uid, claim)
                posted = self.board.get(claim.pod_uid)
                if posted is not None and posted.waiting.holder == self.config.placer_id:
                    self._unpost(claim.pod_uid)  # placed or deleted by another replica

    async def _on_record(self, entry: KvEntry) -> None:
        known = self.view.records.get(entry.key)
        if known is not None and entry.revision <= known.revision:
            return
        if entry.deleted:
            self.view.set_record(entry.key, None, entry.revision)
            return
        record = await self._decode(entry, subjects.KV_ASSIGNMENTS, AssignmentRecord, "assignments")
        if isinstance(record, AssignmentRecord):
            self.view.set_record(entry.key, record, entry.revision, seen_at=self.clock.now())

    async def _on_tenant(self, entry: KvEntry) -> None:
        if entry.deleted:
            return
        ledger = await self._decode(entry, subjects.KV_TENANTS, TenantLedger, "tenants")
        if isinstance(ledger, TenantLedger):
            if subjects.tenant_key(ledger.tenant) != entry.key:
                await self._reject_entry(entry, subjects.KV_TENANTS, "tenants", ledger.tenant)
                return
            self.view.set_tenant_ledger(ledger, entry.revision)

    async def _on_waiting(self, entry: KvEntry) -> None:
        if entry.deleted:
            self.board.remove(entry.key, before=entry.revision)
            return
        held = self.board.get(entry.key)
        if held is not None and entry.revision <= held.revision:
            return
        waiting = await self._decode(entry, subjects.KV_WAITING, WaitingPod, "waiting")
        if isinstance(waiting, WaitingPod):
            if subjects.waiting_key(waiting.pod.uid) != entry.key:
                await self._reject_entry(entry, subjects.KV_WAITING, "waiting", waiting.pod.uid)
                return
            self.board.put(waiting, entry.revision)

    async def _on_meta(self, entry: KvEntry) -> None:
        if entry.key != subjects.META_RESTORED or entry.deleted:
            return
        restored = await self._decode(entry, subjects.KV_META, StoreRestored, "meta")
        if isinstance(restored, StoreRestored):
            self._restored_epoch = restored.epoch
            if self.restored:
                log.info(
                    "the binder restored what is bound into this store; placing",
                    extra={"epoch": restored.epoch, "pods": restored.pods},
                )
                self._work.set()

    @property
    def restored(self) -> bool:
        """Whether what is bound is in the store (DESIGN section 12): the binder said so for the
        store's epoch. Nothing new is decided before, so no running pod's GPUs go to another."""
        return bool(self.bus.store_epoch) and self._restored_epoch == self.bus.store_epoch

    def _store_check(self) -> tuple[bool, str]:
        if self.restored:
            return True, ""
        return False, (
            f"waiting for the binder to restore the placements of bound pods into this NATS "
            f"store (epoch {self.bus.store_epoch or '?'}); is a binder running?"
        )

    async def _reject_entry(self, entry: KvEntry, bucket: str, family: str, named: str) -> None:
        await self.edge.reject(
            _kv_delivery(entry, bucket),
            family=family,
            reason=f"entry under key {entry.key} names {named!r}",
            kind="validate",
        )

    # --- pods in -------------------------------------------------------------------------------

    async def _consume_pods(self) -> None:
        pods = deliveries(
            self.bus,
            clock=self.clock,
            stream=subjects.STREAM_PODS,
            durable=subjects.DURABLE_PLACER_PODS,
            subject=subjects.PODS_ALL,
            ack_wait=self.config.ack_wait_s,
            max_ack_pending=MAX_HELD,
            room=self._room,
        )
        async with contextlib.aclosing(pods):
            async for delivery in pods:
                if delivery.subject == subjects.PODS_DELETED:
                    deleted = await self.edge.accept(delivery, PodDeleted, family="pods")
                    if deleted is not None:
                        self._spawn(self._on_deleted(deleted, delivery), f"deleted-{deleted.uid}")
                elif delivery.subject == subjects.PODS_PENDING:
                    pod = await self.edge.accept(delivery, PodPending, family="pods")
                    if pod is not None:
                        await self._on_pending(pod, delivery)
                elif delivery.subject == subjects.PODS_RESTORE:
                    restore = await self.edge.accept(delivery, PodRestore, family="pods")
                    if restore is not None:
                        self._spawn(self._restore(restore, delivery), f"restore-{restore.pod.uid}")
                else:
                    await self.edge.reject(
                        delivery,
                        family="pods",
                        reason=f"no pod message is published on {delivery.subject}",
                        kind="subject",
                    )

    async def _room(self) -> int:
        """How many pod messages to fetch now: none while too many are held undecided."""
        while self._busy():
            self._work.set()
            await asyncio.sleep(0.005)
        return FETCH_BATCH

    def _busy(self) -> bool:
        return len(self._items) - len(self._waiting) >= 4 * MAX_IN_FLIGHT

    async def _on_pending(self, pod: PodPending, delivery: Delivery) -> None:
        item = self._items.get(pod.uid)
        if item is not None:  # another message of a pod already held here
            item.deliveries.append(delivery)
            if item.stage == "waiting":  # it may have changed: try it again now
                item.pod, item.request = pod, translate.pod_request(pod)
                self._enqueue(item)
            return
        claim = self.view.claim(pod.uid)
        if claim is not None and claim.state == "deleted":
            self.metrics.decisions.labels(outcome="duplicate").inc()
            await self._ack([delivery])
            return
        item = _Item(
            pod=pod,
            request=translate.pod_request(pod),
            deliveries=[delivery],
            received=self.clock.monotonic(),
        )
        self._items[pod.uid] = item
        self._enqueue(item)

    def _enqueue(self, item: _Item) -> None:
        self._waiting.pop(item.pod.uid, None)
        item.stage = "queued"
        queued = self._queue.push(
            item.request,
            priority_label=item.pod.hints.priority_label,
            created_at=item.pod.created_at,
        )
        if isinstance(queued, Rejection):
            self._direct.append(item)
        self._work.set()

    async def _restore(self, restore: PodRestore, delivery: Delivery) -> None:
        """Book, claim and record a bound pod's placement the store lost (DESIGN section 12)."""
        if restore.epoch != self.bus.store_epoch:  # meant for a store that is gone too
            self.metrics.restores.labels(outcome="other-store").inc()
            await self._ack([delivery])
            return
        try:
            outcome = await self.protocol.restore(restore)
        except Exception as error:  # NATS trouble: it comes back
            log.warning(
                "cannot restore a placement yet",
                extra={"pod_uid": restore.pod.uid, "error": f"{type(error).__name__}: {error}"},
            )
            with contextlib.suppress(Exception):
                await delivery.nak(1.0)
            return
        self.metrics.restores.labels(outcome=outcome).inc()
        log.info(
            "placement restored",
            extra={
                "pod": f"{restore.pod.namespace}/{restore.pod.name}",
                "pod_uid": restore.pod.uid,
                "node": restore.node,
                "state": restore.state,
                "outcome": outcome,
            },
        )
        await self._ack([delivery])

    async def _on_deleted(self, deleted: PodDeleted, delivery: Delivery) -> None:
        try:
            await self.release_deleted(deleted.uid, cause="deleted", reason="pod deleted")
        except Exception as error:
            log.warning(
                "release of a deleted pod failed; it comes back",
                extra={"pod_uid": deleted.uid, "error": f"{type(error).__name__}: {error}"},
            )
            with contextlib.suppress(Exception):
                await delivery.nak(1.0)
            return
        await self._ack([delivery])

    def _drop_held(self, pod_uid: str, claim: PodClaim) -> None:
        """A claim appeared for a pod held waiting here: it was placed or deleted elsewhere."""
        item = self._items.get(pod_uid)
        if item is None or item.stage != "waiting":
            return
        del self._items[pod_uid]
        self._waiting.pop(pod_uid, None)
        self._queue.remove(pod_uid)
        if claim.state == "placed" and claim.booking is not None:
            # Finish it like a redelivery: the placing replica may have stopped before publishing.
            self._spawn(self._republish(claim.booking, item.deliveries), f"republish-{pod_uid}")
        else:
            self._spawn(self._ack(item.deliveries), f"ack-{pod_uid}")

    # --- deciding ------------------------------------------------------------------------------

    async def _place_loop(self) -> None:
        while True:
            await self._work.wait()
            self._work.clear()
            while self._direct:
                invalid = self._direct.pop()
                if self._items.get(invalid.pod.uid) is invalid and invalid.stage == "queued":
                    self._start(invalid)
            while self.restored and len(self._queue) and self._in_flight < MAX_IN_FLIGHT:
                entry = self._queue.pop()
                if entry is None:
                    break
                item = self._items.get(entry.uid)
                if item is None or item.stage != "queued":
                    continue
                self._start(item)
                await asyncio.sleep(0)  # let commits and deliveries progress

    def _start(self, item: _Item, *, look_ahead: bool = True) -> None:
        """Decide ``item`` now (synchronously, on the view) and set its commit going.

        ``look_ahead``: place first the board's waiting pods ordered before it that fit now.
        """
        uid = item.pod.uid
        claim = self.view.claim(uid)
        if claim is not None and claim.state == "placed" and claim.booking is not None:
            del self._items[uid]
            self._spawn(self._republish(claim.booking, item.deliveries), f"republish-{uid}")
            already = Outcome(
                pod_uid=uid,
                outcome="duplicate",
                node=claim.booking.node,
                booking=claim.booking,
                message=f"placed on {claim.booking.node} by commit {claim.booking.commit}",
                at=self.clock.now(),
            )
            self._resolve(item, already)
            return
        if claim is not None and claim.state == "deleted":
            del self._items[uid]
            self._spawn(self._ack(item.deliveries), f"ack-{uid}")
            deleted = Outcome(
                pod_uid=uid, outcome="deleted", message=claim.reason, at=self.clock.now()
            )
            self._resolve(item, deleted)
            return
        booked = self.view.bookings_of(uid)
        if booked and claim is None:
            # Booked by a commit that stopped before its claim: finish that one.
            item.stage = "committing"
            self._in_flight += 1
            self._spawn(self._commit(item, booked[0], None, book=False), f"finish-{uid}")
            return
        assert self.profile is not None
        now = self.clock.now()
        item.tried = self.clock.monotonic()
        item.seen = (self.view.freed, self.view.grown)
        key = item.request.placement_key()
        if self._failed_at != item.seen:
            self._failed_at, self._failed_keys = item.seen, {}
        known = self._failed_keys.get(key) if item.rejections else None
        self.metrics.tries.inc()
        try:
            outcome = self._decide(item, known, now)
            if look_ahead and isinstance(outcome, Decision):
                outcome = self._place_ahead_of(item, outcome, now)
        except Exception:  # a bug in the core must not stop the placer for every pod
            log.exception("deciding a pod failed", extra={"pod_uid": uid})
            self.metrics.commit_failures.labels(cause="bug").inc()
            self._spawn(self._give_back(item, delay=BACKOFF_MAX_S), f"giveback-{uid}")
            return
        if isinstance(outcome, Waiting) and item.adopted and not item.deliveries:
            del self._items[uid]  # its holder keeps it waiting
            return
        if isinstance(outcome, Waiting):
            if item.result is not None:  # the extender's: answered, never held
                self._answer_unplaced(item, outcome)
                return
            self._failed_keys[key] = outcome
            item.stage = "waiting"
            self._waiting[uid] = item
            self._spawn(self._reject(item, outcome), f"reject-{uid}")
            return
        booking = translate.booking_of(
            outcome.reservation,
            item.pod,
            tenant=self.view.tenancy.tenant_of(item.request).tenant,
            commit=f"{self.config.placer_id}.{secrets.token_hex(6)}",
            decided_at=now,
            placer_id=self.config.placer_id,
        )
        ledger, _ = self.view.ledger(booking.node)
        seen = frozenset(b.commit for b in ledger.bookings) if ledger else frozenset()
        self.view.add_tentative(booking)
        item.stage = "committing"
        self._in_flight += 1
        self._spawn(self._commit(item, booking, outcome, seen=seen), f"commit-{uid}")

    # --- the waiting board ---------------------------------------------------------------------

    def _place_ahead_of(self, item: _Item, decision: Decision, now: float) -> Decision | Waiting:
        """Place first the waiting pods on the board ordered before ``item`` that fit now, then
        decide ``item`` again (``board.py`` has why); ``decision`` when there are none."""
        if not len(self.board) or item.only_node is not None or item.adopted:
            return decision
        key = self.board.key_of(
            item.request,
            priority_label=item.pod.hints.priority_label,
            created_at=item.pod.created_at,
        )
        if key is None:
            return decision
        assert self.profile is not None
        profile = self.profile

        def skip(uid: str) -> bool:
            if uid == item.pod.uid:
                return True
            claim = self.view.claim(uid)
            if claim is not None and claim.state != "requeued":
                return True  # placed or deleted already
            held = self._items.get(uid)
            return held is not None and held.stage != "waiting"

        def fits(request: PodRequest) -> bool:
            shape = request.placement_key()
            if shape in self._failed_keys:
                return False
            outcome = decider.decide(self.view, profile, request, now=now)
            if isinstance(outcome, Waiting):
                self._failed_keys[shape] = outcome
                return False
            return True

        outcome: Decision | Waiting = decision
        for _ in range(AHEAD_PLACED):
            ahead = board.first_fitting(
                self.board,
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

    def _place_first(self, posted: Posted, *, before: _Item) -> None:
        """Decide and commit a waiting pod of the board now, ahead of ``before``."""
        uid = posted.uid
        held = self._items.get(uid)
        if held is not None:  # waiting here
            self._waiting.pop(uid, None)
            self._queue.remove(uid)
            held.stage = "queued"
            item = held
        else:
            item = self._items[uid] = _Item(
                pod=posted.waiting.pod,
                request=posted.request,
                deliveries=[],
                received=self.clock.monotonic(),
                adopted=True,
            )
        here = posted.waiting.holder == self.config.placer_id
        self.metrics.placed_ahead.labels(holder="here" if here else "other").inc()
        log.info(
            "placing a waiting pod first",
            extra={
                "pod_uid": uid,
                "holder": posted.waiting.holder,
                "ahead_of": before.pod.uid,
            },
        )
        self._start(item, look_ahead=False)

    async def _post(self, item: _Item) -> None:
        """Post ``item`` (held waiting here) on the board, unless it is posted as it is."""
        uid = item.pod.uid
        posted = self.board.get(uid)
        me = self.config.placer_id
        if posted is not None and posted.waiting.holder == me and posted.waiting.pod == item.pod:
            return
        now = self.clock.now()
        waiting = WaitingPod(
            pod=item.pod,
            holder=me,
            since=posted.waiting.since if posted is not None else now,
            updated_at=now,
        )
        try:
            revision = await self.bus.kv_put(
                subjects.KV_WAITING, subjects.waiting_key(uid), codec.encode(waiting)
            )
        except Exception as error:  # only the order across replicas is weaker until the next try
            log.warning(
                "cannot post a waiting pod on the board",
                extra={"pod_uid": uid, "error": f"{type(error).__name__}: {error}"},
            )
            return
        self.board.put(waiting, revision)
        if self._items.get(uid) is not item or item.stage != "waiting":
            self._unpost(uid)  # placed or gone meanwhile

    def _unpost(self, uid: str) -> None:
        """Take ``uid``'s board entry off, if there is one (at the revision seen: a newer post is
        kept). Whoever places or releases a pod does, and its holder when it sees the claim."""
        posted = self.board.get(uid)
        if posted is None:
            return

        async def delete() -> None:
            try:
                key = subjects.waiting_key(posted.uid)
                deleted = await self.bus.kv_delete_if(
                    subjects.KV_WAITING, key, revision=posted.revision
                )
            except Exception:  # the sweep takes it off later
                return
            if deleted:
                self.board.remove(posted.uid, before=posted.revision + 1)

        self._spawn(delete(), f"unpost-{uid}")

    def _forget_post(self, uid: str) -> None:
        self.board.remove(uid)

    def _sweep_board(self) -> None:
        """Take off entries of pods placed or deleted (their holder stopped before it could)."""
        now = self.clock.now()
        for posted in self.board.posted():
            claim = self.view.claim(posted.uid)
            if claim is None or claim.state == "requeued":
                continue
            if now - max(posted.waiting.updated_at, claim.updated_at) >= BOARD_SWEEP_GRACE_S:
                self._unpost(posted.uid)

    def _decide(self, item: _Item, known: Waiting | None, now: float) -> Decision | Waiting:
        assert self.profile is not None
        if item.only_node is not None:
            return decider.decide_on(self.view, self.profile, item.request, item.only_node, now=now)
        return known or decider.decide(
            self.view, self.profile, item.request, now=now, avoid=self._avoided(item)
        )

    def _avoided(self, item: _Item) -> set[str]:
        """Nodes this pod lost a commit on, and nodes where this replica lost one lately: while
        another replica is packing a node, deciding other pods onto it only loses again."""
        now = self.clock.monotonic()
        if self._contended and len(self._contended) > 64:
            self._contended = {n: t for n, t in self._contended.items() if t > now}
        recent = {n for n, until in self._contended.items() if until > now}
        return item.avoid | recent if recent else item.avoid

    async def _commit(
        self,
        item: _Item,
        booking: Booking,
        decision: Decision | None,
        *,
        book: bool = True,
        seen: frozenset[str] | None = None,
    ) -> None:
        """Commit ``booking`` (``book``: it is not in the ledger yet; ``seen``: the bookings on
        its node when it was decided, so that a decision another placer overtook is made
        again)."""
        uid = booking.pod_uid
        try:
            refusal, why = await self.protocol.book(booking, seen=seen) if book else ("", "")
            if refusal:
                self.view.drop_tentative(booking.node, uid)
                if refusal == "node":
                    item.avoid.add(booking.node)
                    self._contended[booking.node] = self.clock.monotonic() + CONTENDED_S
                # else another commit filled the quota first: decided again, the pod waits
                self._retry(item, why)
                return
            outcome, placed = await self.protocol.finish(booking, item.pod, decision)
            await self._ack(item.deliveries)
            if self._items.get(uid) is item:
                del self._items[uid]
            self._unpost(uid)
            self._answered(item, outcome, placed, decision if placed is booking else None)
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
            await self._give_back(item, delay=1.0)
        finally:
            self._in_flight -= 1
            self._work.set()

    def _retry(self, item: _Item, why: str) -> None:
        if item.adopted and not item.deliveries:  # its holder keeps it
            if self._items.get(item.pod.uid) is item:
                del self._items[item.pod.uid]
            return
        item.attempts += 1
        self.metrics.retries.inc()
        if item.attempts > self.config.max_commit_retries:
            self.metrics.commit_failures.labels(cause="retries").inc()
            log.warning(
                "commit retries exhausted; the pod message comes back later",
                extra={"pod_uid": item.pod.uid, "attempts": item.attempts, "reason": why},
            )
            delay = RETRY_LATER_S * (1 + random.random())  # jittered: replicas fall out of step
            self._spawn(self._give_back(item, delay=delay), f"giveback-{item.pod.uid}")
            return
        if self._items.get(item.pod.uid) is item:
            self._enqueue(item)

    async def _give_back(self, item: _Item, *, delay: float) -> None:
        if self._items.get(item.pod.uid) is item:
            del self._items[item.pod.uid]
        self._waiting.pop(item.pod.uid, None)
        self._resolve(
            item,
            Outcome(
                pod_uid=item.pod.uid,
                outcome="failed",
                message="the commit kept losing to other writers or NATS failed; try again",
                at=self.clock.now(),
            ),
        )
        for delivery in item.deliveries:
            with contextlib.suppress(Exception):
                await delivery.nak(delay)

    async def _republish(self, booking: Booking, deliveries: list[Delivery]) -> None:
        """Finish a pod placed already (by ``booking``), then ack its messages."""
        try:
            await self.protocol.republish(booking)
        except Exception as error:
            log.warning(
                "cannot finish an already placed pod yet; its message comes back",
                extra={"pod_uid": booking.pod_uid, "error": f"{type(error).__name__}: {error}"},
            )
            for delivery in deliveries:
                with contextlib.suppress(Exception):
                    await delivery.nak(1.0)
            return
        self.metrics.decisions.labels(outcome="duplicate").inc()
        await self._ack(deliveries)

    async def _ack(self, deliveries: list[Delivery]) -> None:
        for delivery in deliveries:
            with contextlib.suppress(Exception):  # an ack that is lost means a harmless redelivery
                await delivery.ack()

    def _answered(
        self, item: _Item, outcome: str, booking: Booking, decision: Decision | None
    ) -> None:
        elapsed = self.clock.monotonic() - item.received
        if not item.answered:
            item.answered = True
            self.metrics.latency.observe(elapsed)
        self.metrics.decisions.labels(outcome=outcome).inc()
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
        self._remember(
            Outcome(
                pod_uid=item.pod.uid,
                outcome=outcome,
                node=booking.node,
                booking=booking,
                score=decision.score if decision else 0.0,
                scores=dict(decision.scores) if decision else {},
                at=self.clock.now(),
                request=item.request,
            )
        )
        self._resolve(item, self._outcomes[item.pod.uid])

    def _resolve(self, item: _Item, outcome: Outcome) -> None:
        """Answer :meth:`place` for ``item`` (once; nothing for a pod from the queue)."""
        if item.result is not None and not item.result.done():
            item.result.set_result(outcome)

    def _remember(self, outcome: Outcome) -> None:
        self._outcomes[outcome.pod_uid] = outcome
        self._outcomes.move_to_end(outcome.pod_uid)
        while len(self._outcomes) > EXPLAINED_PODS:
            self._outcomes.popitem(last=False)

    async def _reject(self, item: _Item, waiting: Waiting) -> None:
        """Publish why the pod does not fit (when that changed); keep it waiting or let it go."""
        pod = item.pod
        rejection = waiting.rejection
        message = translate.rejection_message(
            pod,
            rejection.reasons,
            nodes=len(self.view.index),
            unresolvable=rejection.unresolvable,
            decided_at=self.clock.now(),
            placer_id=self.config.placer_id,
        )
        try:
            if message.message != item.last_message:
                sequence = item.deliveries[0].sequence if item.deliveries else 0
                await self.bus.js_publish(
                    subjects.PLACEMENTS_REJECTED,
                    codec.encode(message),
                    msg_id=f"rejected.{pod.uid}.{sequence}.{item.rejections}",
                )
                item.rejections += 1
                item.last_message = message.message
                outcome = "unresolvable" if rejection.unresolvable else "rejected"
                self.metrics.decisions.labels(outcome=outcome).inc()
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
                self.metrics.latency.observe(self.clock.monotonic() - item.received)
        except Exception as error:
            log.warning(
                "cannot publish a rejection; the pod message comes back",
                extra={"pod_uid": pod.uid, "error": f"{type(error).__name__}: {error}"},
            )
            await self._give_back(item, delay=1.0)
            return
        self._remember(
            Outcome(
                pod_uid=pod.uid,
                outcome="unresolvable" if rejection.unresolvable else "waiting",
                reasons=tuple((r.reason, r.nodes) for r in rejection.reasons),
                message=message.message,
                at=self.clock.now(),
                request=item.request,
            )
        )
        if waiting.final:
            if self._items.get(pod.uid) is item:
                del self._items[pod.uid]
            self._waiting.pop(pod.uid, None)
            await self._ack(item.deliveries)
            return
        item.wake = waiting.wake
        item.backoff = min(BACKOFF_MAX_S, max(BACKOFF_MIN_S, item.backoff * 2))
        if self._items.get(pod.uid) is item and item.stage == "waiting":
            await self._post(item)

    def _answer_unplaced(self, item: _Item, waiting: Waiting) -> None:
        """A pod placed through :meth:`place` does not fit where asked: answer why and keep
        nothing (nothing is published either: kube-scheduler explains the pod itself and
        schedules it again by itself)."""
        rejection = waiting.rejection
        uid = item.pod.uid
        if self._items.get(uid) is item:
            del self._items[uid]
        outcome = "unresolvable" if rejection.unresolvable else "rejected"
        self.metrics.decisions.labels(outcome=outcome).inc()
        reasons = tuple((r.reason, r.nodes) for r in rejection.reasons)
        answer = Outcome(
            pod_uid=uid,
            outcome="unresolvable" if rejection.unresolvable else "waiting",
            node=item.only_node or "",
            reasons=reasons,
            message="; ".join(reason for reason, _ in reasons),
            at=self.clock.now(),
            request=item.request,
        )
        self._remember(answer)
        self._resolve(item, answer)
        log.info(
            "pod does not fit where kube-scheduler chose",
            extra={
                "pod": f"{item.pod.namespace}/{item.pod.name}",
                "pod_uid": uid,
                "node": item.only_node,
                "reasons": answer.message,
            },
        )

    async def _retry_loop(self) -> None:
        """Put waiting pods back in the queue when something that could let them fit changed."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(REFRESH_S):
                    await self._changed.wait()
            self._changed.clear()
            now = self.clock.monotonic()
            freed, grown = self.view.freed, self.view.grown
            for item in list(self._waiting.values()):
                changed = grown != item.seen[1] or (item.wake == "freed" and freed != item.seen[0])
                due = now - item.tried >= item.backoff
                if (changed and due) or now - item.tried >= SAFETY_RETRY_S:
                    self._enqueue(item)
            self._count_pending()
            self.metrics.waiting_scans.inc()

    def _count_pending(self) -> None:
        by_reason: dict[str, int] = {}
        for item in self._waiting.values():
            outcome = self._outcomes.get(item.pod.uid)
            reason = outcome.reasons[0][0] if outcome and outcome.reasons else "unknown"
            by_reason[reason] = by_reason.get(reason, 0) + 1
        self.metrics.pending.clear()
        for reason, count in by_reason.items():
            self.metrics.pending.labels(reason=reason).set(count)
        self.metrics.queue_depth.labels(stage="waiting").set(len(self._waiting))
        self.metrics.queue_depth.labels(stage="deciding").set(len(self._items) - len(self._waiting))

    async def _heartbeat_loop(self) -> None:
        """Keep every held message in progress so JetStream does not hand it to another replica."""
        while True:
            await self.clock.sleep(max(0.2, self.config.ack_wait_s / 3))
            held = [d for item in list(self._items.values()) for d in item.deliveries]
            for start in range(0, len(held), 500):
                await asyncio.gather(
                    *(d.in_progress() for d in held[start : start + 500]), return_exceptions=True
                )

    # --- the extender's entry point ------------------------------------------------------------

    async def place(self, pod: PodPending, *, node: str | None = None) -> Outcome:
        """Decide ``pod`` now (on ``node`` only, when given) and commit it like any other pod.

        For the scheduler extender (issue 14): the answer comes once the decision is committed
        and published, or the rejection published; a pod that does not fit is not kept.
        """
        if pod.uid in self._items:
            raise ValueError(f"pod {pod.uid} is already being placed")
        item = _Item(
            pod=pod,
            request=translate.pod_request(pod),
            deliveries=[],
            received=self.clock.monotonic(),
            result=asyncio.get_running_loop().create_future(),
            only_node=node,
        )
        self._items[pod.uid] = item
        self._enqueue(item)
        assert item.result is not None
        return await item.result

    # --- releases ------------------------------------------------------------------------------

    async def _consume_bindings(self) -> None:
        bindings = deliveries(
            self.bus,
            clock=self.clock,
            stream=subjects.STREAM_BINDINGS,
            durable=subjects.DURABLE_PLACER_BINDINGS,
            subject=subjects.BINDINGS_ALL,
            ack_wait=self.config.ack_wait_s,
        )
        async with contextlib.aclosing(bindings):
            async for delivery in bindings:
                result = await self.edge.accept(delivery, BindingResult, family="bindings")
                if result is not None:
                    self._spawn(self._on_binding(result, delivery), f"binding-{result.pod_uid}")

    async def _on_binding(self, result: BindingResult, delivery: Delivery) -> None:
        try:
            if result.outcome == "gone":
                await self.release_deleted(
                    result.pod_uid, cause="gone", reason=result.reason or "pod gone before binding"
                )
            elif result.outcome == "failed":
                await self.release_requeue(
                    result.pod_uid,
                    result.node,
                    cause="failed",
                    reason=result.reason or "binding failed",
                    only_reserved=False,
                    reported_at=result.at,
                )
        except Exception as error:
            log.warning(
                "cannot act on a binding result yet; it comes back",
                extra={"pod_uid": result.pod_uid, "error": f"{type(error).__name__}: {error}"},
            )
            with contextlib.suppress(Exception):
                await delivery.nak(1.0)
            return
        await self._ack([delivery])

    async def release_deleted(self, pod_uid: str, *, cause: str, reason: str) -> None:
        """The pod is gone (deleted, or the binder found it gone): give everything back."""
        given_back = await self.protocol.release_deleted(pod_uid, reason=reason)
        item = self._items.get(pod_uid)
        if item is not None and item.stage != "committing":
            del self._items[pod_uid]
            self._waiting.pop(pod_uid, None)
            self._queue.remove(pod_uid)
            self._resolve(
                item,
                Outcome(pod_uid=pod_uid, outcome="deleted", message=reason, at=self.clock.now()),
            )
            await self._ack(item.deliveries)
        self._unpost(pod_uid)
        self.metrics.releases.labels(cause=cause).inc()
        self._remember(
            Outcome(pod_uid=pod_uid, outcome="deleted", message=reason, at=self.clock.now())
        )
        log.info(
            "pod released",
            extra={
                "pod_uid": pod_uid,
                "cause": cause,
                "nodes": sorted({b.node for b in given_back}),
            },
        )

    async def release_requeue(
        self,
        pod_uid: str,
        node: str,
        *,
        cause: str,
        reason: str,
        only_reserved: bool,
        reported_at: float = 0.0,
    ) -> bool:
        """Give the placement on ``node`` back and place the pod again (see the protocol)."""
        released = await self.protocol.release_requeue(
            pod_uid, node, reason=reason, only_reserved=only_reserved, reported_at=reported_at
        )
        if released:
            self.metrics.releases.labels(cause=cause).inc()
            log.info(
                "pod released to be placed again",
                extra={"pod_uid": pod_uid, "node": node, "cause": cause, "reason": reason},
            )
        return released

    # --- timers --------------------------------------------------------------------------------

    async def _refresh_loop(self) -> None:
        while True:
            await self.clock.sleep(REFRESH_S)
            self.view.refresh(self.clock.now())
            self._poke()
            unplaceable = self.view.unplaceable()
            self.metrics.nodes.clear()
            self.metrics.nodes.labels(state="placeable").set(
                self.view.node_count() - sum(unplaceable.values())
            )
            for reason, count in unplaceable.items():
                self.metrics.nodes.labels(state=reason).set(count)

    async def _timeout_loop(self) -> None:
        """Release ``reserved`` records the binder did not bind within the reserve timeout."""
        period = max(0.5, min(5.0, self.config.reserve_timeout_s / 4))
        while True:
            await self.clock.sleep(period)
            now = self.clock.now()
            for record in list(self.view.records.values()):
                if (
                    record.state == "reserved"
                    and now - record.decided_at >= self.config.reserve_timeout_s
                    and record.key not in self._releasing
                ):
                    self._releasing.add(record.key)
                    self._spawn(self._time_out(record.key, record.pod_uid, record.node), "timeout")

    async def _time_out(self, key: str, pod_uid: str, node: str) -> None:
        try:
            await self.release_requeue(
                pod_uid,
                node,
                cause="timeout",
                reason=f"not bound within {self.config.reserve_timeout_s:g} s",
                only_reserved=True,
            )
        except Exception as error:
            log.warning(
                "reserve timeout release failed; tried again",
                extra={"pod_uid": pod_uid, "error": f"{type(error).__name__}: {error}"},
            )
        finally:
            self._releasing.discard(key)

    async def _purge_loop(self) -> None:
        """Delete released records and deleted pods' claims after the retention period."""
        period = max(1.0, min(60.0, self.config.release_retention_s / 4))
        while True:
            await self.clock.sleep(period)
            try:
                await self.protocol.purge(retention_s=self.config.release_retention_s)
            except Exception as error:
                log.warning("purge failed; tried again", extra={"error": str(error)})

    async def _reconcile_loop(self) -> None:
        while True:
            await self.clock.sleep(self.config.reconcile_interval_s)
            try:
                await self.protocol.reconcile(grace_s=self.config.reconcile_interval_s / 2)
            except Exception as error:
                log.warning("reconciliation failed; tried again", extra={"error": str(error)})
            self._sweep_board()

    async def _mix_loop(self) -> None:
        while True:
            await self.clock.sleep(self.config.mix_check_s)
            self._rebuild_profile()

    @property
    def mix_compiled(self) -> bool:
        """Whether the profile in use was compiled with the task mix learned so far."""
        return self.profile is not None and self._typical == self.view.mix.typical()

    def _rebuild_profile(self) -> None:
        """Compile the profile with the learned task mix, when the mix moved."""
        typical = self.view.mix.typical()
        if typical == self._typical and self.profile is not None:
            return
        old = self.profile
        self.profile = build_profile(
            service_profile(self.config.profile),
            typical_tasks=typical,
            **self.view.tenancy.plugins(),
        )
        self._typical = typical
        self._failed_keys = {}
        self.metrics.profile_builds.inc()
        if old is not None:  # its memo is of no use any more
            for stale in (old, *old.node_policies.values()):
                self.view.index.memos.pop(stale, None)
        log.info(
            "profile compiled",
            extra={
                "profile": self._profile_name,
                "pods_seen": len(self.view.mix),
                "typical_tasks": len(typical),
            },
        )

    async def _stats_loop(self) -> None:
        """Publish this replica's ``ClusterStats`` (fragmentation as the core measures it) to
        KV ``tessera-stats`` for the dashboard; one key per replica, so none contend."""
        key = subjects.stats_key(self.config.placer_id)
        while True:
            typical = self._typical or DEFAULT_TYPICAL_TASKS
            if self._stats_model is None or self._stats_model[0] != typical:
                self._stats_model = (typical, FragmentationModel(typical))
            figures = stats.cluster_stats(
                self.view.index,
                self._stats_model[1],
                placer_id=self.config.placer_id,
                profile=self._profile_name,
                typical_tasks=len(typical),
                pending_pods=len(self._waiting),
                now=self.clock.now(),
                tenants=stats.tenant_usage(self.view.ledgers(), self.view.tenancy.config.quotas),
            )
            try:
                await self.bus.kv_put(subjects.KV_STATS, key, codec.encode(figures))
            except Exception as error:  # NATS away: the next round tries again
                log.warning("cluster statistics not published", extra={"error": str(error)})
            await self.clock.sleep(self.config.stats_interval_s)

    async def _tenancy_loop(self) -> None:
        path = self.config.tenancy_file
        if not path:
            return
        while True:
            await self.clock.sleep(self.config.tenancy_check_s)
            self.check_tenancy_file()

    def check_tenancy_file(self) -> bool:
        """Apply the tenancy file when it changed and checks; True when a new version applied."""
        path = Path(self.config.tenancy_file)
        try:
            text = path.read_bytes()
        except OSError as error:
            if self._tenancy_text is not None:
                log.error(
                    "cannot read the tenancy file; keeping the last good config",
                    extra={"path": str(path), "error": error.strerror},
                )
                self._tenancy_text = None
            return False
        if text == self._tenancy_text:
            return False
        self._tenancy_text = text
        try:
            config = parse_tenancy(text, source=str(path))
        except ConfigFileError as error:
            self.metrics.tenancy_reloads.labels(outcome="refused").inc()
            log.error(
                "tenancy file refused; keeping the last good config", extra={"reason": str(error)}
            )
            return False
        if config == self.view.tenancy.config:
            return False
        self.view.configure_tenancy(config)
        self._failed_keys = {}
        self._poke()
        self.metrics.tenancy_reloads.labels(outcome="applied").inc()
        log.info(
            "tenancy config applied",
            extra={
                "namespaces": len(config.namespaces),
                "groups": len(config.groups),
                "permissions": len(config.permissions),
                "quotas": len(config.quotas),
            },
        )
        return True

    # --- explanation ---------------------------------------------------------------------------

    async def _explain(self, request: web.Request, params: Mapping[str, str]) -> web.StreamResponse:
        return web.json_response(self.explain(params["uid"]))

    async def _on_explain(self, delivery: Delivery) -> None:
        """Answer ``tessera explain`` for a pod this replica knows; stay silent otherwise (another
        replica may know it: the asker takes the first answer)."""
        request = await self.edge.accept(delivery, ExplainRequest, family="explain")
        if request is None or not delivery.reply:
            return
        uid = self.find_pod(request.namespace, request.name)
        if uid is None:
            return
        posted = self.board.get(uid)
        if uid not in self._items and posted is not None and posted.waiting.holder:
            # Another replica holds it and knows its last rejection: let it answer first.
            await asyncio.sleep(EXPLAIN_DEFER_S)
        reply = ExplainReply(
            pod_uid=uid,
            namespace=request.namespace,
            name=request.name,
            replica=self.config.placer_id,
            explanation=self.explain(uid),
        )
        with contextlib.suppress(Exception):  # the asker gave up, or NATS is away
            await self.bus.publish(delivery.reply, codec.encode(reply))

    def find_pod(self, namespace: str, name: str) -> str | None:
        """The UID of pod ``namespace/name`` as this replica knows it (held here, waiting on the
        board, claimed, or decided lately here), the most recent when several pods had the name;
        None when it knows no such pod."""
        found: dict[str, float] = {}
        for item in self._items.values():
            if (item.pod.namespace, item.pod.name) == (namespace, name):
                found[item.pod.uid] = float("inf")
        for posted_uid in self.board.uids():
            posted = self.board.get(posted_uid)
            if posted is None:
                continue
            pod = posted.waiting.pod
            if (pod.namespace, pod.name) == (namespace, name):
                found.setdefault(pod.uid, posted.waiting.updated_at)
        for uid, claim in self.view.claims.items():
            named = claim.booking or claim.request
            if named is not None and (named.namespace, named.name) == (namespace, name):
                found[uid] = max(found.get(uid, 0.0), claim.updated_at)
        for outcome in self._outcomes.values():
            request = outcome.request
            if request is not None and (request.namespace, request.name) == (namespace, name):
                found[outcome.pod_uid] = max(found.get(outcome.pod_uid, 0.0), outcome.at)
        return max(found, key=lambda uid: found[uid], default=None)

    def explain(self, pod_uid: str) -> dict[str, Any]:
        """Everything this replica knows about one pod, and every node's verdict for it now."""
        outcome = self._outcomes.get(pod_uid)
        item = self._items.get(pod_uid)
        claim = self.view.claim(pod_uid)
        posted = self.board.get(pod_uid)
        request = (
            item.request
            if item is not None
            else outcome.request
            if outcome is not None and outcome.request is not None
            else translate.pod_request(claim.request)
            if claim is not None and claim.request is not None
            else posted.request  # waiting, held by another replica
            if posted is not None
            else None
        )
        if request is not None:  # its tenant as the tenancy file makes it now
            request = self.view.tenancy.resolve(request)
        answer: dict[str, Any] = {"pod_uid": pod_uid, "replica": self.config.placer_id}
        if item is not None:
            answer["held_here"] = item.stage
        elif posted is not None:
            answer["held_by"] = posted.waiting.holder
        if outcome is not None:
            answer["last_outcome"] = msgspec.to_builtins(
                msgspec.structs.replace(outcome, request=None)
            )
        if claim is not None:
            answer["claim"] = {
                "state": claim.state,
                "node": claim.booking.node if claim.booking else None,
                "commit": claim.booking.commit if claim.booking else None,
                "gpus": msgspec.to_builtins(claim.booking.containers) if claim.booking else [],
                "reason": claim.reason,
                "placer_id": claim.booking.placer_id if claim.booking else None,
            }
            if claim.booking is not None:
                record = self.view.records.get(subjects.assignment_key(claim.booking.node, pod_uid))
                answer["record"] = msgspec.to_builtins(record) if record else None
        if request is None or self.profile is None:
            answer["nodes"] = []
            if outcome is None and claim is None and posted is None:
                answer["error"] = "this replica has not seen the pod"
            return answer
        judged = decider.verdicts(self.view, self.profile, request)
        fitting = sorted((v for v in judged if v.fits), key=lambda v: (-v.score, v.node))
        reasons: dict[str, int] = {}
        for verdict in judged:
            if not verdict.fits:
                reasons[verdict.reason] = reasons.get(verdict.reason, 0) + 1
        answer["nodes_total"] = len(judged)
        answer["nodes_fitting"] = len(fitting)
        answer["best_nodes"] = [msgspec.to_builtins(v) for v in fitting[:VERDICTS_SHOWN]]
        answer["not_fitting"] = dict(sorted(reasons.items(), key=lambda kv: -kv[1]))
        answer["not_fitting_nodes"] = [
            {"node": v.node, "reason": v.reason} for v in judged if not v.fits
        ][:VERDICTS_SHOWN]
        quota = decider.quota_status(self.view, request)
        if quota:
            answer["quota"] = quota
        return answer


def _kv_delivery(entry: KvEntry, bucket: str) -> Delivery:
    """A KV entry as the edge takes a message (its subject names bucket and key)."""
    return Delivery(subject=f"$KV.{bucket}.{entry.key}", data=entry.value)


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
            "profile": service._profile_name,
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
