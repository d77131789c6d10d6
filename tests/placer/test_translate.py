"""Wire messages to core values and back (``services/placer/rules/translate.py``), table-driven."""

from __future__ import annotations

import gc
import random

import msgspec
import pytest

from services.placer.core.model import RejectionReason
from services.placer.rules import gpustates, translate
from shared.commits import record_of
from shared.messages.inventory import NodeInventory
from shared.messages.ledger import BookedContainer, BookedSlice, Booking
from shared.messages.nodes import ClaimedGpu, NodeFacts
from shared.messages.pods import ContainerRequest, PlacementHints, PodPending
from tests.placer import wire

NOW = wire.NOW


def booking(
    uid: str,
    *pieces: tuple[int, int, int],
    cpu: int = 1000,
    memory: int = 512,
    whole: bool = False,
) -> Booking:
    """A booking of (GPU index, MiB, core milli) pieces on node n1."""
    return Booking(
        pod_uid=uid,
        namespace="ml",
        name=f"pod-{uid}",
        node="n1",
        commit=f"c-{uid}",
        tenant="ml",
        cpu_milli=cpu,
        memory_mib=memory,
        kind="share",
        containers=(
            BookedContainer(
                container="main",
                gpus=tuple(
                    BookedSlice(
                        index=i,
                        uuid=wire.gpu_uuid("n1", i),
                        memory_mib=mib,
                        core_milli=core,
                        exclusive=whole,
                    )
                    for i, mib, core in pieces
                ),
                resources={"tessera.dev/gpu": len(pieces)},
            ),
        ),
        decided_at=NOW,
        placer_id="p",
    )


def test_a_pending_pod_becomes_the_cores_request() -> None:
    pod = PodPending(
        uid="u",
        namespace="team",
        name="p",
        containers=(
            ContainerRequest(name="a", gpu_shares=2, gpu_memory_mib=1000, gpu_cores=30),
            ContainerRequest(name="b", gpu_shares=1, gpu_memory_pct=50, cpu_milli=500),
            ContainerRequest(name="c", cpu_milli=100, memory_mib=64),
        ),
        priority=7,
        hints=PlacementHints(
            gpu_policy="spread",
            node_policy="binpack",
            gpu_models=("A100",),
            gpu_models_excluded=("T4",),
            gpu_type="virtual",
            group="g",
        ),
    )
    request = translate.pod_request(pod)
    assert [
        (c.name, c.shares, c.share_memory_mib, c.share_memory_pct, c.share_core_milli)
        for c in request.containers
    ] == [
        ("a", 2, 1000, None, 300),
        ("b", 1, None, 50, None),
        ("c", 0, None, None, None),
    ]
    assert (request.tenant, request.tenant_label) == ("team", "")  # no label: the namespace
    assert (request.priority, request.gpu_policy, request.node_policy) == (7, "spread", "binpack")
    assert (request.gpu_models, request.gpu_models_excluded) == (("A100",), ("T4",))
    assert (request.gpu_type, request.group) == ("virtual", "g")
    labelled = msgspec.structs.replace(pod, hints=PlacementHints(tenant="research"))
    # The label is only a request: the tenancy grants it or not, never the translation.
    asked = translate.pod_request(labelled)
    assert (asked.tenant, asked.tenant_label) == ("team", "research")


@pytest.mark.parametrize(
    ("facts", "inventory_age", "reason"),
    [
        pytest.param(wire.facts("n1"), 0, "", id="placeable"),
        pytest.param(None, 0, translate.NO_FACTS, id="no-facts"),
        pytest.param(wire.facts("n1", ready=False), 0, translate.NOT_READY, id="not-ready"),
        pytest.param(wire.facts("n1", schedulable=False), 0, translate.CORDONED, id="cordoned"),
        pytest.param(wire.facts("n1"), 31, translate.STALE, id="heartbeat-missed"),
        pytest.param(wire.facts("n1"), 30, "", id="just-in-time"),
    ],
)
def test_when_a_node_may_be_placed_on(facts: object, inventory_age: float, reason: str) -> None:
    inventory = wire.inventory("n1", 1, at=NOW - inventory_age)
    found = translate.placement_reason(inventory, facts, now=NOW, stale_s=30)  # type: ignore[arg-type]
    assert found == reason


def node(
    inventory: NodeInventory, *bookings: Booking, slots: int | None = None, **facts: object
) -> translate.NodeState:  # type: ignore[name-defined]
    return translate.node_state(
        "n1",
        inventory,
        wire.facts("n1", slots=slots, **facts),  # type: ignore[arg-type]
        list(bookings),
        placeable=True,
    )


def test_memory_used_beyond_the_reservations_is_foreign_and_rounded_up() -> None:
    inventory = wire.inventory("n1", 3, used_mib=(1000, 5000, 0))
    state = node(inventory, booking("a", (1, 4000, 200)))
    gpu0, gpu1, gpu2 = state.gpus
    assert gpu0.memory_foreign_mib == 1024  # 1000 MiB nobody reserved, rounded up to 256
    assert gpu1.memory_reserved_mib == 4000
    assert gpu1.memory_foreign_mib == 1024  # 5000 used - 4000 reserved
    assert gpu2.memory_foreign_mib == 0
    assert gpu0.memory_free_mib == wire.GPU_MIB - 1024
    assert gpu1.memory_free_mib == wire.GPU_MIB - 4000 - 1024


def test_unhealthy_and_gone_gpus_take_no_new_work() -> None:
    inventory = wire.inventory("n1", 3, health={1: "unhealthy", 2: "gone"})
    assert [g.healthy for g in node(inventory).gpus] == [True, False, False]


@pytest.mark.parametrize(
    ("memories", "total", "expected"),
    [
        pytest.param((16, 16, 16, 16), 8, [2, 2, 2, 2], id="even"),
        pytest.param((16, 16, 16), 8, [3, 3, 2], id="remainder-by-index"),
        pytest.param((80, 40), 9, [6, 3], id="by-memory"),
        pytest.param((), 4, [], id="no-gpus"),
    ],
)
def test_logical_devices_are_split_over_gpus_by_memory(
    memories: tuple[int, ...], total: int, expected: list[int]
) -> None:
    assert gpustates.slot_limits(memories, total) == expected
    assert sum(expected) == (total if memories else 0)


def test_booked_shares_count_against_the_gpus_logical_devices() -> None:
    state = node(wire.inventory("n1", 2), booking("a", (0, 100, 100)), slots=4)
    assert [(g.slots_total, g.slots_reserved) for g in state.gpus] == [(2, 1), (2, 0)]
    assert [g.slots_total for g in node(wire.inventory("n1", 2)).gpus] == [0, 0]  # no limit


def test_no_advertised_devices_means_no_usable_gpu() -> None:
    # Regression (found by the chaos test of `tessera up`): allocatable 0 (the device plugin was
    # killed) read as "no limit", and pods kept being placed on a node whose kubelet rejects them.
    assert [g.healthy for g in node(wire.inventory("n1", 2), slots=0).gpus] == [False, False]
    assert [g.healthy for g in node(wire.inventory("n1", 2), slots=4).gpus] == [True, True]


def test_memory_unit_devices_cap_what_a_gpu_offers() -> None:
    """Memory-units mode: the kubelet hands one device per MiB a pod asks, so a GPU offers at
    most its share of the node's devices in MiB (all of it at 1 MiB per device)."""

    def offered(units: int | None) -> list[int]:
        facts = wire.facts("n1")
        if units is not None:
            facts = msgspec.structs.replace(
                facts, extended_allocatable={"tessera.dev/gpu-memory": units}
            )
        state = translate.node_state(
            "n1", wire.inventory("n1", 2, memory_mib=16384), facts, [], placeable=True
        )
        return [g.memory_total_mib for g in state.gpus if g.healthy]

    assert offered(None) == [16384, 16384]  # logical mode: no such limit
    assert offered(2 * 16384) == [16384, 16384]  # 1 MiB units: all of it
    assert offered(2 * 8192) == [8192, 8192]  # 2 MiB units: half
    assert offered(0) == []  # no device advertised: nothing usable


def test_bookings_fill_gpus_and_a_whole_gpu_is_exclusive() -> None:
    state = node(
        wire.inventory("n1", 2),
        booking("a", (0, 4096, 300)),
        booking("b", (0, 2048, 200)),
        booking("c", (1, wire.GPU_MIB, 1000), whole=True),
    )
    gpu0, gpu1 = state.gpus
    assert (gpu0.memory_reserved_mib, gpu0.core_milli_reserved, gpu0.holders) == (
        6144,
        500,
        ("a", "b"),
    )
    assert gpu1.exclusive
    assert dict(state.gpu_task_kinds) == {"share": 3}


def test_facts_count_bound_pods_so_their_cpu_is_not_counted_twice() -> None:
    facts = {"cpu_milli": 10_000}
    counted = translate.node_state(
        "n1",
        wire.inventory("n1", 1),
        msgspec.structs.replace(
            wire.facts("n1", **facts),  # type: ignore[arg-type]
            cpu_requested_milli=3000,
            tessera_cpu_requested_milli=2000,
            memory_requested_mib=700,
            tessera_memory_requested_mib=500,
        ),
        [
            booking("bound", (0, 10, 10), cpu=2000, memory=500),
            booking("new", (0, 10, 10), cpu=1000, memory=100),
        ],
        placeable=True,
    )
    # facts' 3000 include the bound pod's 2000: others hold 1000, Tessera 2000 + 1000.
    assert counted.cpu_milli_reserved == 1000 + 3000
    assert counted.memory_mib_reserved == 200 + 600


def _units(facts: NodeFacts, units: int) -> NodeFacts:
    return msgspec.structs.replace(facts, extended_allocatable={"tessera.dev/gpu-memory": units})


_A, _B = booking("a", (0, 4096, 300)), booking("b", (0, 2048, 200), (1, 1024, 100))
_WHOLE = booking("c", (2, wire.GPU_MIB, 1000), whole=True)
_INVENTORY = wire.inventory("n1", 3)
MEMO_STEPS: list[tuple[str, NodeInventory, NodeFacts, list[Booking]]] = [
    ("no bookings", _INVENTORY, wire.facts("n1"), []),
    ("booking added", _INVENTORY, wire.facts("n1"), [_A]),
    ("booking resized", _INVENTORY, wire.facts("n1"), [booking("a", (0, 2048, 300))]),
    ("booking added", _INVENTORY, wire.facts("n1"), [_A]),
    ("another pod, the same amounts", _INVENTORY, wire.facts("n1"), [booking("d", (0, 4096, 300))]),
    ("slots advertised, one pod", _INVENTORY, wire.facts("n1", slots=6), [_A]),
    (
        "the same amounts, two pods",
        _INVENTORY,
        wire.facts("n1", slots=6),
        [booking("e", (0, 2048, 150)), booking("f", (0, 2048, 150))],
    ),
    ("booking on two GPUs added", _INVENTORY, wire.facts("n1"), [_A, _B]),
    ("whole GPU booked", _INVENTORY, wire.facts("n1"), [_A, _B, _WHOLE]),
    (
        "the same amounts, not whole",
        _INVENTORY,
        wire.facts("n1"),
        [_A, _B, booking("c", (2, wire.GPU_MIB, 1000))],
    ),
    ("booking removed", _INVENTORY, wire.facts("n1"), [_B, _WHOLE]),
    ("booking written again", _INVENTORY, wire.facts("n1"), [booking("b", (0, 2048, 200))]),
    ("memory used", wire.inventory("n1", 3, used_mib=(9000, 0, 0)), wire.facts("n1"), [_A]),
    ("GPU unhealthy", wire.inventory("n1", 3, health={1: "unhealthy"}), wire.facts("n1"), [_A]),
    ("GPU gone from the inventory", wire.inventory("n1", 2), wire.facts("n1"), [_A]),
    ("slots advertised", _INVENTORY, wire.facts("n1", slots=6), [_A, _B]),
    ("no devices advertised", _INVENTORY, wire.facts("n1", slots=0), [_A, _B]),
    ("memory units", _INVENTORY, _units(wire.facts("n1"), 3 * 8192), [_A]),
    ("facts changed", _INVENTORY, wire.facts("n1", cpu_milli=8000, labels={"a": "b"}), [_A]),
    (
        "foreign claim",
        _INVENTORY,
        msgspec.structs.replace(
            wire.facts("n1"),
            claimed=(ClaimedGpu(claim="ml/c1", index=1, memory_mib=512, core_milli=100),),
        ),
        [_A],
    ),
    ("no inventory", None, wire.facts("n1"), [_A]),  # type: ignore[list-item]
]
"""Each kind of change a node sees, one after the other."""


@pytest.mark.parametrize("order", ["forward", "backward", "shuffled"])
def test_the_gpu_memo_derives_the_same_state_after_every_kind_of_change(order: str) -> None:
    """A node derived again with the memo its earlier states left equals the node derived
    afresh, whichever change came before (the memo rebuilds only the GPUs that changed)."""
    steps = list(MEMO_STEPS)
    if order == "backward":
        steps.reverse()
    elif order == "shuffled":
        random.Random(7).shuffle(steps)
    memo = gpustates.GpuMemo()
    for what, inventory, facts, bookings in steps + steps:  # each change seen twice
        kept = translate.node_state("n1", inventory, facts, bookings, placeable=True, memo=memo)
        fresh = translate.node_state("n1", inventory, facts, bookings, placeable=True)
        assert kept == fresh, what
    assert not gc.is_tracked(memo)  # a placer keeps one per node (tests/shared/test_untracked.py)


def test_a_booking_round_trips_through_the_reservation_and_into_the_record() -> None:
    original = booking("a", (0, 4096, 250), (1, 4096, 250))
    reservation = translate.reservation_of(original)
    pod = wire.pending("a")
    again = translate.booking_of(
        reservation, pod, tenant="ml", commit=original.commit, decided_at=NOW, placer_id="p"
    )
    assert again.containers[0].gpus == original.containers[0].gpus
    assert again.tenant == original.tenant
    record = record_of(original, state="reserved")
    assert record.state == "reserved"
    assert record.commit == original.commit
    assert [(g.index, g.memory_mib, g.cores) for g in record.containers[0].gpus] == [
        (0, 4096, 25),
        (1, 4096, 25),
    ]


@pytest.mark.parametrize(
    ("core_milli", "cores"),
    [(300, 30), (1000, 100), (5, 1), (301, 31)],
)
def test_cores_on_the_wire_are_percent_rounded_up(core_milli: int, cores: int) -> None:
    record = record_of(booking("a", (0, 1, core_milli)), state="reserved")
    assert record.containers[0].gpus[0].cores == cores


def test_the_cores_unschedulable_count_is_split_into_the_shells_reasons() -> None:
    reasons = (
        RejectionReason(reason=translate.UNSCHEDULABLE, nodes=5),
        RejectionReason(reason="insufficient GPU memory or cores", nodes=3),
    )
    refined = translate.refine_reasons(
        reasons, {translate.NO_FACTS: 2, translate.STALE: 2, translate.CORDONED: 3}
    )
    assert [(r.reason, r.nodes) for r in refined] == [
        ("insufficient GPU memory or cores", 3),
        (translate.STALE, 2),
        (translate.NO_FACTS, 2),
        (translate.CORDONED, 1),  # only 5 nodes were unschedulable when the core judged
    ]
    message = translate.rejection_message(
        wire.pending("u"), refined, nodes=8, unresolvable=False, decided_at=NOW, placer_id="p"
    )
    assert message.message.startswith("0/8 nodes are available: 3 insufficient GPU memory")
