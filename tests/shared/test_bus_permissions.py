"""Issue 19, part 2a: least privilege on the bus, against a real nats-server configured with
exactly the permissions ``shared.permissions`` generates (the ones ``tessera up`` and the chart
use).

Each forgery the issue names is tried by an identity that must not make it, and then by the one
that may: the first is refused by the server (a permissions violation in its log, nothing
delivered), the second lands, so a refusal is the permissions at work, not a broken write path.
That every service does its whole job under its own identity is what the end-to-end tests show
(``tessera up`` runs with these permissions by default; ``tests/e2e/test_features.py`` checks
the server logged no violation).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from shared import permissions, subjects
from shared.config import NatsSecurity
from shared.runtime.bus import Bus, BusUnavailableError, Delivery
from shared.runtime.nats import NatsBus
from tessera.up.identities import Identities
from tessera.up.system import permission_violations
from tests.harness import secure
from tests.harness.nats import NatsServer
from tests.harness.wait import eventually

NODE_A = "node-a.example.com"
NODE_B = "node-b.example.com"
QUIET_S = 0.3
"""How long a refused write is given to show up anyway before the test believes it did not."""


@dataclass
class Cluster:
    server: NatsServer
    identities: Identities
    admin: NatsBus

    async def connect(self, role: str, node: str | None = None) -> NatsBus:
        # A refused request gets no answer at all: keep the wait for it short.
        return await self.identities.connect(
            self.server.url, role, node, inbox_node=NODE_A, request_timeout=QUIET_S
        )

    def violations(self, user: str) -> list[str]:
        """The subjects the server refused ``user`` (publish or subscribe), from its log."""
        log = (self.server.directory / "server.log").read_text(errors="replace")
        pattern = re.compile(rf'"\$G/user:{re.escape(user)}" - \w+ Violation - Subject "([^"]+)"')
        # Through the lines ``tessera up`` counts as violations: a real refusal it did not
        # count would fail the forgery tests below.
        return [m.group(1) for line in permission_violations(log) if (m := pattern.search(line))]


@pytest.fixture
def identities(tmp_path: Path) -> Identities:
    return Identities(tmp_path / "auth", [NODE_A, NODE_B], shared_node_identities=True)


@pytest.fixture
def secured(identities: Identities) -> Iterator[NatsServer]:
    with NatsServer(config=identities.server_config()) as server:
        yield server


@pytest.fixture
async def cluster(secured: NatsServer, identities: Identities) -> AsyncIterator[Cluster]:
    admin = await identities.connect(secured.url, "admin")
    try:
        yield Cluster(server=secured, identities=identities, admin=admin)
    finally:
        await admin.drain()


async def _seen(bus: Bus, subject: str) -> tuple[list[Delivery], Callable[[], Awaitable[None]]]:
    """Everything published to ``subject`` from now on (as the admin sees it)."""
    seen: list[Delivery] = []

    async def handler(delivery: Delivery) -> None:
        seen.append(delivery)

    subscription = await bus.subscribe(subject, handler)
    return seen, subscription.unsubscribe


Write = Callable[[Bus], Awaitable[object]]


@dataclass(frozen=True)
class Forgery:
    what: str
    subject: str
    write: Write
    forgers: tuple[tuple[str, str | None], ...]
    rightful: tuple[str, str | None]


def kv_put(bucket: str, key: str) -> Write:
    return lambda bus: bus.kv_put(bucket, key, b'{"forged": true}')


def publish(subject: str) -> Write:
    return lambda bus: bus.publish(subject, b'{"forged": true}')


def js_publish(subject: str) -> Write:
    return lambda bus: bus.js_publish(subject, b'{"forged": true}')


PLACER = ("placer", None)
BINDER = ("binder", None)
DASHBOARD = ("dashboard", None)
PLUGIN_A = ("deviceplugin", NODE_A)
PLUGIN_B = ("deviceplugin", NODE_B)
INVENTORY_A = ("inventory", NODE_A)
INVENTORY_B = ("inventory", NODE_B)
NOT_PLACERS = (BINDER, DASHBOARD, PLUGIN_A, INVENTORY_A, ("deviceplugin", None))
NOT_BINDERS = (PLACER, DASHBOARD, PLUGIN_A, INVENTORY_A)

RECORD_B = subjects.assignment_key(NODE_B, "uid-1")
FORGERIES = [
    Forgery(
        "a device plugin writes another node's assignment record",
        f"$KV.{subjects.KV_ASSIGNMENTS}.{RECORD_B}",
        kv_put(subjects.KV_ASSIGNMENTS, RECORD_B),
        (PLUGIN_A, INVENTORY_B, DASHBOARD),
        PLUGIN_B,
    ),
    Forgery(
        "an inventory publishes another node's inventory",
        subjects.inventory(NODE_B),
        publish(subjects.inventory(NODE_B)),
        (INVENTORY_A, PLUGIN_B, BINDER, PLACER),
        INVENTORY_B,
    ),
    Forgery(
        "an inventory writes another node's inventory entry",
        f"$KV.{subjects.KV_INVENTORY}.{subjects.node_token(NODE_B)}",
        kv_put(subjects.KV_INVENTORY, subjects.node_token(NODE_B)),
        (INVENTORY_A, PLUGIN_B, PLACER),
        INVENTORY_B,
    ),
    *(
        Forgery(
            f"a non-placer writes {bucket}",
            f"$KV.{bucket}.{key}",
            kv_put(bucket, key),
            NOT_PLACERS,
            PLACER,
        )
        for bucket, key in (
            (subjects.KV_LEDGER, subjects.booking_key(NODE_B, "uid-1")),
            (subjects.KV_CLAIMS, subjects.claim_key("uid-1")),
            (subjects.KV_TENANTS, subjects.tenant_key("team")),
            (subjects.KV_WAITING, subjects.waiting_key("uid-1")),
            (subjects.KV_POOLS, subjects.pool_key(0)),
        )
    ),
    Forgery(
        "a non-placer publishes a placement rejection",
        subjects.PLACEMENTS_REJECTED,
        js_publish(subjects.PLACEMENTS_REJECTED),
        NOT_PLACERS,
        PLACER,
    ),
    Forgery(
        "anyone but the binder (and the placer's requeue) publishes a pending pod",
        subjects.PODS_PENDING,
        js_publish(subjects.PODS_PENDING),
        (DASHBOARD, PLUGIN_A, INVENTORY_A),
        BINDER,
    ),
    Forgery(
        "anyone but the binder publishes a deleted pod",
        subjects.PODS_DELETED,
        js_publish(subjects.PODS_DELETED),
        NOT_BINDERS,
        BINDER,
    ),
    Forgery(
        "anyone but the binder writes node facts",
        f"$KV.{subjects.KV_NODES}.{subjects.node_token(NODE_B)}",
        kv_put(subjects.KV_NODES, subjects.node_token(NODE_B)),
        NOT_BINDERS,
        BINDER,
    ),
    Forgery(
        "anyone but the binder publishes a binding result",
        subjects.bindings(NODE_B),
        js_publish(subjects.bindings(NODE_B)),
        NOT_BINDERS,
        BINDER,
    ),
]


@pytest.mark.parametrize("forgery", FORGERIES, ids=[f.what for f in FORGERIES])
async def test_each_forgery_is_refused_by_the_server_and_the_rightful_write_lands(
    cluster: Cluster, forgery: Forgery
) -> None:
    seen, stop = await _seen(cluster.admin, forgery.subject)

    async def forge(role: str, node: str | None) -> None:
        bus = await cluster.connect(role, node)
        try:
            with contextlib.suppress(Exception):  # a refused request gets no answer: it times out
                await forgery.write(bus)
            user = permissions.user_name(role, node)
            await eventually(
                lambda: forgery.subject in cluster.violations(user),
                what=f"the server refusing {user}",
            )
        finally:
            await bus.drain()

    try:
        await asyncio.gather(*(forge(role, node) for role, node in forgery.forgers))
        await asyncio.sleep(QUIET_S)
        assert seen == [], "a forgery was delivered"
        rightful = await cluster.connect(*forgery.rightful)
        try:
            await forgery.write(rightful)
        finally:
            await rightful.drain()
        await eventually(lambda: len(seen) == 1, what="the rightful write")
        assert cluster.violations(permissions.user_name(*forgery.rightful)) == []
    finally:
        await stop()


EPOCH = f"$KV.{subjects.KV_META}.{subjects.META_EPOCH}"


async def test_only_the_store_s_creators_may_write_its_epoch(cluster: Cluster) -> None:
    """A node's own device-plugin identity overwrote ``tessera-meta``'s epoch (it needed to
    create it, and NATS cannot grant "create only"): at the next reconnect every service
    believed the store lost. Every other identity reads the epoch, and none may write it; the
    placer and the binder, which create the store, may."""
    before = await cluster.admin.kv_get(subjects.KV_META, subjects.META_EPOCH)
    assert before is not None
    for role, node in (PLUGIN_A, INVENTORY_A, DASHBOARD, ("deviceplugin", None)):
        bus = await cluster.connect(role, node)
        try:
            assert bus.store_epoch == cluster.admin.store_epoch, "it reads the epoch"
            with contextlib.suppress(Exception):  # refused: no answer, it times out
                await bus.kv_put(subjects.KV_META, subjects.META_EPOCH, b'{"epoch": "forged"}')
            user = permissions.user_name(role, node)

            def refused(user: str = user) -> bool:
                return EPOCH in cluster.violations(user)

            await eventually(refused, what=f"{user} refused")
        finally:
            await bus.drain()
    after = await cluster.admin.kv_get(subjects.KV_META, subjects.META_EPOCH)
    assert after == before
    for role, node in (PLACER, BINDER):
        bus = await cluster.connect(role, node)
        try:
            assert bus.store_epoch == cluster.admin.store_epoch
        finally:
            await bus.drain()
        assert cluster.violations(permissions.user_name(role, node)) == []


async def test_a_new_store_gets_its_epoch_from_a_creator_and_the_nodes_wait_for_it(
    secured: NatsServer, identities: Identities
) -> None:
    """A node's service that reaches an empty store first creates the streams it may, but not
    the epoch: it is not ready until the placer or the binder gave the store one."""
    with pytest.raises(BusUnavailableError, match="no epoch yet"):
        await identities.connect(secured.url, "deviceplugin", NODE_A, request_timeout=QUIET_S)
    binder = await identities.connect(secured.url, "binder")
    plugin = await identities.connect(secured.url, "deviceplugin", NODE_A)
    try:
        assert plugin.store_epoch == binder.store_epoch != ""
    finally:
        await plugin.drain()
        await binder.drain()


async def test_a_rollup_on_its_own_key_cannot_wipe_other_nodes_records(cluster: Cluster) -> None:
    """A write may carry ``Nats-Rollup: all``, which purges the whole stream it lands in: a
    device plugin allowed to write only its own node's keys would wipe every node's records.
    Tessera's buckets refuse rollups."""
    await cluster.admin.kv_put(subjects.KV_ASSIGNMENTS, RECORD_B, b"node b's record")
    plugin = await cluster.connect(*PLUGIN_A)
    try:
        own = f"$KV.{subjects.KV_ASSIGNMENTS}.{subjects.assignment_key(NODE_A, 'uid-2')}"
        with pytest.raises(Exception, match="rollup not permitted"):
            await plugin.js_publish(own, b"{}", headers={"Nats-Rollup": "all"})
        await plugin.kv_put(subjects.KV_ASSIGNMENTS, subjects.assignment_key(NODE_A, "uid-2"), b"")
    finally:
        await plugin.drain()
    entry = await cluster.admin.kv_get(subjects.KV_ASSIGNMENTS, RECORD_B)
    assert entry is not None and entry.value == b"node b's record"


async def test_a_bucket_made_before_rollups_were_refused_stops_taking_them(
    nats_server: NatsServer,
) -> None:
    """An existing bucket (created by nats-py's defaults, rollups allowed) is mended by the one
    identity that may change configurations when it connects."""
    import nats

    client = await nats.connect(nats_server.url)
    try:
        await client.jetstream().create_key_value(bucket=subjects.KV_ASSIGNMENTS, history=5)
    finally:
        await client.close()
    bus = await NatsBus.connect(nats_server.url, name="mender")
    try:
        with pytest.raises(Exception, match="rollup not permitted"):
            await bus.js_publish(
                f"$KV.{subjects.KV_ASSIGNMENTS}.n.u", b"{}", headers={"Nats-Rollup": "all"}
            )
    finally:
        await bus.drain()


@pytest.mark.parametrize(
    "request_subject",
    [
        f"$JS.API.STREAM.UPDATE.{subjects.STREAM_PODS}",  # e.g. max_age 1 s: pending pods gone
        f"$JS.API.STREAM.DELETE.{subjects.STREAM_PODS}",
        f"$JS.API.STREAM.PURGE.KV_{subjects.KV_LEDGER}",
        f"$JS.API.CONSUMER.DELETE.{subjects.STREAM_PODS}.{subjects.DURABLE_PLACER_PODS}",
        f"$JS.API.CONSUMER.MSG.NEXT.{subjects.STREAM_PODS}.{subjects.DURABLE_PLACER_PODS}",
        f"$JS.API.CONSUMER.MSG.NEXT.KV_{subjects.KV_LEDGER}.a-placers-watch",
    ],
    ids=[
        "update-stream",
        "delete-stream",
        "purge-ledger",
        "delete-consumer",
        "steal-pods",
        "steal-a-placer-s-ledger-changes",
    ],
)
async def test_no_service_identity_can_reshape_streams_or_take_another_s_work(
    cluster: Cluster, request_subject: str
) -> None:
    plugin = await cluster.connect(*PLUGIN_A)
    try:
        with pytest.raises(TimeoutError):
            await plugin.request(request_subject, b"{}", timeout=QUIET_S)
    finally:
        await plugin.drain()
    assert request_subject in cluster.violations(permissions.user_name(*PLUGIN_A))


async def test_a_placer_may_watch_the_ledger_and_the_records_in_batches(cluster: Cluster) -> None:
    """The placers ask for these two buckets' changes (``services.placer.shell.watches``)."""
    placer = await cluster.connect(*PLACER)
    try:
        for bucket, key in (
            (subjects.KV_LEDGER, subjects.booking_key(NODE_A, "uid-1")),
            (subjects.KV_ASSIGNMENTS, subjects.assignment_key(NODE_A, "uid-1")),
        ):
            watch = placer.kv_watch(bucket, batch_s=0.05)
            assert await asyncio.wait_for(anext(watch), timeout=5) is None
            await cluster.admin.kv_put(bucket, key, b"{}")
            change = await asyncio.wait_for(anext(watch), timeout=5)
            assert change is not None and change.key == key
            await watch.aclose()
    finally:
        await placer.drain()
    assert cluster.violations(permissions.user_name(*PLACER)) == []


async def test_no_identity_can_read_another_s_replies(cluster: Cluster) -> None:
    """Replies go to the requester's inbox prefix, where only its identity may listen."""
    plugin = await cluster.connect(*PLUGIN_A)
    placer = await cluster.connect(*PLACER)
    try:
        snooped, stop = await _seen(plugin, f"{permissions.inbox_prefix('placer')}.>")
        await placer.kv_get(subjects.KV_LEDGER, subjects.booking_key(NODE_A, "uid-1"))
        await eventually(
            lambda: (
                f"{permissions.inbox_prefix('placer')}.>"
                in cluster.violations(permissions.user_name(*PLUGIN_A))
            ),
            what="the server refusing the subscription",
        )
        assert snooped == []
        await stop()
    finally:
        await plugin.drain()
        await placer.drain()


@pytest.mark.parametrize("node", [NODE_A, "ip-10-0-12-34." + "n" * 48], ids=["short", "63 chars"])
async def test_a_per_node_user_jwt_in_operator_mode_takes_the_same_permissions(
    tmp_path: Path, node: str
) -> None:
    """Where a NATS in operator mode issues per-node credentials (the way README gives for
    per-node identities on a cluster), the same table makes the user JWT's permissions, and the
    JWT of a node with a hostname's longest name still fits nats-server's default control
    line (a CONNECT over 4 KiB is refused: "maximum control line exceeded")."""
    grant = permissions.permissions("deviceplugin", node)
    claims = {"pub": {"allow": list(grant.publish)}, "sub": {"allow": list(grant.subscribe)}}
    operator = secure.operator_mode(user_permissions=claims)
    creds = tmp_path / "deviceplugin.creds"
    creds.write_text(operator.creds)
    with NatsServer(operator.server_config) as server:
        plugin = await NatsBus.connect(
            server.url,
            name="tessera-deviceplugin",
            security=NatsSecurity(creds_file=str(creds)),
            inbox_prefix=permissions.inbox_prefix("deviceplugin", node),
            update_topology=False,
            create_epoch=False,
            # No placer or binder gives this store its epoch (the one user is the node's): its
            # buckets are created as it uses them.
            topology=False,
            request_timeout=QUIET_S,
        )
        try:
            own = subjects.assignment_key(node, "uid-1")
            await plugin.kv_put(subjects.KV_ASSIGNMENTS, own, b"{}")
            with pytest.raises(TimeoutError):  # refused: no answer comes
                await plugin.kv_put(subjects.KV_ASSIGNMENTS, RECORD_B, b"{}")
            with pytest.raises(TimeoutError):
                await plugin.kv_put(subjects.KV_LEDGER, subjects.booking_key(node, "uid-1"), b"{}")
        finally:
            await plugin.drain()
