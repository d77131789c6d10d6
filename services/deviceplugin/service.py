"""The device plugin's shell: gathers records and inventory, calls the pure cores, carries out.

Inputs, both kept in memory and fed from NATS:

- the assignment records of this node, from a KV watch on ``tessera-assignments`` (keys
  ``<node>.*``). Each revision is decoded and checked with ``shared.validation`` (its key, its
  values, the node's inventory, and that it only moved forward from the last version accepted);
  one that fails is dead-lettered with the reason and forgotten: never served, never blocking a
  valid one. Checks against the inventory run again whenever the inventory changes;
- this node's inventory, from the ``tessera-inventory`` KV entry (key: the node token) and the
  ``tessera.inventory.<node>`` subject; decoded at the edge and judged by the one inventory rule
  of ``shared.validation.take_inventory`` (malformed, another node's, dated ahead of this clock,
  absurd values -> dead letter, never a crash; the same producer's next sequence or else the
  fresher snapshot wins, so no forged snapshot outlives the inventory's next heartbeat). A
  device list too large for the kubelet is refused before it is built.

Allocate (one container at a time, serialized in this process): plan with
:func:`allocate.plan_allocation`, commit the next record state by compare-and-set on the revision
it was read at, answer the kubelet and publish the :class:`AllocationEvent` to
``tessera.allocations.<node>`` beside the answer (retried until JetStream acknowledges it, and
waited for at shutdown). A lost compare-and-set means another writer (a second plugin
process, the binder) moved the record: re-read it and plan again, so no record is ever claimed
twice. When no record matches yet, Allocate waits up to ``record_wait_s`` for the binder's write
to arrive before refusing, reading this node's records afresh at its start and end (a watch on
a NATS cluster can go silent for seconds: ``_reread_records``). The record in the KV bucket is
the source of truth, so the kubelet never waits for the event, and a publish that fails never
fails an Allocate already committed. A record whose GPU is unhealthy is not granted (the next
servable record is), and device IDs of GPUs no longer listed are refused.

Only what a placer committed is granted (issue 19; ``shared.commits``): the pod's claim in
``tessera-claims`` must name the record's commit, and this node's entry in ``tessera-ledger``
must book it with the same slices. Neither is read on the Allocate path: the node's ledger entry
is mirrored by a KV watch, and a pod's claim is read when its record first arrives (placers write
the claim before the record, and the record long before the kubelet's Allocate). While a record
still matches no commit at Allocate, its claim and the ledger entry are read again (every
``CLAIM_REREAD_S``) as it waits like a missing record (``record_wait_s``); then it is refused as
``uncommitted`` with the reason, counted in
``tessera_deviceplugin_allocations_total{outcome="uncommitted"}``. It never blocks a record that
does match.

Claims across NATS outages (issue 9): a claim is never sent while disconnected and nothing of
it lands later (the bus never buffers writes). An Allocate that finds NATS away waits up to
``nats_wait_s`` for it to come back (a restart takes seconds; a refusal would fail the pod at
admission), then plans again; past that it is refused with nothing claimed. A claim sent whose
answer never came is read back before answering (after waiting for the connection the same way);
when even that is impossible, Allocate is refused and the claim is kept as *unconfirmed*: the
kubelet's retry with the same device IDs reads the record again and gets the answer the claim
would have given (granted if it landed, planned afresh if not).

All state lives here, not in the gRPC server, so a kubelet restart (new socket, new registration)
loses nothing. What it granted also goes to a state file (:mod:`~services.deviceplugin.grants`),
loaded before any record is taken, so that after a restart of the plugin itself a record moved
backwards (``allocated -> bound``) is refused rather than granted twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
from collections.abc import AsyncIterator, Sequence
from typing import Literal

import msgspec

from services.deviceplugin import allocate, devices, preferred
from services.deviceplugin.allocate import Allocation, ContainerGrant, Refusal
from services.deviceplugin.config import PluginConfig
from services.deviceplugin.devices import Device, DeviceConfig
from services.deviceplugin.grants import GrantFile, state_file
from services.deviceplugin.kubelet import KubeletLink
from services.deviceplugin.metrics import PluginMetrics
from services.deviceplugin.server import (
    GrpcPluginServer,
    PluginOptions,
    PreferenceRequest,
    register,
)
from shared import codec, subjects, validation
from shared.clock import Clock
from shared.messages.allocations import AllocationEvent
from shared.messages.assignments import AssignmentRecord, RecordView
from shared.messages.inventory import GpuTelemetry, NodeInventory
from shared.messages.ledger import NodeLedger, PodClaim
from shared.runtime.bus import Bus, BusUnavailableError, Delivery, KvEntry, OutcomeUnknownError
from shared.runtime.edge import Edge
from shared.runtime.follow import follow
from shared.runtime.health import Readiness
from shared.runtime.lifecycle import ServiceContext
from shared.runtime.tasks import ChangeCounter, finish

log = logging.getLogger(__name__)

"""Pause before watching a KV bucket again after the server ended a watch."""

EVENT_FLUSH_S = 5.0
"""How long a stopping plugin waits for allocation events still being published."""

NATS_POLL_S = 0.05
"""How often an Allocate waiting for NATS to come back looks at the connection."""

MAX_CLAIM_ATTEMPTS = 16
"""Lost compare-and-sets in a row before Allocate gives up (each loss means progress elsewhere)."""

MAX_UNCONFIRMED = 64
"""Unconfirmed claims remembered for the kubelet's retry (the oldest is dropped beyond it)."""

UNCONFIRMED_TTL_S = 30.0
"""How long an unconfirmed claim answers a retry. A retry comes within seconds; later, the same
device IDs are more likely another pod's, which must not get this record's slices."""

CLAIM_REREAD_S = 0.25
"""An Allocate reads a pod's claim (and the ledger entry) again only when it was last read longer
ago than this."""

GRANTS_WRITE_DELAY_S = 0.05
"""How long grants gather before the state file is written: a burst of Allocates costs one write
(each write hands a thread a file to replace: under a busy disk, up to milliseconds)."""

RECORD_REREAD_S = 0.5
"""An Allocate that finds no record reads this node's records afresh at most this often."""

RECORD_READ_TIMEOUT_S = 1.0
"""How long one fresh read of the records may take."""

CLAIM_RETRY_S = 1.0
"""How long before claims NATS could not give are read again."""
MAX_CLAIMS_AT_ONCE = 32
"""Claims read together when records arrive in a burst."""

MAX_CLAIM_REREADS = 8
"""Claims one Allocate reads again at most (made-up records must not make it slow)."""

SAME_NODE_LIMITS = validation.InventoryLimits(max_future_s=60.0)
"""The inventory is produced on this node, by this node's clock: a minute ahead is already a lie."""

ReadBack = int | None | Literal["unknown"]
"""What reading a claim back found: its revision (it landed), None (it did not), or "unknown"."""


def _record_delivery(key: str, data: bytes) -> Delivery:
    """A KV entry of the assignments bucket, as the edge sees a delivery."""
    return Delivery(subject=f"$KV.{subjects.KV_ASSIGNMENTS}.{key}", data=data)


class DevicePluginService:
    """The plugin's state and behaviour (implements ``server.PluginCore``)."""

    def __init__(
        self,
        *,
        config: PluginConfig,
        bus: Bus,
        edge: Edge,
        clock: Clock,
        metrics: PluginMetrics,
        readiness: Readiness,
        grants: GrantFile,
    ) -> None:
        self._config = config
        self._bus = bus
        self._edge = edge
        self._clock = clock
        self._metrics = metrics
        self._readiness = readiness
        self._records: dict[str, RecordView] = {}
        """Records that may be served (accepted, not released)."""
        self._accepted: dict[str, RecordView] = {}
        """The last version accepted of every key, released ones included: what a rewrite is
        checked against (kept when a rewrite is refused)."""
        self._rejected: dict[str, int] = {}
        """Key -> the revision last dead-lettered, so a re-read does not dead-letter it twice."""
        self._grants = grants
        self._given = grants.load()
        """What this plugin granted (kept across its restarts), by record key."""
        self._grants_dirty = asyncio.Event()
        self._grants_changed = 0
        self._writing: asyncio.Future[bool] | None = None
        self._unconfirmed: dict[tuple[str, ...], tuple[Allocation, float]] = {}
        """Claims sent whose outcome could not be read back, by their sorted device IDs, with
        when (monotonic) they were sent."""
        self._records_changed = ChangeCounter()
        self._inventory: NodeInventory | None = None
        self._gpus: dict[str, GpuTelemetry] = {}
        self._devices: tuple[Device, ...] = ()
        self._gpu_of: dict[str, str] = {}
        self._advertised: set[str] = set()
        self._memory_unit: int | None = None
        """Memory-units mode with the unit unset: the unit chosen on the first inventory."""
        self._device_problem: str | None = None
        """Why the inventory's devices cannot be advertised (logged once per new reason)."""
        self._retired: set[str] = set()
        """Device IDs advertised before and no longer (their GPU left the inventory)."""
        self._devices_changed = ChangeCounter()
        self._ledger: NodeLedger | None = None
        """This node's entry in ``tessera-ledger`` (every booking on the node)."""
        self._claims: dict[str, PodClaim] = {}
        """The claims (``tessera-claims``) of pods with a record here, by pod UID."""
        self._claim_read_at: dict[str, float] = {}
        """When (monotonic) each pod's claim was last read."""
        self._claims_wanted: asyncio.Queue[str] = asyncio.Queue()
        self._ledger_read_at = -math.inf
        """When (monotonic) an Allocate last read the ledger entry itself."""
        self._records_read_at = -math.inf
        """When (monotonic) an Allocate last read this node's records afresh."""
        self._allocate_lock = asyncio.Lock()
        self._publishing: set[asyncio.Task[None]] = set()
        readiness.set("inventory", False, f"no inventory received for node {config.node} yet")
        readiness.set("records", False, "loading assignment records")
        readiness.set("ledger", False, "loading this node's ledger entry")
        metrics.inventory_age_seconds.set_function(self._inventory_age)
        metrics.count_records_with(lambda: [view.record.state for view in self._records.values()])

    # --- what the gRPC server asks -------------------------------------------------------------

    @property
    def options(self) -> PluginOptions:
        return PluginOptions(pre_start_required=self._config.pre_start)

    @property
    def devices(self) -> tuple[Device, ...]:
        return self._devices

    @property
    def inventory(self) -> NodeInventory | None:
        """The inventory in use (for tests and debugging)."""
        return self._inventory

    @property
    def held_records(self) -> tuple[RecordView, ...]:
        """The records Allocate may serve (for tests and debugging)."""
        return tuple(self._records.values())

    async def device_lists(self) -> AsyncIterator[tuple[Device, ...]]:
        while True:
            version = self._devices_changed.version
            yield self._devices
            await self._devices_changed.wait_past(version)

    def preferred(self, requests: Sequence[PreferenceRequest]) -> list[tuple[str, ...]]:
        answers = []
        servable = allocate.committed(
            self._records.values(), claims=self._claims, ledger=self._ledger
        )
        for request in requests:
            view = allocate.pick_record(
                servable, count=request.size, resource=self._config.resource
            )
            container = (
                allocate.next_container(view.record, self._config.resource) if view else None
            )
            decided = tuple(s.uuid for s in container.gpus) if container else ()
            answers.append(
                preferred.prefer(
                    request.available,
                    request.must_include,
                    request.size,
                    decided_gpus=decided,
                    gpu_of=self._gpu_of,
                )
            )
        return answers

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

    async def pre_start(self, device_ids: tuple[str, ...]) -> Refusal | None:
        return allocate.pre_start_check(device_ids, self._records.values(), gpus=self._gpus)

    # --- Allocate, one container -------------------------------------------------------------

    async def _allocate_container(self, device_ids: tuple[str, ...]) -> ContainerGrant | Refusal:
        answer = await self._resolve_unconfirmed(device_ids)
        if answer is not None:
            return answer
        start = self._clock.monotonic()
        deadline = start + self._config.record_wait_s
        nats_deadline = start + self._config.nats_wait_s
        conflicts = 0
        while True:
            seen = self._records_changed.version
            plan = allocate.plan_allocation(
                device_ids,
                self._records.values(),
                node=self._config.node,
                resource=self._config.resource,
                advertised=self._advertised,
                retired=self._retired,
                gpus=self._gpus,
                options=self._config.response,
                now=self._clock.now(),
                plugin_id=self._config.plugin_id,
                claims=self._claims,
                ledger=self._ledger,
            )
            if isinstance(plan, Refusal):
                unconfirmed = self._uncommitted(len(device_ids))
                if unconfirmed and await self._reread_commits(unconfirmed):
                    continue  # a claim or the ledger entry may have lagged: plan again
                if plan.kind == "no_record" and await self._reread_records():
                    continue  # the bucket held what the watch had not delivered: plan again
                if (plan.kind == "no_record" or unconfirmed) and not self._bus.connected:
                    # The record (or its claim) may be waiting in KV while NATS restarts: wait
                    # for the connection, then give the watches their usual time to catch up.
                    if not await self._connected_by(nats_deadline):
                        return plan
                    deadline = max(deadline, self._clock.monotonic() + self._config.record_wait_s)
                    continue
                remaining = deadline - self._clock.monotonic()
                # Only a missing record (or a commit not read yet) can still arrive (the
                # binder's write may trail the kubelet's call); anything else is final.
                if (plan.kind != "no_record" and not unconfirmed) or remaining <= 0:
                    return plan
                # Claims are not watched: while some wait, read them again now and then.
                pause = min(remaining, CLAIM_REREAD_S) if unconfirmed else remaining
                changed = await self._records_changed.wait_past(seen, timeout=pause)
                if not changed and not unconfirmed:
                    if plan.kind == "no_record" and await self._reread_records(now=True):
                        continue  # the watch stayed silent, the bucket did not: plan again
                    return plan
                continue
            key = plan.claimed.key
            try:
                revision = await self._bus.kv_update(
                    subjects.KV_ASSIGNMENTS,
                    key,
                    codec.encode(plan.record),
                    revision=plan.claimed.revision,
                )
            except BusUnavailableError:
                # Nothing was sent: wait (bounded) for NATS to come back and plan again, so a
                # NATS restart does not fail the pod at admission.
                if await self._connected_by(nats_deadline):
                    continue
                return Refusal(
                    kind="unavailable",
                    message=f"cannot claim the assignment record {key}: not connected to NATS "
                    f"for {self._config.nats_wait_s:g} s; nothing was claimed",
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
                    self._remember_unconfirmed(device_ids, plan)
                    return Refusal(
                        kind="unavailable",
                        message=f"the claim of the assignment record {key} was sent but NATS "
                        "did not confirm it and it cannot be read back yet; a retry with the "
                        "same devices gets the answer",
                    )
                revision = found
                if revision is None:  # it did not land, and never will: plan again
                    conflicts += 1
                    if conflicts >= MAX_CLAIM_ATTEMPTS:
                        return self._gave_up(key, conflicts)
                    continue
            except Exception as error:  # the bus failed otherwise: refuse, never crash
                return Refusal(
                    kind="unavailable",
                    message=f"cannot claim the assignment record {key}: NATS "
                    f"failed ({type(error).__name__}: {error})",
                )
            if revision is None:
                conflicts += 1
                self._metrics.cas_conflicts.inc()
                if conflicts >= MAX_CLAIM_ATTEMPTS:
                    return self._gave_up(key, conflicts)
                try:
                    await self._reread(key)
                except Exception as error:  # the bus failed: refuse, never crash
                    return Refusal(
                        kind="unavailable",
                        message=f"cannot read the assignment record {key} again: NATS failed "
                        f"({type(error).__name__}: {error})",
                    )
                continue
            return await self._granted(plan, revision)

    def _forget_grants(self, keys: set[str]) -> None:
        """Released or gone: what was granted of these records is free again."""
        gone = keys & set(self._given)
        for key in gone:
            del self._given[key]
        if gone:
            self._save_grants()

    def _save_grants(self) -> None:
        """Have the state file written (by :meth:`keep_grants`, off the Allocate path)."""
        self._grants_changed += 1
        self._grants_dirty.set()

    async def keep_grants(self) -> None:
        """Write the state file of grants whenever they changed, in a worker thread, the changes
        of :data:`GRANTS_WRITE_DELAY_S` in one write."""
        while True:
            await self._grants_dirty.wait()
            await self._clock.sleep(GRANTS_WRITE_DELAY_S)
            self._grants_dirty.clear()
            snapshot, generation = dict(self._given), self._grants_changed
            self._writing = asyncio.ensure_future(
                asyncio.to_thread(self._grants.save, snapshot, generation)
            )
            if not await asyncio.shield(self._writing):
                self._metrics.grant_file_failures.inc()

    async def write_grants(self) -> None:
        """At stop: let a write in progress end, then write what is not written yet."""
        if self._writing is not None:
            await asyncio.wait({self._writing})
        if self._grants_dirty.is_set():
            self._grants_dirty.clear()
            if not self._grants.save(self._given, self._grants_changed):
                self._metrics.grant_file_failures.inc()

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
            message=f"the assignment record {key} kept changing under {conflicts} claims in a "
            "row; nothing was claimed",
        )

    async def _granted(self, plan: Allocation, revision: int) -> ContainerGrant:
        """The claim of ``plan`` is committed at ``revision``: keep it (in the state file too),
        publish, answer."""
        await self._remember(
            RecordView(key=plan.claimed.key, revision=revision, record=plan.record)
        )
        self._given[plan.claimed.key] = allocate.granted_of(plan.record)
        self._save_grants()
        self._publish(plan.event)
        log.info(
            "allocated",
            extra={
                "pod": f"{plan.record.namespace}/{plan.record.name}",
                "container": plan.container.container,
                "gpus": list(plan.event.gpu_uuids),
                "complete": plan.complete,
            },
        )
        return plan.grant

    async def _read_back(self, plan: Allocation) -> ReadBack:
        """Whether the claim of ``plan`` landed: its revision, None, or "unknown" (NATS down)."""
        key = plan.claimed.key
        try:
            entry = await self._bus.kv_get(subjects.KV_ASSIGNMENTS, key)
        except Exception as error:
            log.warning(
                "cannot read a claim back yet",
                extra={"key": key, "error": f"{type(error).__name__}: {error}"},
            )
            return "unknown"
        if entry is not None and entry.value == codec.encode(plan.record):
            return entry.revision
        if entry is None:
            await self._forget(key)
        else:
            await self._apply_record_entry(entry)
        return None

    def _remember_unconfirmed(
        self, device_ids: tuple[str, ...], plan: Allocation, sent_at: float | None = None
    ) -> None:
        sent = self._clock.monotonic() if sent_at is None else sent_at
        self._unconfirmed[tuple(sorted(device_ids))] = (plan, sent)
        while len(self._unconfirmed) > MAX_UNCONFIRMED:
            del self._unconfirmed[next(iter(self._unconfirmed))]

    async def _resolve_unconfirmed(
        self, device_ids: tuple[str, ...]
    ) -> ContainerGrant | Refusal | None:
        """The answer to a retry of an unconfirmed claim, or None to plan afresh."""
        unconfirmed = self._unconfirmed.pop(tuple(sorted(device_ids)), None)
        if unconfirmed is None:
            return None
        plan, sent_at = unconfirmed
        if self._clock.monotonic() - sent_at > UNCONFIRMED_TTL_S:
            log.warning(
                "an unconfirmed claim expired before a retry",
                extra={"key": plan.claimed.key, "device_ids": list(device_ids)[:8]},
            )
            return None
        found = await self._read_back(plan)
        if found == "unknown":
            self._remember_unconfirmed(device_ids, plan, sent_at)
            return Refusal(
                kind="unavailable",
                message=f"the earlier claim of the assignment record {plan.claimed.key} for "
                "these devices still cannot be read back from NATS",
            )
        if found is None:
            return None
        log.info("an unconfirmed claim had landed; answering the retry with it")
        return await self._granted(plan, found)

    async def _reread(self, key: str) -> None:
        entry = await self._bus.kv_get(subjects.KV_ASSIGNMENTS, key)
        if entry is None:
            await self._forget(key)
            return
        await self._apply_record_entry(entry)

    def _publish(self, event: AllocationEvent) -> None:
        """Publish ``event`` beside the answer: the record is already committed, so the kubelet
        need not wait for JetStream's acknowledgement; failures are retried until it comes."""
        task = asyncio.create_task(self._publish_until_done(event))
        self._publishing.add(task)
        self._metrics.events_unpublished.set(len(self._publishing))
        task.add_done_callback(self._published)

    def _published(self, task: asyncio.Task[None]) -> None:
        self._publishing.discard(task)
        self._metrics.events_unpublished.set(len(self._publishing))

    async def _publish_until_done(self, event: AllocationEvent) -> None:
        delay = 0.5
        while True:
            try:
                await self._bus.js_publish(
                    subjects.allocations(self._config.node),
                    codec.encode(event),
                    msg_id=allocate.allocation_message_id(event),
                )
                return
            except Exception as error:  # keep trying: the binder waits for this event
                log.warning(
                    "allocation event not published yet; retrying",
                    extra={
                        "pod_uid": event.pod_uid,
                        "error": f"{type(error).__name__}: {error}",
                        "retry_s": delay,
                    },
                )
            await self._clock.sleep(delay)
            delay = min(delay * 2, 10.0)

    async def flush(self, timeout: float) -> int:
        """Wait up to ``timeout`` for events still being published; how many remain."""
        pending = set(self._publishing)
        if pending:
            _, still = await asyncio.wait(pending, timeout=timeout)
            pending = set(still)
            for task in pending:
                task.cancel()
            if pending:
                log.error("allocation events lost at shutdown", extra={"events": len(pending)})
        return len(pending)

    # --- assignment records --------------------------------------------------------------------

    async def follow_records(self) -> None:
        """Mirror this node's assignment records from the KV bucket, forever."""
        await follow(
            self._bus,
            subjects.KV_ASSIGNMENTS,
            keys=subjects.assignment_keys_of(self._config.node),
            on_entry=self._on_record_entry,
            on_loaded=self._records_loaded,
            clock=self._clock,
            what="assignment record",
        )

    async def _on_record_entry(self, entry: KvEntry) -> None:
        if entry.deleted:
            await self._deleted(entry.key)
        else:
            await self._apply_record_entry(entry)

    async def _records_loaded(self, listed: set[str]) -> None:
        for key in set(self._accepted) - listed:
            await self._deleted(key)  # gone while no watch was running
        self._forget_grants(set(self._given) - listed)
        self._readiness.set("records", True)
        log.info("assignment records loaded", extra={"records": len(self._records)})

    async def _apply_record_entry(self, entry: KvEntry) -> None:
        key, revision = entry.key, entry.revision
        known = self._accepted.get(key)
        if known is not None and known.revision >= revision:
            return  # already taken (our own compare-and-set stored this revision or a later one)
        if self._rejected.get(key) == revision:
            return  # already dead-lettered
        delivery = _record_delivery(key, entry.value)
        record = await self._edge.accept(delivery, AssignmentRecord, family="assignments")
        if record is None:
            self._rejected[key] = revision
            await self._forget(key)
            return
        problem = (
            validation.assignment_problem(record, key=key, inventory=self._inventory)
            or validation.transition_problem(known.record if known else None, record)
            or allocate.granted_problem(record, self._given.get(key))
        )
        if problem:
            await self._refuse(key, revision, delivery, problem)
            return
        self._rejected.pop(key, None)
        await self._remember(RecordView(key=key, revision=revision, record=record))

    async def _refuse(self, key: str, revision: int, delivery: Delivery, problem: str) -> None:
        """Dead-letter this revision of ``key`` with ``problem`` and stop serving the key."""
        self._rejected[key] = revision
        await self._edge.reject(
            delivery,
            family="assignments",
            reason=f"assignment record {key} revision {revision}: {problem}",
            kind="validate",
        )
        await self._forget(key)

    async def _remember(self, view: RecordView) -> None:
        known = self._accepted.get(view.key)
        if known is not None and known.revision >= view.revision:
            return  # our own compare-and-set already stored this revision (or a later one)
        self._accepted[view.key] = view
        if view.record.state == "released":
            self._records.pop(view.key, None)
            self._forget_grants({view.key})
        else:
            self._records[view.key] = view
            self._want_claim(view.record)
        await self._records_changed.bump()

    # --- commits: this node's ledger entry and the pods' claims --------------------------------

    def _want_claim(self, record: AssignmentRecord) -> None:
        """Have the pod's claim read unless the one held already names the record's commit."""
        if record.state not in ("reserved", "bound"):
            return
        claim = self._claims.get(record.pod_uid)
        if claim is None or claim.booking is None or claim.booking.commit != record.commit:
            self._claims_wanted.put_nowait(record.pod_uid)

    async def follow_commits(self) -> None:
        """Mirror this node's ledger entry and read the claims of the pods recorded here."""
        async with asyncio.TaskGroup() as group:
            group.create_task(self._follow_ledger(), name="ledger")
            group.create_task(self._read_wanted_claims(), name="claims")

    async def _follow_ledger(self) -> None:
        async def on_entry(entry: KvEntry) -> None:
            await self._take_ledger(None if entry.deleted else entry)

        async def on_loaded(listed: set[str]) -> None:
            if not listed:  # none now (deleted while no watch was running)
                await self._take_ledger(None)
            self._readiness.set("ledger", True)

        await follow(
            self._bus,
            subjects.KV_LEDGER,
            keys=subjects.ledger_key(self._config.node),
            on_entry=on_entry,
            on_loaded=on_loaded,
            clock=self._clock,
            what="ledger",
        )

    async def _take_ledger(self, entry: KvEntry | None) -> None:
        ledger = None
        if entry is not None:
            delivery = Delivery(subject=f"$KV.{subjects.KV_LEDGER}.{entry.key}", data=entry.value)
            ledger = await self._edge.accept(delivery, NodeLedger, family="ledger")
            if ledger is None or ledger.node != self._config.node:
                return  # undecodable (dead-lettered), or not this node's: keep what we hold
        self._ledger = ledger
        await self._records_changed.bump()

    async def _read_wanted_claims(self) -> None:
        """Read the wanted claims, those wanted at once together (a burst of records is read in
        a few round trips, not one after the other)."""
        while True:
            wanted = [await self._claims_wanted.get()]
            while not self._claims_wanted.empty() and len(wanted) < MAX_CLAIMS_AT_ONCE:
                wanted.append(self._claims_wanted.get_nowait())
            wanted = list(dict.fromkeys(wanted))
            while wanted:
                results = await asyncio.gather(
                    *(self._read_claim(uid) for uid in wanted), return_exceptions=True
                )
                errors = [r for r in results if isinstance(r, BaseException)]
                if errors:  # NATS away: the Allocate path reads them again too
                    log.warning(
                        "cannot read pods' claims yet",
                        extra={"pods": len(errors), "error": f"{type(errors[0]).__name__}"},
                    )
                    await self._clock.sleep(CLAIM_RETRY_S)
                wanted = [u for u, r in zip(wanted, results, strict=True) if r is not None]

    async def _read_claim(self, uid: str) -> None:
        self._claim_read_at[uid] = self._clock.monotonic()
        entry = await self._bus.kv_get(subjects.KV_CLAIMS, subjects.claim_key(uid))
        claim = None
        if entry is not None:
            delivery = Delivery(subject=f"$KV.{subjects.KV_CLAIMS}.{entry.key}", data=entry.value)
            claim = await self._edge.accept(delivery, PodClaim, family="claims")
        if claim is None or claim.pod_uid != uid:
            self._claims.pop(uid, None)
        else:
            self._claims[uid] = claim
        await self._records_changed.bump()

    def _uncommitted(self, count: int) -> list[RecordView]:
        """The bound records an Allocate of ``count`` devices could take that match no commit."""
        views = allocate.matching_records(
            self._records.values(), count=count, resource=self._config.resource
        )
        return [
            v for v in views if allocate.uncommitted(v, claims=self._claims, ledger=self._ledger)
        ]

    async def _reread_records(self, *, now: bool = False) -> bool:
        """Read this node's records afresh (a new watch's initial values), at most every
        :data:`RECORD_REREAD_S` unless ``now``; whether that took anything the standing watch
        had not delivered.

        A pod reaches the kubelet only once its record is bound in the bucket, so a record
        missing at Allocate is one the standing watch has not delivered yet: on a NATS cluster
        whose server holding the watch's consumer died, the watch stays silent until nats-py
        notices (``shared.runtime.bus.WATCH_HEARTBEAT_S``), and a fresh one is read at once."""
        started = self._clock.monotonic()
        if not self._bus.connected or (
            not now and started - self._records_read_at < RECORD_REREAD_S
        ):
            return False
        self._records_read_at = started
        seen = self._records_changed.version
        watch = self._bus.kv_watch(
            subjects.KV_ASSIGNMENTS, subjects.assignment_keys_of(self._config.node)
        )
        try:
            async with asyncio.timeout(RECORD_READ_TIMEOUT_S):
                async for entry in watch:
                    if entry is None:
                        break
                    if not entry.deleted:  # deletions are the standing watch's to apply
                        await self._apply_record_entry(entry)
        except Exception as error:  # NATS away or slow: wait for the watch as before
            log.warning(
                "cannot read records again", extra={"error": f"{type(error).__name__}: {error}"}
            )
        finally:
            with contextlib.suppress(Exception):
                await watch.aclose()
        taken = self._records_changed.version != seen
        if taken:
            self._metrics.records_reread.inc()
            log.warning("the records watch had not delivered records a fresh read found")
        return taken

    async def _reread_commits(self, views: Sequence[RecordView]) -> bool:
        """Read again the ledger entry and the claims of ``views`` not read in the last
        :data:`CLAIM_REREAD_S` (at most :data:`MAX_CLAIM_REREADS` claims); whether it read any."""
        now = self._clock.monotonic()
        uids = [
            v.record.pod_uid
            for v in views
            if now - self._claim_read_at.get(v.record.pod_uid, -math.inf) >= CLAIM_REREAD_S
        ][:MAX_CLAIM_REREADS]
        ledger_due = now - self._ledger_read_at >= CLAIM_REREAD_S
        if not uids and not ledger_due:
            return False
        try:
            if ledger_due:
                self._ledger_read_at = now
                entry = await self._bus.kv_get(
                    subjects.KV_LEDGER, subjects.ledger_key(self._config.node)
                )
                await self._take_ledger(entry)
            for uid in uids:
                await self._read_claim(uid)
        except Exception as error:  # NATS away: plan with what is held
            log.warning(
                "cannot read commits again", extra={"error": f"{type(error).__name__}: {error}"}
            )
        return True

    async def _forget(self, key: str) -> None:
        """Stop serving ``key`` (the last accepted version stays the reference for rewrites)."""
        if self._records.pop(key, None) is not None:
            await self._records_changed.bump()

    async def _deleted(self, key: str) -> None:
        """The key is gone from the bucket: forget everything about it."""
        known = self._accepted.get(key)
        if known is not None:
            self._claims.pop(known.record.pod_uid, None)
            self._claim_read_at.pop(known.record.pod_uid, None)
        self._forget_grants({key})
        self._accepted.pop(key, None)
        self._rejected.pop(key, None)
        await self._forget(key)

    async def _revalidate_records(self, inventory: NodeInventory) -> None:
        """Dead-letter and forget records the new inventory makes impossible."""
        for key, view in list(self._records.items()):
            problem = validation.record_inventory_problem(view.record, inventory)
            if problem is not None:
                delivery = _record_delivery(key, codec.encode(view.record))
                await self._refuse(key, view.revision, delivery, problem)

    def _inventory_age(self) -> float:
        inventory = self._inventory
        return self._clock.now() - inventory.observed_at if inventory else math.nan

    # --- inventory -----------------------------------------------------------------------------

    async def follow_inventory(self) -> None:
        """Take this node's inventory from the subject and the KV bucket, forever."""
        node = self._config.node
        await self._bus.subscribe(subjects.inventory(node), self._on_inventory)

        async def on_entry(entry: KvEntry) -> None:
            if not entry.deleted:
                subject = f"$KV.{subjects.KV_INVENTORY}.{entry.key}"
                await self._on_inventory(Delivery(subject=subject, data=entry.value))

        await follow(
            self._bus,
            subjects.KV_INVENTORY,
            keys=subjects.node_token(node),
            on_entry=on_entry,
            clock=self._clock,
            what="inventory",
        )

    async def _on_inventory(self, delivery: Delivery) -> None:
        inventory = await self._edge.accept(delivery, NodeInventory, family="inventory")
        if inventory is None:
            return
        verdict = validation.take_inventory(
            inventory,
            self._inventory,
            node=self._config.node,
            now=self._clock.now(),
            limits=SAME_NODE_LIMITS,
        )
        if verdict.problem:
            await self._edge.reject(
                delivery, family="inventory", reason=verdict.problem, kind="validate"
            )
            if self._inventory is None:
                self._readiness.set("inventory", False, f"inventory rejected: {verdict.problem}")
            return
        if verdict.take is not None:  # else older than what is held (KV and subject race)
            await self._apply_inventory(verdict.take)

    async def _apply_inventory(self, inventory: NodeInventory) -> None:
        self._inventory = inventory
        self._gpus = {gpu.uuid: gpu for gpu in inventory.gpus}
        self._readiness.set("inventory", True)
        await self._revalidate_records(inventory)
        config = self._device_config(inventory)
        problem = devices.inventory_size_problem(inventory, config)
        advertised = () if problem else devices.advertise(inventory, config)
        if advertised == self._devices and problem == self._device_problem:
            return
        if problem is not None and problem != self._device_problem:
            log.error(problem)
        self._device_problem = problem
        unit = f" of {config.memory_unit_mib} MiB" if config.mode == "memory-units" else ""
        self._readiness.set(
            "devices", problem is None, problem or f"{len(advertised)} devices{unit}"
        )
        self._devices = advertised
        self._gpu_of = devices.gpu_of(advertised)
        current = set(self._gpu_of)
        self._retired = (self._retired | self._advertised) - current
        self._advertised = current
        healthy = sum(1 for d in advertised if d.healthy)
        self._metrics.count_devices(healthy, len(advertised) - healthy)
        log.info(
            "device list changed",
            extra={"devices": len(advertised), "unhealthy": len(advertised) - healthy},
        )
        await self._devices_changed.bump()

    def _device_config(self, inventory: NodeInventory) -> DeviceConfig:
        """The device configuration, with the memory unit chosen when it is unset: on the
        first inventory, then kept (the kubelet's accounting must not change under running
        pods). Which unit, and what it means, is logged."""
        config = self._config.devices
        if config.mode != "memory-units" or config.memory_unit_mib != devices.AUTO_UNIT:
            return config
        if self._memory_unit is None:
            self._memory_unit = unit = devices.choose_memory_unit(inventory, config)
            total = sum(gpu.memory_total_mib for gpu in inventory.gpus)
            if unit == 1:
                log.info(
                    "memory unit 1 MiB: one device per MiB of GPU memory",
                    extra={"memory_unit_mib": 1, "gpu_memory_mib": total},
                )
            else:
                log.warning(
                    f"memory unit {unit} MiB chosen: {total} MiB of GPU memory in 1-MiB devices "
                    "would not fit the kubelet's 4 MiB ListAndWatch message. Pods still ask "
                    "tessera.dev/gpu-memory in MiB and the kubelet hands one device per MiB "
                    f"asked, so this node offers {total // unit} MiB of its GPU memory; use "
                    "logical mode to offer all of it",
                    extra={"memory_unit_mib": unit, "gpu_memory_mib": total},
                )
        return msgspec.structs.replace(config, memory_unit_mib=self._memory_unit)


async def run_plugin(context: ServiceContext, config: PluginConfig) -> None:
    """The service body: follow records and inventory, keep the kubelet link, until cancelled."""
    metrics = PluginMetrics.create(context.registry)
    service = DevicePluginService(
        config=config,
        bus=context.bus,
        edge=context.edge,
        clock=context.clock,
        metrics=metrics,
        readiness=context.readiness,
        grants=GrantFile(state_file(config.plugin_dir, config.endpoint)),
    )

    def report(registered: bool, reason: str) -> None:
        context.readiness.set("kubelet", registered, reason)
        metrics.registered.set(1 if registered else 0)
        if registered:
            metrics.registrations.inc()

    # Not ready until registered: without this check the other checks could pass before the
    # link first reports, and /readyz would say ready before the plugin socket is served.
    report(False, "not registered with the kubelet yet")

    link = KubeletLink(
        plugin_dir=config.plugin_dir,
        endpoint=config.endpoint,
        server=GrpcPluginServer(service),
        register=functools.partial(
            register, endpoint=config.endpoint, resource=config.resource, options=service.options
        ),
        clock=context.clock,
        poll_s=config.kubelet_poll_s,
        report=report,
    )
    log.info(
        "device plugin starting",
        extra={
            "node": config.node,
            "mode": config.devices.mode,
            "resource": config.resource,
            "socket": str(link.plugin_socket),
            "isolation": config.response.isolation,
        },
    )
    try:
        async with asyncio.TaskGroup() as group:
            group.create_task(service.follow_records(), name="records")
            group.create_task(service.follow_inventory(), name="inventory")
            group.create_task(service.follow_commits(), name="commits")
            group.create_task(service.keep_grants(), name="grants")
            group.create_task(link.run(), name="kubelet")
    finally:
        await finish(service.write_grants())
        # Before run_service drains the bus: events of committed claims must still go out.
        await finish(service.flush(timeout=EVENT_FLUSH_S))
