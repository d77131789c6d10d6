"""Least privilege on the bus: what each Tessera identity may publish and subscribe to (pure).

docs/design.md §11: one NATS identity per service, and per node for the per-node services, with
subject permissions. This module is the one place the permission table is written; it is built
from the names in :mod:`shared.subjects`, so a renamed subject or a new bucket changes the
permissions with it. Everything that configures a NATS server derives from it: ``tessera up``
(:func:`server_authorization`), the Helm chart (its ``files/nats-permissions.conf``, written by
``tessera nats-permissions`` and checked against this module by the tests), and the tests that
run every service against a real ``nats-server`` holding exactly these permissions.

Roles and what they may write (reads are listed in :func:`permissions`)::

    placer        KV tessera-ledger (bookings and claims), -tenants, -waiting, -stats,
                  -assignments (fence released records, restore lost ones);
                  tessera.placements.rejected, tessera.pods.pending (a requeued pod);
                  request tessera.extender.pods; answers tessera.placer.explain; may update
                  stream configurations
    binder        KV tessera-assignments (write the record bound), tessera-nodes,
                  tessera-meta.restored, tessera-namespaces, tessera-claim-classes;
                  tessera.nodes.<node>,
                  tessera.pods.pending / .deleted / .restore, tessera.placements.invalid,
                  tessera.bindings.<node>; answers tessera.extender.pods; requests
                  tessera.grants.<node>
    deviceplugin  KV tessera-assignments.<its node>.* (bound -> allocated); answers
                  tessera.grants.<its node>
    inventory     KV tessera-inventory.<its node>; tessera.inventory.<its node>
    dashboard     nothing (reads only)
    webhook       nothing (reads the inventories, the cluster's GPUs, and the claims'
                  device classes)

Every role may publish dead letters, read the streams' and buckets' information and the store's
epoch (``tessera-meta.epoch``), create a missing stream or bucket (never change or delete one: only
the placer may update a configuration), and receive on its own inbox prefix
``_INBOX.<role>[.<node>]`` (:func:`inbox_prefix`), so no identity can read the replies meant for
another. Only the roles that create the store (:data:`STORE_CREATORS`: the placer and the binder,
which restores a lost store) may write its epoch, a create that the first of them after a store loss
wins: NATS cannot grant "create only", and a node's identity allowed to write the epoch could
overwrite it, making every service believe at its next reconnect that the store was lost. The others
read it, and wait for it on a new store. JetStream calls are scoped to the streams and the durable
consumers a role uses: ``$JS.API.CONSUMER.*`` on the streams and buckets it reads,
``$JS.ACK.<stream>.<durable>.>`` for its own durables, ``$JS.FC.<bucket stream>.>`` for the flow
control of its KV watches.

A per-node role built with ``node=None`` (one identity shared by every node's process) gets the
same rights on every node: ``*`` stands for the node token. What NATS cannot scope: reads of a KV
bucket (a watch's filter and a get's key travel in the request body) are per bucket, so a device
plugin can read other nodes' records; and a ``Nats-Msg-Id`` is de-duplicated per stream, so an
identity that may publish to a stream can shadow another's message id there for two minutes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Final, Literal

import msgspec

from shared import subjects

Role = Literal["placer", "binder", "deviceplugin", "inventory", "dashboard", "webhook"]
ROLES: Final[tuple[Role, ...]] = (
    "placer",
    "binder",
    "deviceplugin",
    "inventory",
    "dashboard",
    "webhook",
)
NODE_ROLES: Final[frozenset[Role]] = frozenset({"deviceplugin", "inventory"})
"""Roles run once per node (DaemonSets): their rights name their node."""

TOPOLOGY_OWNERS: Final[frozenset[Role]] = frozenset({"placer"})
"""Roles that may change an existing stream's or bucket's configuration."""

STORE_CREATORS: Final[frozenset[Role]] = frozenset({"placer", "binder"})
"""Roles that may give a new store its epoch (``tessera-meta.epoch``); every other reads it."""

ANY_NODE: Final = "*"
NODE_PLACEHOLDER: Final = "__NODE__"
"""Stands for a node token in :func:`chart_variables` (no node name can produce it: node names are
lower case)."""


class Permissions(msgspec.Struct, frozen=True, kw_only=True):
    """One identity's NATS subject permissions (allow lists; everything else is denied)."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    allow_responses: bool = False
    """May publish to the reply subject of a request it received (and nowhere else by it)."""


def is_role(name: str) -> bool:
    return name in ROLES


def _node(node: str | None) -> str:
    if node is None:
        return ANY_NODE
    if node == NODE_PLACEHOLDER:
        return node
    return subjects.node_token(node)


def inbox_prefix(role: str, node: str | None = None) -> str:
    """The reply-subject prefix of a process of ``role`` (on ``node``): only it may listen there."""
    base = f"_INBOX.{role}"
    return base if node is None else f"{base}.{_node(node)}"


def may_update_topology(role: str) -> bool:
    """Whether ``role`` may change an existing stream's or bucket's configuration."""
    return role in TOPOLOGY_OWNERS


def creates_store(role: str) -> bool:
    """Whether ``role`` may give a new store its epoch (:data:`STORE_CREATORS`)."""
    return role in STORE_CREATORS


def _inbox_grant(role: Role, node: str | None) -> str:
    return f"{inbox_prefix(role, node)}.>"


# --- JetStream building blocks ------------------------------------------------------------------

_API: Final = "$JS.API"


def kv_stream(bucket: str) -> str:
    """The JetStream stream behind KV bucket ``bucket``."""
    return f"KV_{bucket}"


def _kv_write(bucket: str, keys: str = ">") -> list[str]:
    # A put, create, compare-and-set and delete are all publishes to the key's subject.
    return [f"$KV.{bucket}.{keys}"]


def _kv_read(*buckets: str) -> list[str]:
    grants = []
    for stream in map(kv_stream, buckets):
        grants += [
            f"{_API}.STREAM.MSG.GET.{stream}",  # get (the key is in the request body)
            f"{_API}.CONSUMER.CREATE.{stream}",  # a watch: an ordered consumer (filter in body)
            f"{_API}.CONSUMER.INFO.{stream}.*",
            f"{_API}.CONSUMER.DELETE.{stream}.*",
            f"$JS.FC.{stream}.>",  # the watch's flow control answers
        ]
    return grants


def _kv_batched(*buckets: str) -> list[str]:
    # A batched watch asks its own consumer for what changed (``NatsBus.kv_watch``). Only the
    # placers batch, and only on buckets no other role reads by asking: one that asked a
    # placer's consumer would take the changes that placer waits for.
    return [f"{_API}.CONSUMER.MSG.NEXT.{kv_stream(bucket)}.*" for bucket in buckets]


def _durable(stream: str, durable: str) -> list[str]:
    return [
        f"{_API}.CONSUMER.INFO.{stream}.{durable}",
        f"{_API}.CONSUMER.CREATE.{stream}.{durable}.>",
        f"{_API}.CONSUMER.MSG.NEXT.{stream}.{durable}",
        f"$JS.ACK.{stream}.{durable}.>",  # ack, nak, term, in progress
    ]


def _all_streams() -> list[str]:
    return [*subjects.STREAMS, *(kv_stream(bucket) for bucket in subjects.KV_BUCKETS)]


def _topology(role: Role) -> list[str]:
    # Also the store's epoch: every role reads it after each reconnect (shared.messages.epoch;
    # a get, no watch), and only the store's creators may write it (the first after a loss).
    # Any stream's info (read-only metadata) in one grant rather than one per stream: the grants
    # travel in a per-node user JWT, which nats-server takes only under its 4 KiB control line.
    grants = [
        f"{_API}.STREAM.MSG.GET.{kv_stream(subjects.KV_META)}",
        f"{_API}.STREAM.INFO.*",
    ]
    if creates_store(role):
        grants += _kv_write(subjects.KV_META, subjects.META_EPOCH)
    for stream in _all_streams():
        grants.append(f"{_API}.STREAM.CREATE.{stream}")
        if role in TOPOLOGY_OWNERS:
            grants.append(f"{_API}.STREAM.UPDATE.{stream}")
    return grants


# --- the table ------------------------------------------------------------------------------------


def _placer() -> tuple[list[str], list[str]]:
    publish = [
        *_kv_write(subjects.KV_LEDGER),  # the claims too (subjects.KV_CLAIMS)
        *_kv_write(subjects.KV_TENANTS),
        *_kv_write(subjects.KV_WAITING),
        *_kv_write(subjects.KV_POOLS),
        *_kv_write(subjects.KV_STATS),
        *_kv_write(subjects.KV_ASSIGNMENTS),
        subjects.PLACEMENTS_REJECTED,
        subjects.PODS_PENDING,
        subjects.EXTENDER_PODS,
        *_durable(subjects.STREAM_PODS, subjects.DURABLE_PLACER_PODS),
        *_durable(subjects.STREAM_BINDINGS, subjects.DURABLE_PLACER_BINDINGS),
        *_kv_batched(subjects.KV_LEDGER, subjects.KV_ASSIGNMENTS),
        *_kv_read(
            subjects.KV_INVENTORY,
            subjects.KV_NODES,
            subjects.KV_LEDGER,  # the claims too
            subjects.KV_ASSIGNMENTS,
            subjects.KV_TENANTS,
            subjects.KV_WAITING,
            subjects.KV_POOLS,
            subjects.KV_META,  # whether the binder restored a lost store
            subjects.KV_NAMESPACES,  # the extender's namespace selectors
        ),
    ]
    # The extender waits for its pods' results; `tessera explain` asks the placers.
    return publish, [subjects.BINDING_RESULTS_ALL, subjects.PLACER_EXPLAIN]


def _binder() -> tuple[list[str], list[str]]:
    publish = [
        *_kv_write(subjects.KV_ASSIGNMENTS),
        *_kv_write(subjects.KV_NODES),
        subjects.NODES_ALL,
        subjects.PODS_PENDING,
        subjects.PODS_DELETED,
        # What is bound, restored into a store that lost it, and its word that it is done.
        subjects.PODS_RESTORE,
        *_kv_write(subjects.KV_META, subjects.META_RESTORED),
        *_kv_write(subjects.KV_NAMESPACES),
        *_kv_write(subjects.KV_CLAIM_CLASSES),
        subjects.PLACEMENTS_INVALID,
        subjects.BINDING_RESULTS_ALL,
        # Before a restore: what each node's device plugin granted (request/reply).
        subjects.GRANTS_ALL,
        *_durable(subjects.STREAM_PLACEMENTS, subjects.DURABLE_BINDER_REJECTIONS),
        # The claims (its work) and the bookings (the gate waits only for records matching one).
        # The namespaces and claim classes: what a new leader finds published, to write only
        # what changed. The
        # inventory: the ResourceSlices of nodes in DRA mode (docs/design.md §14).
        *_kv_read(
            subjects.KV_ASSIGNMENTS,
            subjects.KV_NODES,
            subjects.KV_LEDGER,
            subjects.KV_NAMESPACES,
            subjects.KV_INVENTORY,
            subjects.KV_CLAIM_CLASSES,
        ),
    ]
    return publish, [subjects.EXTENDER_PODS]


def _deviceplugin(node: str) -> tuple[list[str], list[str]]:
    publish = [
        *_kv_write(subjects.KV_ASSIGNMENTS, f"{node}.*"),
        # Its records, its inventory, and the bookings a record must match (the ledger).
        *_kv_read(subjects.KV_ASSIGNMENTS, subjects.KV_INVENTORY, subjects.KV_LEDGER),
    ]
    # What it granted, asked by the binder before a restore.
    return publish, [f"{subjects.ROOT}.inventory.{node}", f"{subjects.ROOT}.grants.{node}"]


def _inventory(node: str) -> tuple[list[str], list[str]]:
    publish = [
        *_kv_write(subjects.KV_INVENTORY, node),
        f"{subjects.ROOT}.inventory.{node}",
        *_kv_read(subjects.KV_INVENTORY),
    ]
    return publish, []


def _dashboard() -> tuple[list[str], list[str]]:
    publish = _kv_read(
        subjects.KV_INVENTORY, subjects.KV_NODES, subjects.KV_ASSIGNMENTS, subjects.KV_STATS
    )
    return publish, [
        subjects.PLACEMENTS_REJECTED,
        subjects.PLACEMENTS_INVALID,
        subjects.PODS_PENDING,
        subjects.PODS_DELETED,
    ]


def _webhook() -> tuple[list[str], list[str]]:
    return _kv_read(subjects.KV_INVENTORY, subjects.KV_CLAIM_CLASSES), []


def _unique(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


def permissions(role: Role, node: str | None = None) -> Permissions:
    """The permissions of ``role``; for a per-node role, on ``node`` (None: on every node).

    Raises ValueError for a node given to a role that is not per node.
    """
    if node is not None and role not in NODE_ROLES:
        raise ValueError(f"role {role} is not per node")
    token = _node(node)
    if role == "placer":
        publish, subscribe = _placer()
    elif role == "binder":
        publish, subscribe = _binder()
    elif role == "deviceplugin":
        publish, subscribe = _deviceplugin(token)
    elif role == "inventory":
        publish, subscribe = _inventory(token)
    elif role == "webhook":
        publish, subscribe = _webhook()
    else:
        publish, subscribe = _dashboard()
    return Permissions(
        publish=_unique([*publish, *_topology(role), subjects.DEADLETTER_ALL]),
        subscribe=_unique([*subscribe, _inbox_grant(role, node if role in NODE_ROLES else None)]),
        allow_responses=role in ("binder", "placer", "deviceplugin"),
    )


# --- identities and server configuration -----------------------------------------------------


def user_name(role: str, node: str | None = None) -> str:
    """The NATS user of ``role`` (on ``node``, for a per-node identity)."""
    return role if node is None else f"{role}.{subjects.node_token(node)}"


class User(msgspec.Struct, frozen=True, kw_only=True):
    """A NATS user for :func:`server_authorization`; ``permissions=None`` means everything."""

    name: str
    password: str
    permissions: Permissions | None


def _quoted(text: str) -> str:
    # NATS configuration strings take JSON's escapes; quoted, "$KV..." is never a variable.
    return json.dumps(text)


def _allow(subjects_allowed: Sequence[str]) -> str:
    return "{ allow: [" + ", ".join(_quoted(s) for s in subjects_allowed) + "] }"


def permissions_block(grant: Permissions) -> str:
    """``grant`` in nats-server configuration syntax (a map for a user's ``permissions``)."""
    parts = [f"publish: {_allow(grant.publish)}", f"subscribe: {_allow(grant.subscribe)}"]
    if grant.allow_responses:
        parts.append("allow_responses: true")
    return "{ " + ", ".join(parts) + " }"


def server_authorization(users: Sequence[User]) -> str:
    """The nats-server ``authorization`` block admitting exactly ``users``."""
    lines = ["authorization {", "  users = ["]
    for user in users:
        fields = [f"user: {_quoted(user.name)}", f"password: {_quoted(user.password)}"]
        if user.permissions is not None:
            fields.append(f"permissions: {permissions_block(user.permissions)}")
        lines.append("    { " + ", ".join(fields) + " }")
    lines += ["  ]", "}"]
    return "\n".join(lines) + "\n"


CHART_FILE_HEADER: Final = (
    "# Generated by `tessera nats-permissions` from shared/permissions.py; do not edit.\n"
    "# One nats-server configuration variable per Tessera role: its subject permissions.\n"
    f"# {NODE_PLACEHOLDER} stands for the node token of a per-node role.\n"
)


def variable(role: str) -> str:
    """The nats-server configuration variable holding ``role``'s permissions in the chart."""
    return "PERMISSIONS_" + role.upper()


def _per_role(role: Role) -> Permissions:
    return permissions(role, NODE_PLACEHOLDER if role in NODE_ROLES else None)


def chart_variables() -> str:
    """Every role's permissions as nats-server configuration variables (the chart's
    ``files/nats-permissions.conf``); per-node roles with :data:`NODE_PLACEHOLDER` where the node
    token goes (the chart writes ``*`` there: one identity per per-node role for every node)."""
    lines = [f"{variable(role)} = {permissions_block(_per_role(role))}" for role in ROLES]
    return CHART_FILE_HEADER + "\n".join(lines) + "\n"


def table(roles: Iterable[Role] = ROLES, node: str | None = None) -> dict[str, object]:
    """Permissions as plain data (for operators writing their own NATS users or JWTs): per role,
    ``publish`` and ``subscribe`` allow lists and ``allow_responses``; a per-node role on
    ``node`` (None: on every node)."""
    found: dict[str, object] = {}
    for role in roles:
        grant = permissions(role, node if role in NODE_ROLES else None)
        found[user_name(role, node if role in NODE_ROLES else None)] = msgspec.to_builtins(grant)
    return found
