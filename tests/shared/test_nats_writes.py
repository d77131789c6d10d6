"""The NATS client's writes to the socket, gathered over a short wait (``shared.runtime.nats.
client``), against a real nats-server."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import nats
import pytest
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg as NatsMsg

from shared.config import NodeSettings, Settings
from shared.runtime.bus import WRITE_COALESCE_S
from shared.runtime.lifecycle import bus_identity, connect_nats
from shared.runtime.nats import NatsBus
from shared.runtime.nats.client import CoalescingClient
from tests.harness.nats import NatsServer
from tests.harness.wait import eventually

SUBJECT = "tessera.test.writes"
PUBLISHERS = 20


@contextlib.asynccontextmanager
async def sending(
    server: NatsServer, coalesce_s: float
) -> AsyncIterator[tuple[CoalescingClient, NatsClient, list[bytes]]]:
    """A coalescing client and a plain receiver subscribed to :data:`SUBJECT` (what it got),
    both closed after (a client closed already is left so)."""
    got: list[bytes] = []

    async def take(msg: NatsMsg) -> None:
        got.append(msg.data)

    receiver = await nats.connect(server.url)
    try:
        await receiver.subscribe(SUBJECT, cb=take)
        await receiver.flush()
        client = CoalescingClient(coalesce_s=coalesce_s)
        await client.connect(server.url)
        try:
            yield client, receiver, got
        finally:
            await client.close()
    finally:
        await receiver.close()


@pytest.mark.parametrize(
    ("coalesce_s", "most_writes", "fewest_writes"),
    [
        (0.0, PUBLISHERS, PUBLISHERS // 4),  # nats-py's own way: a write nearly each
        (0.25, 1, 1),  # all in the wait after the first: one write
    ],
)
async def test_publishes_of_one_moment_go_out_in_one_write(
    nats_server: NatsServer, coalesce_s: float, most_writes: int, fewest_writes: int
) -> None:
    async with sending(nats_server, coalesce_s) as (client, _, got):
        await client.flush()
        before = client.socket_writes

        async def publish(n: int) -> None:
            for _ in range(n):  # each publisher a loop iteration after the one before
                await asyncio.sleep(0)
            await client.publish(SUBJECT, str(n).encode())

        await asyncio.gather(*(publish(n) for n in range(PUBLISHERS)))
        sent = [str(n).encode() for n in range(PUBLISHERS)]
        await eventually(lambda: got == sent, what="every message, in order")
        writes = client.socket_writes - before
        assert fewest_writes <= writes <= most_writes


async def test_a_close_during_the_wait_still_sends_what_was_published(
    nats_server: NatsServer,
) -> None:
    async with sending(nats_server, 5.0) as (client, _, got):
        await client.publish(SUBJECT, b"last words")
        async with asyncio.timeout(2.0):  # not held for the wait
            await client.close()
        await eventually(lambda: got == [b"last words"], what="the message published last")


async def test_a_flush_returns_once_the_server_has_what_was_published_before_it(
    nats_server: NatsServer,
) -> None:
    async with sending(nats_server, 0.25) as (client, receiver, got):
        await client.publish(SUBJECT, b"before the flush")
        await client.flush()
        await receiver.flush()  # the server sent the receiver what it had before this
        assert got == [b"before the flush"]


@pytest.mark.parametrize(
    ("role", "settings", "coalesce_s"),
    [
        ("placer", Settings(), WRITE_COALESCE_S),
        ("binder", Settings(), WRITE_COALESCE_S),
        ("deviceplugin", NodeSettings(node="gpu-1"), 0.0),  # answers the kubelet's Allocate
        ("inventory", NodeSettings(node="gpu-1"), 0.0),
    ],
)
@pytest.mark.usefixtures("bus")  # gives the store its epoch first, as a placer or binder does
async def test_the_control_plane_gathers_its_writes_and_the_nodes_do_not(
    nats_server: NatsServer, role: str, settings: Settings, coalesce_s: float
) -> None:
    bus = await connect_nats(
        nats_server.url, f"tessera-{role}", identity=bus_identity(role, settings)
    )
    try:
        assert isinstance(bus, NatsBus)
        client = bus._nc
        assert isinstance(client, CoalescingClient)
        assert client.coalesce_s == coalesce_s
    finally:
        await bus.drain()
