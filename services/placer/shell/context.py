"""What every job of one placer replica's shell shares: its settings, its ports, the view and
the commit path, and the few flags that wake its loops."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from services.placer.core.framework import Profile
from services.placer.core.groups import TenancyConfig
from services.placer.core.model import PodRequest
from services.placer.core.profiles import ProfileSpec
from services.placer.metrics import PlacerMetrics
from services.placer.protocol import CommitProtocol
from services.placer.rules import mix
from services.placer.rules.board import WaitingBoard
from services.placer.rules.decider import Waiting
from services.placer.rules.state import ClusterView
from services.placer.writes import Store
from shared.clock import Clock
from shared.runtime.bus import Bus
from shared.runtime.edge import Edge

log = logging.getLogger("services.placer.service")
"""One logger for the whole shell: its lines keep the name they had before the split (log
queries and alerts select on it)."""

MAX_IN_FLIGHT = 64
"""Commits one replica runs at once."""
MIX_CHECK_S = 5.0
TENANCY_CHECK_S = 2.0
STATS_INTERVAL_S = 10.0
CURRENT_POLL_S = 0.05
"""How often a restore waiting for the view to hold the new store looks again."""


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
    pools: int = 1
    """Node pools shared out among the replicas (``services/placer/rules/poolplan.py``); 1: none."""
    pool_lease_s: float = 3.0
    burst_spread: bool = True
    """Decide a pod that would wait at the binder's gate onto another node while a burst is
    handed off (``decider.decide``'s ``spread``)."""
    claims_with_bookings: bool = False
    """Claim each pod in its booking's batch (``Store.book``): on a replicated store."""

    @property
    def profile_name(self) -> str:
        spec = self.profile
        return spec if isinstance(spec, str) else spec.name


class Spawner:
    """The replica's background tasks: started by name, logged when they fail, cancelled on
    stop."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, work: Coroutine[Any, Any, Any], name: str) -> None:
        task = asyncio.create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("placer task failed", exc_info=task.exception())

    def cancel_all(self) -> None:
        for task in list(self._tasks):
            task.cancel()


@dataclass(eq=False)
class Shell:
    """The state the shell's jobs share (each job keeps its own beside it): its ports and
    the commit path are given; the rest is state the jobs set."""

    config: PlacerConfig
    bus: Bus
    edge: Edge
    clock: Clock
    metrics: PlacerMetrics
    view: ClusterView
    store: Store
    protocol: CommitProtocol
    board: WaitingBoard = field(default_factory=WaitingBoard, init=False)
    tasks: Spawner = field(default_factory=Spawner, init=False)
    work: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    """Wakes the place loop: pods queued, a commit finished, the store restored."""
    changed: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    """Wakes the retry loop: the view's change counters moved."""
    profile: Profile | None = field(default=None, init=False)
    """The compiled profile (``upkeep``); None until the view is loaded."""
    decisions: int = field(default=0, init=False)
    """Pods decided (placed or not) since the start: what a compile of the profile is paid by."""
    restored_epoch: str = field(default="", init=False)
    """The store epoch the binder last said it restored (``watches``)."""
    loaded_from: dict[str, str | None] = field(default_factory=dict, init=False)
    """Each bucket the view follows -> the epoch of the store its watch last loaded from (None:
    not loaded yet); ``watches`` names them all at start."""
    failed_at: tuple[int, ...] = field(default=(-1, -1, -1), init=False)
    failed_keys: dict[PodRequest, Waiting] = field(default_factory=dict, init=False)
    """Pod shapes known not to fit since the view's change counters were ``failed_at`` (the
    first three of :meth:`counters`: a pod placed changes no request's fit but those that count
    pods, which are never kept here)."""
    _seen_change: tuple[int, ...] = field(default=(0, 0, 0, 0), init=False)

    @property
    def current(self) -> bool:
        """Whether the view holds the store the bus is on, and nothing else: every bucket's
        watch loaded its values since the bus took the store's epoch. After NATS lost its store
        the bus takes the new epoch before the watches load again (each at its own pace: a watch
        backs off while JetStream is slow to start), and until they have, the view still holds
        the lost store's bookings, claims and records. Nothing is written from it meanwhile:
        a restore taken on it found the pod "already booked and claimed" and wrote neither, and
        reconciliation then released the record of the running pod."""
        epoch = self.bus.store_epoch
        return bool(self.loaded_from) and all(e == epoch for e in self.loaded_from.values())

    @property
    def restored(self) -> bool:
        """Whether what is bound is in the store (docs/design.md §12), and the view holds that
        store (:attr:`current`): the binder said so for the store's epoch. Nothing new is decided
        and nothing reconciled before, so no running pod's GPUs go to another."""
        return (
            bool(self.bus.store_epoch)
            and self.restored_epoch == self.bus.store_epoch
            and self.current
        )

    async def until_current(self, timeout_s: float) -> bool:
        """Wait (up to ``timeout_s``) until the view holds the current store (:attr:`current`)."""
        waited = 0.0
        while not self.current:
            if waited >= timeout_s:
                return False
            await self.clock.sleep(CURRENT_POLL_S)
            waited += CURRENT_POLL_S
        return True

    def counters(self) -> tuple[int, int, int, int]:
        """What waiting pods wake on: the view's ``freed`` and ``grown``, and its indexes' node
        label or taint changes and pods placed or gone (``ClusterIndex.relabelled`` and
        ``repodded``)."""
        indexes = self.view.indexes()
        return (
            self.view.freed,
            self.view.grown,
            sum(i.relabelled for i in indexes),
            sum(i.repodded for i in indexes),
        )

    def poke(self) -> None:
        """Wake the retry loop when the view's change counters moved."""
        seen = self.counters()
        if seen != self._seen_change:
            self._seen_change = seen
            self.changed.set()

    def forget_failed(self) -> None:
        """Shapes that did not fit may fit now (a new profile or tenancy config)."""
        self.failed_keys = {}
