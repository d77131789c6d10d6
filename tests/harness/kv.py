"""The one set of KV writers for tests that play a service: each puts a wire message where, and
as, the service that owns it writes it (inventory and node facts as the inventory service and the
binder; a placement as the placer commits it; assignment records as the binder writes them)."""

from __future__ import annotations

from shared import codec, subjects
from shared.messages.assignments import AssignmentRecord
from shared.messages.inventory import NodeInventory
from shared.messages.nodes import NodeFacts
from shared.runtime.bus import Bus
from tests.harness.commits import commit


async def put_inventory(bus: Bus, value: NodeInventory) -> None:
    """The node's inventory in ``tessera-inventory``."""
    await bus.kv_put(subjects.KV_INVENTORY, subjects.node_token(value.node), codec.encode(value))


async def announce_inventory(bus: Bus, value: NodeInventory) -> None:
    """The node's inventory the way the inventory service writes it: KV entry and subject."""
    await put_inventory(bus, value)
    await bus.publish(subjects.inventory(value.node), codec.encode(value))


async def put_facts(bus: Bus, value: NodeFacts) -> None:
    """The node's facts in ``tessera-nodes``, as the binder writes them."""
    await bus.kv_put(subjects.KV_NODES, subjects.node_token(value.node), codec.encode(value))


async def put_record(bus: Bus, value: AssignmentRecord) -> int:
    """Write the record unconditionally (no commit of its own); returns its revision."""
    return await bus.kv_put(
        subjects.KV_ASSIGNMENTS,
        subjects.assignment_key(value.node, value.pod_uid),
        codec.encode(value),
    )


async def put_committed(bus: Bus, value: AssignmentRecord) -> int:
    """Commit the record (its claim and booking, as the placer writes them first) and write it
    the way the binder does; returns its revision."""
    await commit(bus, value)
    return await put_record(bus, value)


async def place(bus: Bus, value: AssignmentRecord) -> None:
    """Commit ``value``'s placement as a placer does (its booking and its claim): the binder binds
    it, writing ``value`` as its record, ``bound``."""
    await commit(bus, value)


async def create_committed(bus: Bus, value: AssignmentRecord) -> int:
    """Commit the record's placement, then create the record as it is (create-only): a record
    an earlier placer wrote ``reserved``, or one a binder wrote; returns its revision."""
    await commit(bus, value)
    revision = await bus.kv_create(
        subjects.KV_ASSIGNMENTS,
        subjects.assignment_key(value.node, value.pod_uid),
        codec.encode(value),
    )
    assert revision is not None, "the record already exists"
    return revision
