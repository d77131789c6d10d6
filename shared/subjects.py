"""Every NATS subject, JetStream stream and KV bucket name Tessera uses, in one place.

Services build subjects only through these helpers so that a rename is a one-line change and an
operator can read the whole map here:

    tessera.inventory.<node>      inventory -> placer, deviceplugin (+ KV ``tessera-inventory``)
    tessera.nodes.<node>          binder -> placer                (+ KV ``tessera-nodes``)
    tessera.pods.pending          binder -> placer                (stream ``TESSERA_PODS``)
    tessera.pods.deleted          binder -> placer                (stream ``TESSERA_PODS``)
    tessera.pods.restore          binder -> placer                (stream ``TESSERA_PODS``)
    tessera.placements.rejected   placer -> binder                (stream ``TESSERA_PLACEMENTS``)
    tessera.placements.invalid    binder -> dashboard: a pod that cannot be placed as written
    tessera.bindings.<node>       binder -> placer: failed or gone (stream ``TESSERA_BINDINGS``)
    tessera.bindings.<node>.bound binder -> placer's extender: bound (core NATS: no stream
                                  keeps them, only an extender waiting for its bind uses them)
    tessera.deadletter.<family>   any service, for rejected input (stream ``TESSERA_DEADLETTER``)
    tessera.extender.pods         placer's extender -> binder, request/reply (no stream)
    tessera.placer.explain        tessera explain -> placers, request/reply (no stream)
    KV ``tessera-stats``          placer -> dashboard: each placer's latest ``ClusterStats``

The hand-off from a placement to a container has no stream: a placer's commit (a booking and the
pod's claim, below) is the binder's work, and the assignment record the device plugin's.

KV buckets (latest state): ``tessera-inventory`` and ``tessera-nodes`` keyed by node token;
``tessera-ledger`` (placer: each pod's booking under its node, ``book.<node>.<pod uid>``, and under
``claim.<pod uid>`` each pod's claim naming the one commit that placed it: one bucket, so that a
booking and its claim can be written by one atomic batch; the binder binds placed claims);
``tessera-assignments`` keyed ``<node>.<pod uid>`` (the hand-off record, written ``bound`` by the
binder, ``allocated`` by the device plugin); ``tessera-tenants``
(placer: one entry per tenant with a quota, its charges, updated by compare-and-set);
``tessera-waiting`` (placer: one entry per pod a replica holds waiting for room, the board every
replica reads to keep seed 002's order); ``tessera-meta`` (the store's epoch, created with the
streams, and the binder's word that what is bound was restored into this epoch's store);
``tessera-namespaces`` (binder: each namespace's labels under its name, and under
``_listed`` its word that every namespace is there: what resolves the namespace selector of a
pod the placer reads from kube-scheduler rather than from the binder).

Node names are DNS subdomains and may contain dots, which NATS treats as token separators; every
node segment therefore goes through :func:`node_token`, which maps ``.`` to ``_`` (a character node
names cannot contain, so the mapping is reversible).
"""

from __future__ import annotations

import re
from typing import Final, Literal

ROOT: Final = "tessera"

Family = Literal["inventory", "nodes", "pods", "placements", "bindings"]
FAMILIES: Final[tuple[Family, ...]] = ("inventory", "nodes", "pods", "placements", "bindings")

# --- subjects -------------------------------------------------------------------------------

PODS_PENDING: Final = f"{ROOT}.pods.pending"
PODS_DELETED: Final = f"{ROOT}.pods.deleted"
PODS_RESTORE: Final = f"{ROOT}.pods.restore"
"""A bound pod's placement, restored from the Kubernetes API into a store that lost it."""
PODS_ALL: Final = f"{ROOT}.pods.>"
PLACEMENTS_REJECTED: Final = f"{ROOT}.placements.rejected"
PLACEMENTS_INVALID: Final = f"{ROOT}.placements.invalid"
"""The binder's verdict on a pod whose request cannot be placed as written (never published as
pending); the dashboard counts it Pending. In ``TESSERA_PLACEMENTS`` beside the rejections."""
PLACEMENTS_ALL: Final = f"{ROOT}.placements.>"
INVENTORY_ALL: Final = f"{ROOT}.inventory.*"
NODES_ALL: Final = f"{ROOT}.nodes.*"
BINDINGS_ALL: Final = f"{ROOT}.bindings.*"
"""The binding results ``TESSERA_BINDINGS`` keeps: those the placer acts on (failed, gone)."""
BINDING_RESULTS_ALL: Final = f"{ROOT}.bindings.>"
"""Every binding result, bound ones included (what the extender follows)."""
DEADLETTER_ALL: Final = f"{ROOT}.deadletter.>"
PLACER_EXPLAIN: Final = f"{ROOT}.placer.explain"
"""Request/reply: ``tessera explain NAMESPACE/POD`` asks every placer replica; those that know the
pod answer (outside every stream)."""
GRANTS_ALL: Final = f"{ROOT}.grants.*"
"""Request/reply, per node (:func:`grants`): what a node's device plugin records it granted, asked
by the binder before it restores placements into a store that lost them (outside every
stream)."""
EXTENDER_PODS: Final = f"{ROOT}.extender.pods"
"""Request/reply: the extender asks the binder for the pod it binds (outside every stream: the
pods stream captures ``tessera.pods.>``)."""


def node_token(node: str) -> str:
    """Return ``node`` as a single NATS subject token (and KV key token)."""
    if not node:
        raise ValueError("node name must not be empty")
    return node.replace(".", "_")


def node_from_token(token: str) -> str:
    """Invert :func:`node_token`."""
    return token.replace("_", ".")


def inventory(node: str) -> str:
    """Subject carrying the GPU inventory of ``node``."""
    return f"{ROOT}.inventory.{node_token(node)}"


def grants(node: str) -> str:
    """Request/reply subject of what ``node``'s device plugin granted (``GRANTS_ALL``)."""
    return f"{ROOT}.grants.{node_token(node)}"


def nodes(node: str) -> str:
    """Subject carrying the Kubernetes facts (CPU, memory, labels, readiness) of ``node``."""
    return f"{ROOT}.nodes.{node_token(node)}"


def bindings(node: str) -> str:
    """Subject carrying the binder's failed and gone results for pods on ``node`` (stored)."""
    return f"{ROOT}.bindings.{node_token(node)}"


def bound(node: str) -> str:
    """Subject carrying the binder's bound results for pods on ``node`` (not stored: the placer
    has nothing to do for a bound pod, and its record says it is bound)."""
    return f"{bindings(node)}.bound"


def deadletter(family: str) -> str:
    """Subject where rejected input of ``family`` is republished with its reason."""
    return f"{ROOT}.deadletter.{family}"


# --- JetStream streams ----------------------------------------------------------------------

STREAM_PODS: Final = "TESSERA_PODS"
STREAM_PLACEMENTS: Final = "TESSERA_PLACEMENTS"
STREAM_BINDINGS: Final = "TESSERA_BINDINGS"
STREAM_DEADLETTER: Final = "TESSERA_DEADLETTER"

#: Stream name -> the subjects it captures. Creation is idempotent (``shared.runtime.nats.store``).
STREAMS: Final[dict[str, tuple[str, ...]]] = {
    STREAM_PODS: (PODS_ALL,),
    STREAM_PLACEMENTS: (PLACEMENTS_ALL,),
    STREAM_BINDINGS: (BINDINGS_ALL,),
    STREAM_DEADLETTER: (DEADLETTER_ALL,),
}

#: Streams whose messages go once acknowledged (their one consumer per subject has them): pods
#: are work for the placers' shared durable consumer, so the stream holds only what is not done.
WORK_QUEUE_STREAMS: Final = frozenset({STREAM_PODS})

#: Stream name -> the age (seconds) after which its messages go. Their consumers take them within
#: seconds; the limit only keeps a long-running cluster's store from growing without end.
STREAM_MAX_AGE_S: Final[dict[str, float]] = {
    STREAM_PLACEMENTS: 24 * 3600.0,
    STREAM_BINDINGS: 24 * 3600.0,
    STREAM_DEADLETTER: 7 * 24 * 3600.0,
}

# --- durable consumers -------------------------------------------------------------------------

DURABLE_PLACER_PODS: Final = "placer"
"""Every placer replica's shared consumer of ``TESSERA_PODS``."""
DURABLE_PLACER_BINDINGS: Final = "placer-bindings"
"""The placers' consumer of ``TESSERA_BINDINGS``."""
DURABLE_BINDER_REJECTIONS: Final = "binder-rejections"

# --- KV buckets -----------------------------------------------------------------------------

KV_INVENTORY: Final = "tessera-inventory"
KV_NODES: Final = "tessera-nodes"
KV_LEDGER: Final = "tessera-ledger"
"""Each pod's booking on its node (key :func:`booking_key`) and each pod's claim (key
:func:`claim_key`)."""
KV_CLAIMS: Final = KV_LEDGER
"""The pods' claims share the ledger's bucket, under keys of their own, so that a booking and
the claims it makes are written by one atomic batch (``Bus.kv_write_all``)."""
KV_ASSIGNMENTS: Final = "tessera-assignments"
KV_STATS: Final = "tessera-stats"
KV_TENANTS: Final = "tessera-tenants"
KV_WAITING: Final = "tessera-waiting"
KV_POOLS: Final = "tessera-placer-pools"
"""The placers' node pool leases and members (``shared/messages/pools.py``)."""
KV_META: Final = "tessera-meta"
"""The store itself: its epoch (``META_EPOCH``) and whether what is bound was restored into it
(``META_RESTORED``)."""
META_EPOCH: Final = "epoch"
META_RESTORED: Final = "restored"
KV_NAMESPACES: Final = "tessera-namespaces"
"""Every namespace's labels (binder -> the placers' extenders): key the namespace's name."""
NAMESPACES_LISTED: Final = "_listed"
"""The key (bucket ``tessera-namespaces``) of the binder's word that every namespace is listed
(no namespace is named so: names have no ``_``)."""
KV_CLAIM_CLASSES: Final = "tessera-claim-classes"
"""The device classes each ResourceClaim and ResourceClaimTemplate asks for (binder -> the
webhook, which defaults and checks the scheduler of pods naming them): key
:func:`claim_class_key`, and under ``_listed`` (:data:`CLAIM_CLASSES_LISTED`) the binder's word
that every one is there."""
CLAIM_CLASSES_LISTED: Final = "_listed"

#: Bucket name -> how many revisions of each key it keeps.
KV_BUCKETS: Final[dict[str, int]] = {
    KV_INVENTORY: 1,
    KV_NODES: 1,
    KV_LEDGER: 5,
    KV_ASSIGNMENTS: 5,
    KV_STATS: 1,
    KV_TENANTS: 5,
    KV_WAITING: 1,
    KV_POOLS: 1,
    KV_META: 1,
    KV_NAMESPACES: 1,
    KV_CLAIM_CLASSES: 1,
}


def assignment_key(node: str, pod_uid: str) -> str:
    """KV key of the assignment record of pod ``pod_uid`` on ``node``: ``<node>.<uid>``."""
    return f"{node_token(node)}.{pod_uid}"


def assignment_keys_of(node: str) -> str:
    """KV key filter matching every assignment record on ``node``."""
    return f"{node_token(node)}.*"


def claim_class_key(kind: str, namespace: str, name: str) -> str:
    """KV key (bucket ``tessera-claim-classes``) of a ResourceClaim (``kind`` ``claim``) or a
    ResourceClaimTemplate (``template``): ``<kind>.<namespace>.<name>`` (a Kubernetes name's
    dots stay: the namespace, a DNS label, has none, so the key reads back unambiguously)."""
    return f"{kind}.{namespace}.{name}"


def stats_key(placer_id: str) -> str:
    """KV key (bucket ``tessera-stats``) of the cluster statistics placer ``placer_id`` publishes.

    One key per placer replica, so replicas never contend for it; readers take the freshest.
    Dots become ``_`` as in :func:`node_token`, so the key is a single token.
    """
    if not placer_id:
        raise ValueError("placer id must not be empty")
    return placer_id.replace(".", "_")


def booking_key(node: str, pod_uid: str) -> str:
    """KV key of pod ``pod_uid``'s booking on ``node`` in ``tessera-ledger``:
    ``book.<node>.<uid>``. A node's bookings are the keys :func:`node_bookings` matches, and a
    booking is written only if none of them changed since it was decided (``KvWrite.guard``):
    the node's bookings change as one entry would, yet each write holds one booking."""
    if not pod_uid:
        raise ValueError("pod uid must not be empty")
    return f"{_BOOKING_PREFIX}{node_token(node)}.{pod_uid}"


def node_bookings(node: str) -> str:
    """KV key filter matching every booking on ``node`` in ``tessera-ledger``."""
    return f"{_BOOKING_PREFIX}{node_token(node)}.*"


def booking_of_key(key: str) -> tuple[str, str]:
    """Invert :func:`booking_key`: (node, pod UID); ValueError for a key that is not one."""
    booking = booked_at(key)
    if booking is None:
        raise ValueError(f"not a booking key: {key!r}")
    return booking


def booked_at(key: str) -> tuple[str, str] | None:
    """(node, pod UID) of a booking key; None for another key of the bucket (a pod's claim)."""
    tokens = key.split(".")
    if len(tokens) != 3 or f"{tokens[0]}." != _BOOKING_PREFIX or not all(tokens[1:]):
        return None
    return node_from_token(tokens[1]), tokens[2]


_BOOKING_PREFIX: Final = "book."
BOOKING_KEYS: Final = "book.*.*"
"""KV key filter matching every booking in ``tessera-ledger`` (no pod's claim)."""

LEGACY_LEDGER_KEYS: Final = "*"
"""KV key filter matching the whole-node ledger entries of earlier versions (one token, a node
name: a :class:`~shared.messages.ledger.NodeLedger` listing every booking on the node). A
placer turns each into booking keys before it is ready (``Store.convert_legacy_ledgers``)."""


_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def tenant_key(tenant: str) -> str:
    """KV key of ``tenant``'s entry in ``tessera-tenants`` (what counts against its quota).

    A tenant is a namespace (a DNS label, used as it is) or a ``tessera.dev/tenant`` label value,
    which may hold characters a key cannot (or two dots in a row): those are written as ``_`` and
    the name's UTF-8 in hex, which no namespace can collide with (namespaces have no ``_``).
    """
    if not tenant:
        raise ValueError("tenant must not be empty")
    if _DNS_LABEL.fullmatch(tenant):
        return tenant
    return "_" + tenant.encode().hex()


def waiting_key(pod_uid: str) -> str:
    """KV key of pod ``pod_uid``'s entry on the waiting board (``tessera-waiting``)."""
    if not pod_uid:
        raise ValueError("pod uid must not be empty")
    return pod_uid


def pool_key(pool: int) -> str:
    """KV key (bucket ``tessera-placer-pools``) of pool ``pool``'s lease: ``pool.<n>``."""
    if pool < 0:
        raise ValueError("pool must not be negative")
    return f"pool.{pool}"


def pool_member_key(placer_id: str) -> str:
    """KV key (bucket ``tessera-placer-pools``) of a replica's membership: ``member.<id>``,
    the id written as in :func:`stats_key`."""
    return f"member.{stats_key(placer_id)}"


def claim_key(pod_uid: str) -> str:
    """KV key of pod ``pod_uid``'s claim (which commit placed it) in ``tessera-ledger``:
    ``claim.<uid>``, two tokens, never a node's key."""
    if not pod_uid:
        raise ValueError("pod uid must not be empty")
    return f"{_CLAIM_PREFIX}{pod_uid}"


_CLAIM_PREFIX: Final = "claim."
CLAIM_KEYS: Final = "claim.*"
"""KV key filter matching every pod's claim in ``tessera-ledger``."""


def claim_uid(key: str) -> str:
    """Invert :func:`claim_key`."""
    return key.removeprefix(_CLAIM_PREFIX)
