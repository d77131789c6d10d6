"""The Allocate loop: read records, grant, write the record ``bound -> allocated``, answer.

Allocate (one container at a time, serialized in this process): plan with
:func:`allocate.plan_allocation`, commit the next record state by compare-and-set on the revision
it was read at, and answer the kubelet (the binder sees ``allocated`` in the record). A lost
compare-and-set means another writer (a second
plugin process, the binder) moved the record: re-read it and plan again, so no record is ever
allocated twice. When no record matches yet, Allocate waits up to ``record_wait_s`` for the
binder's write to arrive before refusing, reading this node's records afresh at its start and end
(:meth:`~services.deviceplugin.records.NodeRecords.reread`); after NATS lost its store, until the
binder restored what is bound into the new one (up to ``nats_wait_s``). A record whose GPU is
unhealthy is not granted (the next servable record is), and device IDs of GPUs no longer listed
are refused.
While a record still matches no booking (:mod:`~services.deviceplugin.commits`), its booking and the
ledger entry are read again as it waits like a missing record; then it is refused as
``uncommitted`` with the reason, counted in
``tessera_deviceplugin_allocations_total{outcome="uncommitted"}``. It never blocks a record that
does match.

Writes across NATS outages (issue 9): a write is never sent while disconnected and nothing of
it lands later (the bus never buffers writes). An Allocate that finds NATS away waits up to
``nats_wait_s`` for it to come back (a restart takes seconds; a refusal would fail the pod at
admission), then plans again; past that it is refused with nothing allocated. A write sent whose
answer never came is read back before answering (after waiting for the connection the same way);
when even that is impossible, Allocate is refused.

A refused Allocate is final: the kubelet rejects the pod at admission and never asks again for
it; the next Allocate with the same device IDs is another pod's. So a write that landed unseen
stays with its record, whose pod the kubelet rejected (it is released with that pod), and never
answers a later Allocate, which could be a pod with other slices. A record whose write failed
here is *refused*: its pod most likely failed admission, so for a while every other matching
record is served before it (``allocate.plan_allocation``'s ``refused``). Served first, it gave the
next pod of that size its slices and left that pod's own record ``bound`` for good (a
three-server chaos run); meanwhile the binder withdraws the rejected pod's record.

What it granted also goes to the state file (:mod:`~services.deviceplugin.grants`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Literal

from services.deviceplugin.commits import BOOKING_REREAD_S, CommitMirror
from services.deviceplugin.config import PluginConfig
from services.deviceplugin.grants import GrantBook
from services.deviceplugin.inventory import InventoryFollower
from services.deviceplugin.metrics import PluginMetrics
from services.deviceplugin.records import NodeRecords
from services.deviceplugin.rules import allocate
from services.deviceplugin.rules.allocate import Allocation, ContainerGrant, Refusal
from shared import codec, subjects
from shared.clock import Clock
from shared.messages.assignments import RecordView
from shared.messages.epoch import StoreRestored
from shared.runtime.bus import Bus, BusUnavailableError, OutcomeUnknownError

log = logging.getLogger(__name__)

NATS_POLL_S = 0.05
"""How often an Allocate waiting for NATS to come back looks at the connection."""

MAX_WRITE_ATTEMPTS = 16
"""Lost compare-and-sets in a row before Allocate gives up (each loss means progress elsewhere)."""

MAX_REFUSED = 64
"""Refused records remembered (the oldest is forgotten beyond it)."""

REFUSED_TTL_S = 60.0
"""How long a refused record is served last: the binder withdraws a rejected pod's record
within seconds, a placer releases it when the pod is deleted."""

ReadBack = int | None | Literal["unknown"]
"""What reading a write back found: its revision (it landed), None (it did not), or "unknown"."""


class Allocator:
    """Answers Allocate: one container after the other, each record written by compare-and-set."""

    def __init__(
        self,
        *,
        config: PluginConfig,
        bus: Bus,
        clock: Clock,
        metrics: PluginMetrics,
        records: NodeRecords,
        commits: CommitMirror,
        inventory: InventoryFollower,
        grants: GrantBook,
    ) -> None:
        self._config = config
        self._bus = bus
        self._clock = clock
        self._metrics = metrics
        self._node_records = records
        self._records = records.mirror
        self._commits = commits
        self._inventory = inventory
        self._grants = grants
        self._refused: dict[str, float] = {}
        """Records whose write failed here for a refused Allocate, with when (monotonic)."""
        self._allocate_lock = asyncio.Lock()
        self._first_epoch = bus.store_epoch
        """The store's epoch when this plugin started (``_store_restoring``)."""

    async def allocate(self, requests: Sequence[tuple[str, ...]]) -> list[ContainerGrant] | Refusal:
        started = self._clock.monotonic()
        try:
            async with self._allocate_lock:
                return await self._allocate_all(requests)
        finally:
            self._metrics.allocate_seconds.observe(self._clock.monotonic() - started)

    async def _allocate_all(
        self, requests: Sequence[tuple[str, ...]]
    ) -> list[ContainerGrant] | Refusal:
        # The kubelet sends one container per call in practice; several are answered in order.
        grants: list[ContainerGrant] = []
        for device_ids in requests:
            result = await self._allocate_container(device_ids)
            outcome = "granted" if isinstance(result, ContainerGrant) else result.kind
            self._metrics.allocations.labels(outcome=outcome).inc()
            if isinstance(result, Refusal):
                log.warning(
                    "Allocate refused",
                    extra={"reason": result.message, "device_ids": list(device_ids)[:8]},
                )
                return result
            grants.append(result)
        return grants

    async def _allocate_container(self, device_ids: tuple[str, ...]) -> ContainerGrant | Refusal:
        start = self._clock.monotonic()
        deadline = start + self._config.record_wait_s
        nats_deadline = start + self._config.nats_wait_s
        conflicts = 0
        behind = False  # the watch had not delivered what a fresh read found
        while True:
            seen = self._records.changed.version
            plan = allocate.plan_allocation(
                device_ids,
                self._records.views(),
                node=self._config.node,
                resource=self._config.resource,
                advertised=self._inventory.advertised,
                retired=self._inventory.retired,
                gpus=self._inventory.gpus,
                options=self._config.response,
                now=self._clock.now(),
                bookings=self._commits.bookings,
                refused=self._refused_keys(),
            )
            if isinstance(plan, Refusal):
                unconfirmed = self._uncommitted(len(device_ids))
                if unconfirmed and await self._commits.reread(unconfirmed):
                    continue  # the node's bookings may have lagged: plan again
                if plan.kind == "no_record" and await self._reread():
                    behind = True
                    continue  # the bucket held what the watch had not delivered: plan again
                if (plan.kind == "no_record" or unconfirmed) and not self._bus.connected:
                    # The record (or its booking) may be waiting in KV while NATS restarts: wait
                    # for the connection, then give the watches their usual time to catch up.
                    if not await self._connected_by(nats_deadline):
                        return self._not_confirmed(unconfirmed) if unconfirmed else plan
                    deadline = max(deadline, self._clock.monotonic() + self._config.record_wait_s)
                    continue
                remaining = deadline - self._clock.monotonic()
                if remaining <= 0 and plan.kind == "no_record" and await self._restoring(start):
                    # NATS lost its store: the record comes back with the binder's restore.
                    deadline = self._clock.monotonic() + self._config.record_wait_s
                    continue
                # Only a missing record (or a commit not read yet) can still arrive (the
                # binder's write may trail the kubelet's call); anything else is final.
                if (plan.kind != "no_record" and not unconfirmed) or remaining <= 0:
                    return plan
                # While some wait for their booking, read it again now and then.
                pause = min(remaining, BOOKING_REREAD_S) if unconfirmed else remaining
                changed = await self._records.changed.wait_past(seen, timeout=pause)
                if not changed and not unconfirmed:
                    if plan.kind == "no_record" and await self._reread(now=True):
                        behind = True
                        continue  # the watch stayed silent, the bucket did not: plan again
                    if plan.kind == "no_record" and await self._restoring(start):
                        deadline = self._clock.monotonic() + self._config.record_wait_s
                        continue
                    return plan
                continue
            key = plan.taken.key
            try:
                revision = await self._records.write(
                    key,
                    codec.encode(plan.record),
                    revision=plan.taken.revision,
                    seen_s=self._config.record_wait_s,
                    answered=behind,  # a silent watch would not show the write either
                )
            except BusUnavailableError:
                # Nothing was sent: wait (bounded) for NATS to come back and plan again, so a
                # NATS restart does not fail the pod at admission.
                if await self._connected_by(nats_deadline):
                    continue
                self._refuse(key)
                return Refusal(
                    kind="unavailable",
                    message=f"cannot write the assignment record {key}: not connected to NATS "
                    f"for {self._config.nats_wait_s:g} s; nothing was allocated",
                )
            except OutcomeUnknownError:
                found = await self._read_back(plan)
                if (
                    found == "unknown"
                    and not self._bus.connected
                    and await self._connected_by(nats_deadline)
                ):
                    found = await self._read_back(plan)
                if found == "unknown":
                    self._refuse(key)
                    return Refusal(
                        kind="unavailable",
                        message=f"the write of the assignment record {key} was sent but NATS "
                        "did not confirm it and it cannot be read back yet; if it landed, the "
                        "record is released with the pod this refusal fails",
                    )
                revision = found
                if revision is None:  # it did not land, and never will: plan again
                    conflicts += 1
                    if conflicts >= MAX_WRITE_ATTEMPTS:
                        return self._gave_up(key, conflicts)
                    continue
            except Exception as error:  # the bus failed otherwise: refuse, never crash
                self._refuse(key)
                return Refusal(
                    kind="unavailable",
                    message=f"cannot write the assignment record {key}: NATS "
                    f"failed ({type(error).__name__}: {error})",
                )
            if revision is None:
                conflicts += 1
                self._metrics.cas_conflicts.inc()
                if conflicts >= MAX_WRITE_ATTEMPTS:
                    return self._gave_up(key, conflicts)
                try:
                    await self._records.read(key)
                except Exception as error:  # the bus failed: refuse, never crash
                    return Refusal(
                        kind="unavailable",
                        message=f"cannot read the assignment record {key} again: NATS failed "
                        f"({type(error).__name__}: {error})",
                    )
                continue
            return await self._granted(plan, revision)

    async def _restoring(self, start: float) -> bool:
        """Whether an Allocate that started at ``start`` (monotonic) and finds no record may
        wait longer for it: NATS lost its store since this plugin started and the binder has not
        said yet that it restored what is bound into the new one (``StoreRestored`` of the
        store's epoch), and ``nats_wait_s`` has not passed. A pod bound just before the loss
        has its record back only with the restore, a second or more after the reconnect;
        refused meanwhile, it would fail at admission."""
        epoch = self._bus.store_epoch
        waited_out = self._clock.monotonic() >= start + self._config.nats_wait_s
        if epoch == self._first_epoch or waited_out:
            return False
        try:
            entry = await self._bus.kv_get(subjects.KV_META, subjects.META_RESTORED)
            restored = codec.decode(entry.value, StoreRestored) if entry is not None else None
        except (BusUnavailableError, codec.DecodeError):
            return True  # cannot tell yet: the restore is as likely as ever
        return restored is None or restored.epoch != epoch

    async def _connected_by(self, deadline: float) -> bool:
        """Wait until NATS is connected or ``deadline`` (monotonic) passes; True when connected."""
        while not self._bus.connected:
            if self._clock.monotonic() >= deadline:
                return False
            await self._clock.sleep(NATS_POLL_S)
        return True

    @staticmethod
    def _gave_up(key: str, conflicts: int) -> Refusal:
        return Refusal(
            kind="conflict",
            message=f"the assignment record {key} kept changing under {conflicts} writes in a "
            "row; nothing was allocated",
        )

    async def _granted(self, plan: Allocation, revision: int) -> ContainerGrant:
        """The write of ``plan`` landed at ``revision``: keep it (in the state file too),
        answer."""
        await self._records.remember(
            RecordView(key=plan.taken.key, revision=revision, record=plan.record)
        )
        self._grants.grant(plan.taken.key, allocate.granted_of(plan.record))
        log.info(
            "allocated",
            extra={
                "pod": f"{plan.record.namespace}/{plan.record.name}",
                "container": plan.container.container,
                "gpus": [g.uuid for g in plan.container.gpus],
                "complete": plan.complete,
            },
        )
        return plan.grant

    async def _read_back(self, plan: Allocation) -> ReadBack:
        """Whether the write of ``plan`` landed: its revision, None, or "unknown" (NATS down)."""
        key = plan.taken.key
        try:
            entry = await self._bus.kv_get(subjects.KV_ASSIGNMENTS, key)
        except Exception as error:
            log.warning(
                "cannot read a write back yet",
                extra={"key": key, "error": f"{type(error).__name__}: {error}"},
            )
            return "unknown"
        if entry is not None and entry.value == codec.encode(plan.record):
            return entry.revision
        if entry is None:
            await self._records.forget(key)
        else:
            await self._records.take(entry)
        return None

    def _refuse(self, key: str) -> None:
        """Serve record ``key`` last for a while: the pod of this refused Allocate fails."""
        self._refused.pop(key, None)
        self._refused[key] = self._clock.monotonic()
        while len(self._refused) > MAX_REFUSED:
            del self._refused[next(iter(self._refused))]

    def _refused_keys(self) -> frozenset[str]:
        """The records refused within :data:`REFUSED_TTL_S` (older ones are forgotten)."""
        if not self._refused:
            return frozenset()
        horizon = self._clock.monotonic() - REFUSED_TTL_S
        self._refused = {k: at for k, at in self._refused.items() if at >= horizon}
        return frozenset(self._refused)

    async def _reread(self, *, now: bool = False) -> bool:
        return await self._node_records.reread(now=now)

    def _not_confirmed(self, unconfirmed: Sequence[RecordView]) -> Refusal:
        """The refusal of records whose commit could not be read while NATS stayed away: the
        cause is the outage, not the records (a placer may well have committed them)."""
        keys = ", ".join(v.key for v in unconfirmed)
        return Refusal(
            kind="unavailable",
            message=f"cannot confirm the assignment record {keys}: not connected to NATS for "
            f"{self._config.nats_wait_s:g} s, and its booking in this node's ledger is not "
            "read yet; nothing was allocated",
        )

    def _uncommitted(self, count: int) -> list[RecordView]:
        """The bound records an Allocate of ``count`` devices could take that match no commit."""
        views = allocate.matching_records(
            self._records.views(), count=count, resource=self._config.resource
        )
        bookings = self._commits.bookings
        return [v for v in views if allocate.uncommitted(v, bookings=bookings)]
