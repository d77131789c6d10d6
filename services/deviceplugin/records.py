"""This node's assignment records, as the device plugin takes them.

The shared :class:`~shared.runtime.records.RecordMirror` over the keys ``<node>.*`` of
``tessera-assignments``, with the plugin's checks: each revision is checked with
``shared.validation`` (its key, its values, the node's inventory, and that it only moved forward
from the last version accepted) and against what this plugin granted before a restart
(:mod:`~services.deviceplugin.grants`); one that fails is dead-lettered with the reason and
forgotten: never served, never blocking a valid one. Checks against the inventory run again
whenever the inventory changes (:meth:`NodeRecords.revalidate`). A record released frees its
grants, one gone without a release (NATS lost its store) leaves them unrecorded, to answer a
restore.

A watch on a NATS cluster can go silent for seconds, so an Allocate that finds no record reads
this node's records afresh (:meth:`NodeRecords.reread`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math

from services.deviceplugin.commits import CommitMirror
from services.deviceplugin.grants import GrantBook
from services.deviceplugin.inventory import InventoryFollower
from services.deviceplugin.metrics import PluginMetrics
from services.deviceplugin.rules import allocate
from shared import subjects, validation
from shared.clock import Clock
from shared.messages.assignments import AssignmentRecord, RecordView
from shared.messages.inventory import NodeInventory
from shared.runtime.bus import Bus
from shared.runtime.edge import Edge
from shared.runtime.health import Readiness
from shared.runtime.records import RecordMirror, version_problem
from shared.runtime.tasks import ChangeCounter

log = logging.getLogger(__name__)

RECORD_REREAD_S = 0.5
"""An Allocate that finds no record reads this node's records afresh at most this often."""

RECORD_READ_TIMEOUT_S = 1.0
"""How long one fresh read of the records may take."""


class NodeRecords:
    """The records of this node that Allocate may serve (``mirror``), checked as they come."""

    def __init__(
        self,
        *,
        node: str,
        bus: Bus,
        edge: Edge,
        clock: Clock,
        metrics: PluginMetrics,
        readiness: Readiness,
        changed: ChangeCounter,
        grants: GrantBook,
        commits: CommitMirror,
        inventory: InventoryFollower,
    ) -> None:
        self._bus = bus
        self._clock = clock
        self._metrics = metrics
        self._readiness = readiness
        self._grants = grants
        self._commits = commits
        self._inventory = inventory
        self.mirror = RecordMirror(
            bus=bus,
            edge=edge,
            clock=clock,
            keys=subjects.assignment_keys_of(node),
            check=self._problem,
            on_taken=self._taken,
            on_deleted=self._deleted,
            on_loaded=self._loaded,
            changed=changed,
        )
        self._read_at = -math.inf
        """When (monotonic) an Allocate last read this node's records afresh."""
        readiness.set("records", False, "loading assignment records")

    def _problem(self, key: str, record: AssignmentRecord, known: RecordView | None) -> str | None:
        return (
            validation.assignment_problem(record, key=key, inventory=self._inventory.inventory)
            or version_problem(key, record, known)
            or allocate.granted_problem(record, self._grants.get(key))
        )

    def _taken(self, view: RecordView) -> None:
        if view.record.state == "released":
            self._grants.forget({view.key})

    def _deleted(self, key: str, _known: RecordView | None) -> None:
        self._grants.unrecord({key})

    def _loaded(self, listed: set[str]) -> None:
        self._grants.unrecord(set(self._grants.given) - listed)
        self._readiness.set("records", True)

    async def revalidate(self, inventory: NodeInventory) -> None:
        """Dead-letter and forget records the new inventory makes impossible."""
        for view in self.mirror.views():
            problem = validation.record_inventory_problem(view.record, inventory)
            if problem is not None:
                await self.mirror.refuse(view, problem)

    async def reread(self, *, now: bool = False) -> bool:
        """Read this node's records afresh (a new watch's initial values), at most every
        :data:`RECORD_REREAD_S` unless ``now``; whether that took anything the standing watch
        had not delivered.

        A pod reaches the kubelet only once its record is bound in the bucket, so a record
        missing at Allocate is one the standing watch has not delivered yet: on a NATS cluster
        whose server holding the watch's consumer died, the watch stays silent until nats-py
        notices (``shared.runtime.bus.NODE_WATCH_HEARTBEAT_S``), and a fresh one is read at once."""
        started = self._clock.monotonic()
        if not self._bus.connected or (not now and started - self._read_at < RECORD_REREAD_S):
            return False
        self._read_at = started
        changed = self.mirror.changed
        seen = changed.version
        watch = self._bus.kv_watch(subjects.KV_ASSIGNMENTS, self.mirror.keys)
        try:
            async with asyncio.timeout(RECORD_READ_TIMEOUT_S):
                async for entry in watch:
                    if entry is None:
                        break
                    if not entry.deleted:  # deletions are the standing watch's to apply
                        await self.mirror.take(entry)
        except Exception as error:  # NATS away or slow: wait for the watch as before
            log.warning(
                "cannot read records again", extra={"error": f"{type(error).__name__}: {error}"}
            )
        finally:
            with contextlib.suppress(Exception):
                await watch.aclose()
        taken = changed.version != seen
        if taken:
            self._metrics.records_reread.inc()
            log.warning("the records watch had not delivered records a fresh read found")
        return taken
