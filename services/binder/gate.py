"""The assignment records as the binder reads and writes them for the ambiguity gate.

:class:`GateRecords` is what :class:`~services.binder.binding.PlacementBinder` plans over: the
latest version of a pod's record, the node's records the gate may wait for, whether a record
that holds a pod back is one a device plugin would grant (it matches its booking, read once per
revision) and the write of a ``bound`` record (create-only, or compare-and-set at the revision
read; its outcome read from the mirror's watch, ``RecordMirror.write``). A write whose outcome
is unknown is *in doubt*: until it is read back, the gate counts the record as bound, so two
pods are never bound with the same devices on one node.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final

from services.binder.metrics import BinderMetrics
from services.binder.rules.plan import Bind
from shared import codec, subjects
from shared.clock import Clock
from shared.commits import booking_problem
from shared.messages.assignments import RecordView
from shared.messages.ledger import Booking
from shared.runtime.bus import Bus
from shared.runtime.records import RecordMirror

log = logging.getLogger(__name__)

COMMIT_RECHECK_S: Final = 5.0
"""A record found to match no booking is checked again after this long."""

MAX_COMMIT_CHECKS: Final = 10_000
"""Records whose booking check is remembered; beyond it, those of records gone are forgotten."""


class GateRecords:
    """The binder's reads and writes of assignment records (see the module docstring)."""

    def __init__(
        self,
        *,
        bus: Bus,
        records: RecordMirror,
        clock: Clock,
        metrics: BinderMetrics,
        fence: Callable[[str], None],
    ) -> None:
        self._bus = bus
        self._records = records
        self._clock = clock
        self._metrics = metrics
        self._fence = fence
        self._committed: dict[str, int] = {}
        """Record key -> the revision found to match its booking."""
        self._uncommitted: dict[str, tuple[int, float]] = {}
        """Record key -> (revision, when checked) found to match no booking."""
        self._in_doubt: dict[str, RecordView] = {}
        """Record key -> the ``bound`` version this binder wrote with an unknown outcome that it
        could not read back: the gate counts it as bound until the key is read or seen anew."""

    async def latest(self, key: str, *, fresh: bool) -> RecordView | None:
        """The latest version of ``key``: the mirror's (the write that follows fails if it is
        not current, and the bucket is read then), or the bucket's (``fresh``: as for a record
        whose last write had an unknown outcome)."""
        if key in self._in_doubt:
            view = await self._records.read(key)
            self._in_doubt.pop(key, None)  # the mirror now holds what the bucket holds
            return view
        if not fresh:
            return self._records.latest(key)
        return await self._records.read(key)

    def waitable(self, node: str) -> list[RecordView]:
        """The node's records the gate may wait for: all but those found to match no booking,
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

    async def grantable(self, view: RecordView) -> bool:
        """Whether a device plugin would grant ``view``: it matches its booking (read once per
        revision); one that does not is remembered, counted and logged."""
        if self._committed.get(view.key) == view.revision:
            return True
        record = view.record
        entry = await self._bus.kv_get(
            subjects.KV_LEDGER, subjects.booking_key(record.node, record.pod_uid)
        )
        booking = None
        if entry is not None:
            try:
                booking = codec.decode(entry.value, Booking)
            except codec.DecodeError:
                booking = None  # only placers write the ledger: unreadable is no booking
        problem = booking_problem(record, booking)
        if len(self._committed) + len(self._uncommitted) > MAX_COMMIT_CHECKS:
            held = self._records.get
            self._committed = {k: r for k, r in self._committed.items() if held(k)}
            self._uncommitted = {k: c for k, c in self._uncommitted.items() if held(k)}
        if problem is None:
            self._committed[view.key] = view.revision
            return True
        self._uncommitted[view.key] = (view.revision, self._clock.monotonic())
        self._metrics.gate_ignored.inc()
        log.warning(
            "the ambiguity gate ignores a record that matches no booking",
            extra={"record": view.key, "reason": problem},
        )
        return False

    async def write(self, key: str, plan: Bind) -> bool:
        """Write ``plan``'s record at its revision (0: create it); False when someone else
        wrote first."""
        record, revision = plan.record, plan.write or 0
        self._fence("update assignment record")
        data = codec.encode(record)
        try:
            if revision:
                landed = await self._records.write(key, data, revision=revision)
            else:
                landed = await self._records.create(key, data)
        except Exception as error:
            log.warning(
                "record write outcome unknown; reading it back",
                extra={"key": key, "error": repr(error)},
            )
            # Until it is read back, the record may be bound: a chaos run bound a pod with
            # other slices beside it, and the device plugin served each from the other's record.
            self._in_doubt[key] = RecordView(key=key, revision=revision, record=record)
            current = await self._records.read(key)
            self._in_doubt.pop(key, None)
            return current is not None and current.record == record
        if landed is None:
            return False
        await self._records.remember(RecordView(key=key, revision=landed, record=record))
        return True
