"""The dashboard's state and its reducer: ``reduce(state, event) -> state``, no I/O, no clock.

The shell turns every KV entry and message it receives into one :data:`Event` and folds it in. The
state is a frozen Struct copied on write: ``reduce`` returns a new state sharing every mapping it
did not touch, so a view rendered from an older state stays valid while newer events arrive.

What each input means:

* KV ``tessera-inventory`` / ``tessera-nodes``: the latest GPUs and Kubernetes facts of a node; a
  deleted key (or ``NodeFacts.deleted``) forgets them.
* KV ``tessera-assignments``: every pod's slices and hand-off state; ``released`` records are kept
  (they order late rejections) but hold no GPU.
* ``tessera.placements.rejected``: a pod is Pending with counted reasons. It leaves the Pending
  table when it gets a record that is not released, or when it is deleted; a rejection older than
  the pod's newest record, or for a deleted pod, is stale and changes nothing.
* ``tessera.pods.pending``: a pod the binder handed to the placers; Pending ("not decided yet")
  until a placer decides or rejects it. Pods no placer takes (none running) are counted too.
* ``tessera.placements.invalid``: a pod the binder found invalid (never handed to a placer):
  Pending for good, until it is deleted.
* ``tessera.pods.deleted``: the pod is gone for good (UIDs are never reused).
* KV ``tessera-stats``: each placer's :class:`~shared.messages.stats.ClusterStats`.
* :class:`BucketSynced`: a (re)started KV watch delivered its initial values; keys the state holds
  but the bucket no longer has were deleted while nobody watched, and are dropped.

Every change bumps the version of the nodes it touches (``node_versions``) and of the Pending
table (``pending_version``), so the shell pushes only what changed. Each GPU's utilisation
readings of the last :data:`HISTORY_S` seconds (by the inventory's own clock) are kept for the
page's sparklines.
"""

from __future__ import annotations

from typing import Final, Literal

import msgspec

from shared import subjects
from shared.messages.assignments import AssignmentRecord
from shared.messages.inventory import NodeInventory
from shared.messages.nodes import NodeFacts
from shared.messages.placement import PlacementRejected, PodInvalid
from shared.messages.pods import PodDeleted, PodPending
from shared.messages.stats import ClusterStats

DELETED_MEMORY: Final = 10_000
"""Deleted pod UIDs remembered to ignore rejections that arrive after the deletion."""
HISTORY_S: Final = 600.0
"""How far back each GPU's utilisation readings are kept."""
HISTORY_POINTS: Final = 60
"""At most this many readings per GPU (the newest)."""
NOT_DECIDED: Final = "not decided by a placer yet"
INVALID: Final = "invalid request"

Bucket = Literal["inventory", "nodes", "assignments", "stats"]
PendingKind = Literal["rejected", "queued", "invalid"]


# --- events ---------------------------------------------------------------------------------


class InventoryChanged(msgspec.Struct, frozen=True, kw_only=True):
    """KV ``tessera-inventory`` changed for ``node``; ``inventory`` None = key deleted."""

    node: str
    inventory: NodeInventory | None


class FactsChanged(msgspec.Struct, frozen=True, kw_only=True):
    """KV ``tessera-nodes`` changed for ``node``; ``facts`` None = key deleted."""

    node: str
    facts: NodeFacts | None


class RecordChanged(msgspec.Struct, frozen=True, kw_only=True):
    """KV ``tessera-assignments`` key ``<node token>.<uid>`` changed; ``record`` None = deleted."""

    key: str
    record: AssignmentRecord | None


class StatsChanged(msgspec.Struct, frozen=True, kw_only=True):
    """KV ``tessera-stats`` key ``key`` changed; ``stats`` None = deleted."""

    key: str
    stats: ClusterStats | None


class PodRejected(msgspec.Struct, frozen=True, kw_only=True):
    """A placer could not place the pod now."""

    rejection: PlacementRejected


class PodQueued(msgspec.Struct, frozen=True, kw_only=True):
    """The binder handed the pod to the placers (``tessera.pods.pending``)."""

    pending: PodPending


class PodFoundInvalid(msgspec.Struct, frozen=True, kw_only=True):
    """The binder found the pod's request invalid (``tessera.placements.invalid``)."""

    invalid: PodInvalid


class PodGone(msgspec.Struct, frozen=True, kw_only=True):
    """The pod was deleted or finished."""

    deleted: PodDeleted


class BucketSynced(msgspec.Struct, frozen=True, kw_only=True):
    """A KV watch of ``bucket`` delivered its initial values: exactly ``keys`` exist now."""

    bucket: Bucket
    keys: frozenset[str]


Event = (
    InventoryChanged
    | FactsChanged
    | RecordChanged
    | StatsChanged
    | PodRejected
    | PodQueued
    | PodFoundInvalid
    | PodGone
    | BucketSynced
)


# --- state ----------------------------------------------------------------------------------


class PendingPod(msgspec.Struct, frozen=True, kw_only=True):
    """The latest rejection of a Pending pod and how long and often it was rejected.

    ``kind``: ``rejected`` by a placer (its counted reasons); ``queued``, handed to the placers
    and not decided yet (no reasons; ``first_rejected_at`` is when the pod was created);
    ``invalid``, found invalid by the binder (``rejection.message`` is its line)."""

    rejection: PlacementRejected
    first_rejected_at: float
    rejections: int = 1
    kind: PendingKind = "rejected"


class State(msgspec.Struct, frozen=True, kw_only=True):
    """Everything the dashboard knows. Never mutate: :func:`reduce` copies what it changes."""

    inventory: dict[str, NodeInventory] = {}
    facts: dict[str, NodeFacts] = {}
    records: dict[str, dict[str, AssignmentRecord]] = {}
    """Node -> record key -> record (every state, released included)."""
    record_keys_by_uid: dict[str, frozenset[str]] = {}
    pending: dict[str, PendingPod] = {}
    """Pod UID -> its Pending entry."""
    deleted: dict[str, float] = {}
    """Pod UID -> deleted_at, the latest :data:`DELETED_MEMORY` deletions in arrival order."""
    stats: dict[str, ClusterStats] = {}
    """KV key -> the statistics one placer published."""
    utilization: dict[str, tuple[tuple[float, int], ...]] = {}
    """GPU UUID -> its (observed_at, utilisation %) readings, oldest first (see HISTORY_S)."""
    node_versions: dict[str, int] = {}
    pending_version: int = 0
    stats_version: int = 0


def node_of_record_key(key: str) -> str:
    """The node a ``tessera-assignments`` key names (``<node token>.<uid>``)."""
    token, _, _ = key.partition(".")
    return subjects.node_from_token(token)


def node_key_problem(key: str, node: str) -> str | None:
    """Why a node's inventory or facts do not belong under ``key``, or None when they do."""
    if not node:
        return f"value under key {key!r} names no node"
    if subjects.node_token(node) != key:
        return f"value for node {node!r} is stored under key {key!r}"
    return None


def stats_key_problem(key: str, stats: ClusterStats) -> str | None:
    """Why a placer's statistics do not belong under ``key``, or None when they do."""
    if not stats.placer_id:
        return f"statistics under key {key!r} name no placer"
    if subjects.stats_key(stats.placer_id) != key:
        return f"statistics of placer {stats.placer_id!r} are stored under key {key!r}"
    return None


def record_key_problem(key: str, record: AssignmentRecord) -> str | None:
    """Why a record does not belong under ``key``, or None when it does."""
    expected = subjects.assignment_key(record.node, record.pod_uid) if record.node else ""
    if key != expected:
        return (
            f"record for pod {record.pod_uid} on node {record.node!r} is stored under key "
            f"{key!r}, expected {expected!r}"
        )
    return None


def live_records(state: State, node: str) -> list[AssignmentRecord]:
    """Records on ``node`` that hold GPUs (every state but ``released``)."""
    return [r for r in state.records.get(node, {}).values() if r.state != "released"]


def node_names(state: State) -> set[str]:
    """Every node the dashboard shows: known to the inventory, node facts, or holding records."""
    names = set(state.inventory) | set(state.facts)
    names.update(node for node in state.records if live_records(state, node))
    return names


def freshest_stats(state: State) -> ClusterStats | None:
    """The most recently computed statistics of any placer (replicas measure the same ledger)."""
    return max(state.stats.values(), key=lambda s: (s.computed_at, s.placer_id), default=None)


def reduce(state: State, event: Event) -> State:
    """The state after ``event``; ``state`` itself is left as it was."""
    match event:
        case InventoryChanged(node=node, inventory=inventory):
            return _remember_utilization(
                _set_node_entry(state, "inventory", node, inventory), inventory
            )
        case FactsChanged(node=node, facts=facts):
            return _set_node_entry(
                state, "facts", node, None if facts is None or facts.deleted else facts
            )
        case RecordChanged(key=key, record=record):
            return _record_changed(state, key, record)
        case StatsChanged(key=key, stats=stats):
            return _stats_changed(state, key, stats)
        case PodRejected(rejection=rejection):
            return _rejected(state, rejection)
        case PodQueued(pending=pending):
            return _queued(state, pending)
        case PodFoundInvalid(invalid=invalid):
            return _invalid(state, invalid)
        case PodGone(deleted=deleted):
            return _pod_gone(state, deleted)
        case BucketSynced(bucket=bucket, keys=keys):
            return _bucket_synced(state, bucket, keys)
    raise AssertionError(f"unknown event {event!r}")  # pragma: no cover - exhaustive match


def reduce_all(state: State, events: list[Event]) -> State:
    """Fold ``events`` in order."""
    for event in events:
        state = reduce(state, event)
    return state


# --- reducers -------------------------------------------------------------------------------


def _bump(versions: dict[str, int], nodes: set[str] | list[str]) -> dict[str, int]:
    bumped = dict(versions)
    for node in nodes:
        bumped[node] = bumped.get(node, 0) + 1
    return bumped


def _set_node_entry(
    state: State,
    field: Literal["inventory", "facts"],
    node: str,
    value: NodeInventory | NodeFacts | None,
) -> State:
    current: dict[str, NodeInventory] | dict[str, NodeFacts] = getattr(state, field)
    if value is None and node not in current:
        return state
    if value is not None and current.get(node) == value:
        return state
    updated: dict[str, object] = dict(current)
    if value is None:
        del updated[node]
    else:
        updated[node] = value
    return msgspec.structs.replace(
        state, **{field: updated}, node_versions=_bump(state.node_versions, [node])
    )


def _record_changed(state: State, key: str, record: AssignmentRecord | None) -> State:
    node = node_of_record_key(key)
    on_node = state.records.get(node, {})
    previous = on_node.get(key)
    if previous == record:
        return state
    records = dict(state.records)
    keys_by_uid = dict(state.record_keys_by_uid)
    pending = state.pending
    if record is None:
        assert previous is not None
        remaining = {k: r for k, r in on_node.items() if k != key}
        if remaining:
            records[node] = remaining
        else:
            del records[node]
        uid_keys = keys_by_uid.get(previous.pod_uid, frozenset()) - {key}
        if uid_keys:
            keys_by_uid[previous.pod_uid] = uid_keys
        else:
            keys_by_uid.pop(previous.pod_uid, None)
    else:
        records[node] = {**on_node, key: record}
        keys_by_uid[record.pod_uid] = keys_by_uid.get(record.pod_uid, frozenset()) | {key}
        if record.state != "released" and record.pod_uid in pending:
            pending = {uid: p for uid, p in pending.items() if uid != record.pod_uid}
    return msgspec.structs.replace(
        state,
        records=records,
        record_keys_by_uid=keys_by_uid,
        pending=pending,
        pending_version=state.pending_version + (pending is not state.pending),
        node_versions=_bump(state.node_versions, [node]),
    )


def _stats_changed(state: State, key: str, stats: ClusterStats | None) -> State:
    if state.stats.get(key) == stats:
        return state
    updated = dict(state.stats)
    if stats is None:
        del updated[key]
    else:
        updated[key] = stats
    before = freshest_stats(state)
    after = msgspec.structs.replace(state, stats=updated)
    now_freshest = freshest_stats(after)
    # Node views show their own fragmentation: bump the nodes whose figure changed.
    old = before.node_fragmented_milli if before else {}
    new = now_freshest.node_fragmented_milli if now_freshest else {}
    changed = [n for n in set(old) | set(new) if old.get(n) != new.get(n)]
    return msgspec.structs.replace(
        after,
        stats_version=state.stats_version + 1,
        node_versions=_bump(state.node_versions, changed) if changed else state.node_versions,
    )


def _is_stale_rejection(state: State, rejection: PlacementRejected) -> bool:
    uid = rejection.pod_uid
    if uid in state.deleted:
        return True
    for key in state.record_keys_by_uid.get(uid, frozenset()):
        record = state.records[node_of_record_key(key)][key]
        # A live record means the pod is placed; a newer released one means the rejection
        # predates the placement that was later undone.
        if record.state != "released" or record.decided_at >= rejection.decided_at:
            return True
    return False


def _rejected(state: State, rejection: PlacementRejected) -> State:
    if _is_stale_rejection(state, rejection):
        return state
    uid = rejection.pod_uid
    known = state.pending.get(uid)
    if known is None or known.kind != "rejected":
        entry = PendingPod(
            rejection=rejection,
            first_rejected_at=min(rejection.decided_at, known.first_rejected_at)
            if known is not None
            else rejection.decided_at,
        )
    elif known.rejection == rejection:  # a duplicate delivery
        return state
    else:
        newer = rejection.decided_at >= known.rejection.decided_at
        entry = PendingPod(
            rejection=rejection if newer else known.rejection,
            first_rejected_at=min(known.first_rejected_at, rejection.decided_at),
            rejections=known.rejections + 1,
        )
    return _with_pending(state, uid, entry)


def _with_pending(state: State, uid: str, entry: PendingPod) -> State:
    """``state`` with ``entry`` as pod ``uid``'s Pending entry."""
    return msgspec.structs.replace(
        state, pending={**state.pending, uid: entry}, pending_version=state.pending_version + 1
    )


def _queued(state: State, pending: PodPending) -> State:
    """A pod handed to the placers: Pending, not decided yet, unless a placer already said
    something about it (or it is placed or gone)."""
    if pending.extender or pending.uid in state.pending:
        return state
    waiting = PlacementRejected(
        pod_uid=pending.uid,
        namespace=pending.namespace,
        name=pending.name,
        reasons=(),
        message=NOT_DECIDED,
        decided_at=pending.created_at,
        placer_id="",
    )
    if _is_stale_rejection(state, waiting):
        return state
    entry = PendingPod(rejection=waiting, first_rejected_at=pending.created_at, kind="queued")
    return _with_pending(state, pending.uid, entry)


def _invalid(state: State, invalid: PodInvalid) -> State:
    """A pod the binder found invalid: Pending (for good) with the binder's line."""
    if invalid.pod_uid in state.deleted:
        return state
    known = state.pending.get(invalid.pod_uid)
    if known is not None and known.kind == "invalid" and known.rejection.message == invalid.message:
        return state
    verdict = PlacementRejected(
        pod_uid=invalid.pod_uid,
        namespace=invalid.namespace,
        name=invalid.name,
        reasons=(),
        message=invalid.message,
        unresolvable=True,
        decided_at=invalid.at,
        placer_id="",
    )
    entry = PendingPod(
        rejection=verdict,
        first_rejected_at=known.first_rejected_at if known is not None else invalid.at,
        kind="invalid",
    )
    return _with_pending(state, invalid.pod_uid, entry)


def _remember_utilization(state: State, inventory: NodeInventory | None) -> State:
    """Add the inventory's utilisation readings to each GPU's history (newer readings only),
    dropping those older than :data:`HISTORY_S` before the newest."""
    if inventory is None:
        return state
    at = inventory.observed_at
    updated = dict(state.utilization)
    for gpu in inventory.gpus:
        history = updated.get(gpu.uuid, ())
        if history and history[-1][0] >= at:
            continue
        kept = tuple(p for p in history if p[0] >= at - HISTORY_S)
        updated[gpu.uuid] = (*kept, (at, gpu.utilization_pct))[-HISTORY_POINTS:]
    return msgspec.structs.replace(state, utilization=updated)


def _pod_gone(state: State, deleted: PodDeleted) -> State:
    uid = deleted.uid
    if uid in state.deleted and uid not in state.pending:
        return state
    remembered = {**state.deleted, uid: deleted.deleted_at}
    while len(remembered) > DELETED_MEMORY:
        del remembered[next(iter(remembered))]
    if uid not in state.pending:
        return msgspec.structs.replace(state, deleted=remembered)
    return msgspec.structs.replace(
        state,
        deleted=remembered,
        pending={u: p for u, p in state.pending.items() if u != uid},
        pending_version=state.pending_version + 1,
    )


def _bucket_synced(state: State, bucket: Bucket, keys: frozenset[str]) -> State:
    if bucket == "inventory":
        for node in [n for n in state.inventory if subjects.node_token(n) not in keys]:
            state = _set_node_entry(state, "inventory", node, None)
    elif bucket == "nodes":
        for node in [n for n in state.facts if subjects.node_token(n) not in keys]:
            state = _set_node_entry(state, "facts", node, None)
    elif bucket == "assignments":
        gone = [k for records in state.records.values() for k in records if k not in keys]
        for key in gone:
            state = _record_changed(state, key, None)
    else:
        for key in [k for k in state.stats if k not in keys]:
            state = _stats_changed(state, key, None)
    return state
