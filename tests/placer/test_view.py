"""The placer's pure state: cluster view, index changes, avoided nodes, task mix, config files."""

from __future__ import annotations

import argparse
import itertools
import json
import random
from pathlib import Path

import msgspec
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from services.placer.command import PlacerSettings, build_config
from services.placer.config import ConfigFileError, parse_profile, parse_tenancy
from services.placer.core.facts import pod_facts
from services.placer.core.fragmentation import TypicalTask
from services.placer.core.index import ClusterIndex
from services.placer.core.model import Decision, GpuState, NodeState, Reservation
from services.placer.core.profiles import DEFAULT_TYPICAL_TASKS, build_profile
from services.placer.core.shape import gpu_shape
from services.placer.rules import decider, mix, translate
from services.placer.rules.state import ClusterView
from shared.commits import record_of
from shared.config import ConfigError, add_settings_arguments, load_settings
from shared.messages.ledger import Booking, NodeLedger
from shared.messages.pods import PodPending
from tests.placer import wire
from tests.placer.builders import node
from tests.placer.test_translate import NOW, booking

PROFILE = build_profile("binpack")


def view_of(*names: str, gpus: int = 2, **options: object) -> ClusterView:
    view = ClusterView(inventory_stale_s=30, task_mix_window=100, **options)  # type: ignore[arg-type]
    for name in names:
        view.set_inventory(wire.inventory(name, gpus, at=NOW), now=NOW)
        view.set_facts(wire.facts(name, at=NOW))
    view.finish_load(NOW)
    return view


# --- the index ---------------------------------------------------------------------------------


def queue_decided(
    view: ClusterView, reservation: Reservation, pod: PodPending, *, commit: str
) -> None:
    """Hold ``reservation`` of ``pod`` on the view as this replica's commit ``commit``: decided,
    not yet allocated (a pod queued at the binder's gate)."""
    view.add_tentative(
        translate.booking_of(
            reservation, pod, tenant="ml", commit=commit, decided_at=NOW, placer_id="p"
        )
    )


def _consistent(index: ClusterIndex) -> None:
    names = sorted(n.name for n in index)
    assert [index.name_at(r) for r in range(len(names))] == names
    ranks = sorted(r for group in index.groups.values() for r in group)
    assert ranks == list(range(len(names)))
    for name in names:
        assert index.rank_of(name) in index.groups[index.shape_id_of(name)]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 30), st.integers(0, 3)), max_size=40))
def test_nodes_join_and_leave_in_name_order(changes: list[tuple[bool, int, int]]) -> None:
    index = ClusterIndex([])
    index.shape_limit = 8  # compact often
    for join, number, used in changes:
        name = f"node-{number:02d}"
        state = node(name).gpu(used=250 * used).build()
        if join:
            if name in index:
                index.put(state)
            else:
                index.add(state)
        elif name in index:
            index.remove(name)
        _consistent(index)
        assert len(index.shapes) <= max(index.shape_limit, len(index)) + 1


def test_a_decision_avoids_the_nodes_it_is_told_to_and_falls_back_when_nothing_else_fits() -> None:
    view = view_of("a", "b")
    pod = translate.pod_request(wire.pending("p", memory_mib=4096, cores=20))
    first = decider.decide(view, PROFILE, pod, now=NOW)
    assert isinstance(first, Decision)
    other = decider.decide(view, PROFILE, pod, now=NOW, avoid={first.node})
    assert isinstance(other, Decision)
    assert other.node != first.node
    only = decider.decide(view, PROFILE, pod, now=NOW, avoid={"a", "b"})
    assert isinstance(only, Decision)  # nothing else fits: decided as if none were avoided


def test_a_burst_spreads_over_nodes_while_a_queue_waits_for_allocate() -> None:
    """Issue 22: the binder lets one pod per device count onto a node at a time, so a packing
    profile that sends a whole burst to one node places it at that node's pace. A node with
    pods between decision and Allocate (records not allocated yet, tentative bookings) is
    chosen only when no node with a shorter queue fits; once allocated, packing resumes."""
    view = view_of("a", "b", "c")
    pod = translate.pod_request(wire.pending("p", memory_mib=4096, cores=5))

    def on(node: str, uid: str) -> Booking:
        return msgspec.structs.replace(booking(uid, (0, 4096, 50)), node=node)

    first = decider.decide(view, PROFILE, pod, now=NOW)
    assert isinstance(first, Decision) and first.node == "a"
    queued = [on("a", "q1"), on("a", "q2")]
    for held in queued:
        view.add_tentative(held)
    assert view.queued_nodes(2) == {"a"}
    spread = decider.decide(view, PROFILE, pod, now=NOW)
    assert isinstance(spread, Decision) and spread.node != "a", "a's queue is long"
    # Committed (booked in the ledger) and recorded: still queued until allocated.
    for revision, held in enumerate(queued, start=5):
        assert view.set_booking("a", held.pod_uid, held, revision)
    for key, held in enumerate(queued, start=1):
        view.set_record(f"a.{held.pod_uid}", record_of(held, state="reserved"), key)
    assert view.queued_nodes(2) == {"a"}
    for other in ("b", "c"):  # every node queued alike: the profile alone chooses
        for uid in ("r1", "r2"):
            view.add_tentative(on(other, f"{other}-{uid}"))
    packed = decider.decide(view, PROFILE, pod, now=NOW)
    assert isinstance(packed, Decision) and packed.node == "a"
    for key, held in enumerate(queued, start=1):  # allocated: a's queue is gone
        allocated = msgspec.structs.replace(record_of(held, state="reserved"), state="allocated")
        view.set_record(f"a.{held.pod_uid}", allocated, key + 10)
    assert view.queued_nodes(1) == {"b", "c"}
    again = decider.decide(view, PROFILE, pod, now=NOW)
    assert isinstance(again, Decision) and again.node == "a"


QUEUE_LONG = 3
"""Longer than the first queue level spread over (``decider.QUEUE_SPREAD``)."""


def test_identical_pods_pile_up_where_they_pass_the_gate_together() -> None:
    """The binder's gate holds a pod back only beside a queued pod of as many devices (shares,
    on these logical nodes) on other slices: pods of identical slices pass together (a device
    plugin serves either from the other's record alike). So a burst of identical pods is not
    spread while its pods stack up on one GPU: it touches no more GPUs than the profile alone
    would. A pod that would wait there is decided onto another node."""
    view = view_of("a", "b", "c")
    for i in range(QUEUE_LONG):
        pending = wire.pending(f"q{i}", memory_mib=4096, cores=5)
        request = translate.pod_request(pending)
        decision = decider.decide(view, PROFILE, request, now=NOW)
        assert isinstance(decision, Decision) and decision.node == "a", i
        assert [g.index for c in decision.reservation.containers for g in c.gpus] == [0]
        assert not view.waits_at_gate(decision.reservation, request)
        queue_decided(view, decision.reservation, pending, commit=f"c{i}")
    assert view.queued_nodes(QUEUE_LONG) == {"a"}
    larger = translate.pod_request(wire.pending("big", memory_mib=8192, cores=5))
    alone = decider.decide(view, PROFILE, larger, now=NOW, spread=False)
    assert isinstance(alone, Decision) and alone.node == "a"
    assert view.waits_at_gate(alone.reservation, larger), "other slices beside a's queue"
    elsewhere = decider.decide(view, PROFILE, larger, now=NOW)
    assert isinstance(elsewhere, Decision) and elsewhere.node != "a"
    assert not view.waits_at_gate(elsewhere.reservation, larger)


def memory_pod(uid: str, memory_mib: int) -> PodPending:
    """One share of ``memory_mib``, its resources as the binder reads them from the pod spec."""
    pod = wire.pending(uid, memory_mib=memory_mib, cores=None)
    (container,) = pod.containers
    resources = {"tessera.dev/gpu": 1, "tessera.dev/gpu-memory": memory_mib}
    container = msgspec.structs.replace(container, resources=resources)
    return msgspec.structs.replace(pod, containers=(container,))


@pytest.mark.parametrize(
    ("memory_units", "queued_mib", "mine_mib", "waits"),
    [
        pytest.param(False, 4096, 8192, True, id="logical: one share each"),
        pytest.param(True, 4096, 8192, False, id="memory-units: 4096 and 8192 devices"),
        pytest.param(True, 4096, 4096, True, id="memory-units: 4096 devices each"),
    ],
)
def test_the_gate_counts_the_devices_the_kubelet_asks_for(
    memory_units: bool, queued_mib: int, mine_mib: int, waits: bool
) -> None:
    """The binder's gate compares device counts: shares on a logical node, the container's
    tessera.dev/gpu-memory on a memory-units node. A pod on another GPU beside a queued one
    waits only where their counts are equal."""
    view = view_of("a", gpus=2)
    if memory_units:
        view.set_facts(
            msgspec.structs.replace(
                wire.facts("a", at=NOW), extended_allocatable={"tessera.dev/gpu-memory": 163840}
            )
        )
    queued = memory_pod("queued", queued_mib)
    placed = decider.decide(view, PROFILE, translate.pod_request(queued), now=NOW)
    assert isinstance(placed, Decision)
    queue_decided(view, placed.reservation, queued, commit="c0")
    used = placed.reservation.containers[0].gpus[0].index
    mine = translate.pod_request(memory_pod("mine", mine_mib))
    other_gpu = decider.decide_on(view, PROFILE, mine, "a", now=NOW)
    assert isinstance(other_gpu, Decision)
    reservation = other_gpu.reservation
    if reservation.containers[0].gpus[0].index == used:  # put it on the other GPU
        (container,) = reservation.containers
        (share,) = container.gpus
        other = view.index.node("a").gpus[1 - used]
        moved = msgspec.structs.replace(share, index=other.index, uuid=other.uuid)
        reservation = msgspec.structs.replace(
            reservation, containers=(msgspec.structs.replace(container, gpus=(moved,)),)
        )
    assert view.waits_at_gate(reservation, mine) == waits


Size = tuple[int, int | None, int | None, str | None]
"""A one-container pod's GPU ask: shares, MiB per share, cores per share (percent), gpu type."""

sizes = st.tuples(
    st.integers(1, 2),  # shares
    st.sampled_from([None, 4096, 8192]),  # MiB per share (None: whole GPUs, or by cores alone)
    st.sampled_from([None, 5, 25]),  # cores per share, percent
    st.sampled_from([None, "physical"]),
)


def sized(uid: str, size: Size) -> PodPending:
    shares, memory_mib, cores, gpu_type = size
    return wire.pending(uid, shares=shares, memory_mib=memory_mib, cores=cores, gpu_type=gpu_type)


def queued_on_a(queued: list[Size]) -> ClusterView:
    """A view of node ``a`` (4 GPUs) with the pods of ``queued`` decided there, not allocated."""
    view = view_of("a", gpus=4)
    for i, size in enumerate(queued):
        held = sized(f"q{i}", size)
        placed = decider.decide_on(view, PROFILE, translate.pod_request(held), "a", now=NOW)
        if isinstance(placed, Decision):
            queue_decided(view, placed.reservation, held, commit=f"c{i}")
    return view


@pytest.mark.parametrize(
    ("queued", "mine", "certain"),
    [
        pytest.param([(1, 4096, 25, None)], (1, 8192, 25, None), True, id="other MiB"),
        pytest.param([(2, 4096, 5, None)], (2, 4096, 25, None), True, id="other cores"),
        pytest.param([(1, None, 5, None)], (1, None, 25, None), True, id="cores alone, other"),
        pytest.param([(1, 4096, 25, None)], (1, 4096, 25, None), False, id="alike: may pass"),
        pytest.param([(1, None, 5, None)], (1, None, 5, None), False, id="cores alike"),
        pytest.param([(2, 4096, 25, None)], (1, 8192, 25, None), False, id="other share count"),
        pytest.param([], (1, 8192, 25, None), False, id="nothing queued"),
    ],
)
def test_the_sizes_alone_tell_when_a_node_surely_holds_a_pod(
    queued: list[Size], mine: Size, certain: bool
) -> None:
    request = translate.pod_request(sized("mine", mine))
    view = queued_on_a(queued)
    assert view.certainly_waits_at_gate("a", request.uid, pod_facts(request).asks) == certain


@settings(max_examples=200, deadline=None)
@given(queued=st.lists(sizes, min_size=1, max_size=3), mine=sizes)
@example(queued=[(1, None, 5, None)], mine=(1, None, 5, None))  # cores alone, alike: may pass
@example(queued=[(1, 4096, 25, None)], mine=(1, 4096, 25, None))  # alike: may pass
@example(queued=[(1, 4096, 25, None)], mine=(1, 8192, 25, None))  # other MiB: waits
@example(queued=[(2, 4096, 5, None)], mine=(2, 4096, 25, None))  # other cores: waits
def test_a_node_where_a_pod_certainly_waits_holds_it_whichever_gpus_it_gets(
    queued: list[Size], mine: Size
) -> None:
    """The decider skips choosing GPUs on a node where the gate holds the pod back whatever
    they are (``certainly_waits_at_gate``): then every choice of GPUs there waits."""
    view = queued_on_a(queued)
    request = translate.pod_request(sized("mine", mine))
    if not view.certainly_waits_at_gate("a", request.uid, pod_facts(request).asks):
        return
    mine_placed = decider.decide_on(view, PROFILE, request, "a", now=NOW)
    if not isinstance(mine_placed, Decision):
        return
    gpus = view.index.node("a").gpus
    for order in itertools.permutations(gpus):  # the same slices on any other GPUs
        moved = msgspec.structs.replace(
            mine_placed.reservation,
            containers=tuple(
                msgspec.structs.replace(
                    container,
                    gpus=tuple(
                        msgspec.structs.replace(
                            share, index=order[share.index].index, uuid=order[share.index].uuid
                        )
                        for share in container.gpus
                    ),
                )
                for container in mine_placed.reservation.containers
            ),
        )
        assert view.waits_at_gate(moved, request)


def test_a_placer_told_not_to_spread_packs_a_burst_onto_the_queued_node() -> None:
    """``--no-burst-spread``: the profile alone chooses, whatever the queues (a burst then
    touches the fewest GPUs and waits at the binder's gate; ``benchmarks/RESULTS.md``)."""
    parser = argparse.ArgumentParser()
    add_settings_arguments(parser, PlacerSettings)
    cli = vars(parser.parse_args(["--no-burst-spread"]))
    config = build_config(load_settings(PlacerSettings, env={}, cli=cli, config_file=None))
    assert (config.burst_spread, build_config(PlacerSettings()).burst_spread) == (False, True)
    view = view_of("a", "b", "c")
    for uid in ("q1", "q2", "q3"):
        view.add_tentative(msgspec.structs.replace(booking(uid, (0, 4096, 50)), node="a"))
    assert view.queued_nodes(2) == {"a"}
    pod = translate.pod_request(wire.pending("p", memory_mib=4096, cores=5))
    packed = decider.decide(view, PROFILE, pod, now=NOW, spread=config.burst_spread)
    assert isinstance(packed, Decision) and packed.node == "a"
    spread = decider.decide(view, PROFILE, pod, now=NOW)
    assert isinstance(spread, Decision) and spread.node != "a"


def test_a_burst_spreads_over_the_own_pool_whatever_other_pools_queue() -> None:
    """With node pools a replica decides on its own pool's nodes, while the queues it knows of
    are every pool's: other pools' queued nodes must not count as nodes tried in its own. Pool
    0 of 2 holds d and e; d has a queue, and so do the four nodes of pool 1, as many as the
    pool's nodes and more: the pod still goes to e, not to the end of d's queue."""
    view = view_of("a", "b", "c", "d", "e", "h", pools=2)
    view.set_owned(frozenset({0}))
    assert sorted(n.name for n in view.index) == ["d", "e"]
    for name in ("a", "b", "c", "d", "h"):
        for uid in ("q1", "q2"):
            view.add_tentative(
                msgspec.structs.replace(booking(f"{name}-{uid}", (0, 4096, 50)), node=name)
            )
    assert view.queued_nodes(2) == {"a", "b", "c", "d", "h"}
    pod = translate.pod_request(wire.pending("p", memory_mib=4096, cores=5))
    spread = decider.decide(view, PROFILE, pod, now=NOW)
    assert isinstance(spread, Decision) and spread.node == "e", "d's queue is long"


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.booleans(), st.sampled_from("abc"), st.integers(0, 9), st.integers(1, 9)),
        max_size=60,
    )
)
def test_queued_nodes_kept_between_changes_are_always_current(
    steps: list[tuple[bool, str, int, int]],
) -> None:
    """``queued_nodes`` keeps each level's set until a node crosses that level; whatever the
    order of changes and questions, it answers what a count from scratch answers (and the
    index's ranks of it, kept too, match the set)."""
    view = view_of("a", "b", "c")
    held: dict[str, set[str]] = {"a": set(), "b": set(), "c": set()}
    for add, name, uid, asked in steps:
        pod_uid = f"{name}-{uid}"
        if add:
            view.add_tentative(msgspec.structs.replace(booking(pod_uid, (0, 1, 1)), node=name))
            held[name].add(pod_uid)
        else:
            view.drop_tentative(name, pod_uid)
            held[name].discard(pod_uid)
        queued = view.queued_nodes(asked)
        assert queued == {n for n, uids in held.items() if len(uids) >= asked}
        assert view.index.ranks_of(queued) == {view.index.rank_of(n) for n in queued}


def test_ranks_of_follows_nodes_entering_and_leaving() -> None:
    index = ClusterIndex([node(n).gpus(1).build() for n in ("b", "d")])
    names = frozenset({"b", "c", "d"})
    assert index.ranks_of(names) == {0, 1}, "c is not in the index"
    index.add(node("a").gpus(1).build())  # takes rank 0: b and d move on
    assert index.ranks_of(names) == {1, 2}
    index.add(node("c").gpus(1).build())
    assert index.ranks_of(names) == {1, 2, 3}
    index.remove("b")
    assert index.ranks_of(names) == {1, 2}


def test_a_gpu_counted_beyond_its_slots_takes_nothing_more() -> None:
    full = GpuState(index=0, memory_total_mib=1000, slots_total=2, slots_reserved=3)
    assert gpu_shape(full).slots_free == 0
    assert gpu_shape(GpuState(index=0, memory_total_mib=1000)).slots_free == -1  # no limit


# --- the view ----------------------------------------------------------------------------------


def test_tentative_bookings_count_until_the_ledger_holds_them() -> None:
    view = view_of("a", gpus=1)
    held = booking("x", (0, 8192, 500))
    held = msgspec.structs.replace(held, node="a")
    view.add_tentative(held)
    assert view.index.node("a").gpus[0].memory_reserved_mib == 8192
    committed = view.committed_state("a")
    assert committed is not None
    assert committed.gpus[0].memory_reserved_mib == 0
    shapes = len(view.index.shapes)
    assert view.set_booking("a", "x", held, revision=5)
    assert len(view.index.shapes) == shapes  # nothing the index shows changed
    assert view.tentative("a", "x") is None
    assert not view.set_booking("a", "x", None, revision=4)  # older: ignored
    assert view.ledger("a") == (NodeLedger(node="a", bookings=(held,)), 5)
    assert view.bookings_of("x") == [held]
    assert view.tenancy.used("ml").gpus == 1


def test_change_counters_move_when_capacity_is_given_back_or_nodes_come() -> None:
    view = view_of("a", gpus=1)
    held = msgspec.structs.replace(booking("x", (0, 8192, 500)), node="a")
    view.set_booking("a", "x", held, revision=1)
    freed, grown = view.freed, view.grown
    view.set_booking("a", "x", None, revision=2)  # its delete marker
    assert view.ledger("a") == (None, 2)
    assert view.freed > freed
    assert view.grown == grown
    view.set_inventory(wire.inventory("b", 4, at=NOW), now=NOW)
    view.set_facts(wire.facts("b", at=NOW))
    assert view.grown > grown
    assert view.tenancy.used("ml").gpus == 0


def test_why_nodes_are_not_placed_on() -> None:
    view = view_of("ok", "cordoned", "late")
    view.set_facts(wire.facts("cordoned", schedulable=False, at=NOW))
    view.set_inventory(wire.inventory("nofacts", 1, at=NOW), now=NOW)
    view.refresh(NOW + 10)
    assert (
        view.set_inventory(wire.inventory("late", 2, at=NOW - 100), now=NOW + 10) == ""
    )  # older: ignored
    assert view.unplaceable() == {translate.CORDONED: 1, translate.NO_FACTS: 1}
    view.refresh(NOW + 31)  # nothing heard from any inventory for 31 s
    assert view.unplaceable() == {
        translate.CORDONED: 1,
        translate.NO_FACTS: 1,
        translate.STALE: 2,
    }
    view.set_facts(msgspec.structs.replace(wire.facts("late"), deleted=True))
    assert "late" not in view.index
    view.set_booking_unreadable("ok", "x", revision=9)
    assert view.reason("ok") == "ledger entry unreadable"
    assert view.ledger("ok") == (None, 9)
    view.set_booking("ok", "x", None, revision=10)  # the key deleted: its booking is known
    assert view.reason("ok") != "ledger entry unreadable"


def _too_large(pod: PodPending) -> str:
    """The reason the pod waits on a cluster of two nodes of 2 x A100 (16,384 MiB each)."""
    view = view_of("a", "b", gpus=2)
    outcome = decider.decide(view, PROFILE, translate.pod_request(pod), now=NOW)
    assert isinstance(outcome, decider.Waiting)
    assert outcome.wake == "grown" and outcome.rejection.unresolvable
    (reason,) = outcome.rejection.reasons
    assert reason.nodes == 2
    return reason.reason


def _models(pod: PodPending, wanted: tuple[str, ...], excluded: tuple[str, ...]) -> PodPending:
    hints = msgspec.structs.replace(pod.hints, gpu_models=wanted, gpu_models_excluded=excluded)
    return msgspec.structs.replace(pod, hints=hints)


@pytest.mark.parametrize(
    ("pod", "reason"),
    [
        pytest.param(
            wire.pending("big", memory_mib=200_000),
            "asks 200000 MiB per GPU; the largest GPU here has 16384 MiB (container 'main')",
            id="gpu-memory",
        ),
        pytest.param(
            wire.pending("nine", shares=9),
            "asks 9 GPUs with 4096 MiB each; a node here has at most 2 GPUs that large "
            "(container 'main')",
            id="gpu-count",
        ),
        pytest.param(
            wire.pending("whole", shares=3, memory_mib=None, cores=None),
            "asks 3 GPUs; a node here has at most 2 GPUs (container 'main')",
            id="whole-gpus",
        ),
        pytest.param(
            wire.pending("cpu", cpu_milli=100_000),
            "asks 100000m CPU; the largest node here has 64000m",
            id="cpu",
        ),
        pytest.param(
            _models(wire.pending("t4"), ("T4",), ()),
            "asks GPUs of model T4; no node here has one",
            id="model",
        ),
        pytest.param(
            _models(wire.pending("not-a100"), (), ("A100",)),
            "asks GPUs not of model A100; no node here has one",
            id="model-excluded",
        ),
    ],
)
def test_a_pod_larger_than_any_node_is_told_apart_by_the_dimension(
    pod: PodPending, reason: str
) -> None:
    assert _too_large(pod) == f"larger than any node can hold: {reason}"


# --- the task mix ------------------------------------------------------------------------------


def spec(gpu_milli: int, count: int = 1) -> mix.TaskSpec:
    return mix.TaskSpec(cpu_milli=4000, gpu_milli=gpu_milli, gpu_count=count, memory_mib=0)


def test_the_mix_is_the_prior_until_pods_are_seen_then_the_newest_pods() -> None:
    learned = mix.TaskMix(window=100)
    assert {(t.gpu_milli, t.gpu_count) for t in learned.typical()} == {
        (t.gpu_milli, t.gpu_count) for t in DEFAULT_TYPICAL_TASKS
    }
    for n in range(300):  # old pods of 1000, then the newest 100 of 300
        learned.observe(f"p{n}", spec(1000 if n < 200 else 300), at=float(n))
    typical = {(t.gpu_milli, t.gpu_count): t.weight for t in learned.typical()}
    share = typical[(300, 1)]
    assert share == pytest.approx(100 / 300, abs=mix.WEIGHT_STEP)  # 100 seen vs 200 prior
    assert (1000, 1) in typical  # from the prior only
    learned.forget("p299")
    assert len(learned) == 299


def test_a_task_of_the_mix_no_pod_asked_for_is_marked_assumed() -> None:
    learned = mix.TaskMix(window=100)
    assert all(t.assumed for t in learned.typical())  # the prior alone: a guess
    for n in range(20):
        learned.observe(f"p{n}", spec(300 if n % 2 else 250), at=float(n))
    assumed = {(t.gpu_milli, t.gpu_count): t.assumed for t in learned.typical()}
    assert assumed[(300, 1)] is False  # seen only
    assert assumed[(250, 1)] is False  # seen, and the prior's too (merged)
    assert assumed[(1000, 8)] is True  # the prior's only


def test_the_mix_is_the_same_whatever_order_the_pods_were_seen_in() -> None:
    pods = [(f"p{n}", spec(random.Random(n).choice((250, 500, 1000))), float(n)) for n in range(50)]
    one, two = mix.TaskMix(window=30), mix.TaskMix(window=30)
    for uid, task, at in pods:
        one.observe(uid, task, at)
    for uid, task, at in reversed(pods):
        two.observe(uid, task, at)
    assert one.typical() == two.typical()
    assert all(isinstance(t, TypicalTask) for t in one.typical())


def test_a_booked_pod_spec_measures_shares_on_their_gpu() -> None:
    share = translate.reservation_of(booking("a", (0, 8192, 300)))
    assert mix.task_spec(share, lambda node, index: 16_384).gpu_milli == 500  # memory > cores
    whole = translate.reservation_of(booking("b", (0, 16_384, 1000), whole=True))
    assert mix.task_spec(whole, lambda node, index: None).gpu_milli == 1000


# --- config files ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "text", "error"),
    [
        pytest.param("t.json", b"{", "t.json is not valid JSON", id="not-json"),
        pytest.param("t.toml", b"quotas = [", "t.toml is not valid TOML", id="not-toml"),
        pytest.param("t.json", b"[]", "must hold a table", id="not-a-table"),
        pytest.param(
            "t.json",
            b'{"quotas": [{"tenant": "a", "gpus": -1}]}',
            "limits cannot be negative",
            id="negative-quota",
        ),
        pytest.param(
            "t.json",
            b'{"groups": [{"name": "g", "tenants": [], "colour": 1}]}',
            "Object contains unknown field `colour`",
            id="unknown-field",
        ),
    ],
)
def test_a_bad_tenancy_file_says_where_and_why(source: str, text: bytes, error: str) -> None:
    with pytest.raises(ConfigFileError, match=error.replace("[", r"\[")):
        parse_tenancy(text, source=source)


def test_tenancy_files_in_toml_and_json_mean_the_same() -> None:
    toml = b'[[quotas]]\ntenant = "ml"\ngpus = 2\n'
    data = json.dumps({"quotas": [{"tenant": "ml", "gpus": 2}]}).encode()
    assert parse_tenancy(toml, source="t.toml") == parse_tenancy(data, source="t.json")


def test_a_profile_file_is_compiled_at_start(tmp_path: Path) -> None:
    good = tmp_path / "mine.toml"
    good.write_text('name = "mine"\ngpu_choice = "spread"\n[[scores]]\nplugin = "binpack"\n')
    config = build_config(PlacerSettings(profile=str(good)))
    assert not isinstance(config.profile, str)
    assert config.profile.name == "mine"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"name": "bad", "scores": [{"plugin": "nope"}]}))
    with pytest.raises(ConfigError, match="unknown score plugin 'nope'"):
        build_config(PlacerSettings(profile=str(bad)))
    with pytest.raises(ConfigError, match="neither a built-in profile"):
        build_config(PlacerSettings(profile="fastest"))
    with pytest.raises(ConfigError, match="cannot read the tenancy file"):
        build_config(PlacerSettings(tenancy_file=str(tmp_path / "missing.json")))
    with pytest.raises(ConfigFileError, match="unknown GPU choice"):
        parse_profile(b'{"name": "x", "gpu_choice": "best"}', source="x.json")


def test_node_state_of_a_node_without_inventory_has_no_gpus() -> None:
    state: NodeState = translate.node_state("cpu", None, wire.facts("cpu"), [], placeable=True)
    assert state.gpus == ()
    assert state.cpu_milli_total == 64_000


def test_a_memory_units_node_takes_only_containers_that_ask_gpu_memory() -> None:
    """Its kubelet asks its device plugin for a container's GPUs only for tessera.dev/gpu-memory:
    a whole GPU, or a slice by percentage or cores alone, would run there without its GPUs."""
    view = view_of("logical", "units", gpus=1)
    units = msgspec.structs.replace(
        wire.facts("units", at=NOW), extended_allocatable={"tessera.dev/gpu-memory": 81920}
    )
    view.set_facts(units)
    assert view.memory_unit_nodes == {"units"}
    whole = translate.pod_request(wire.pending("whole", memory_mib=None, cores=None))
    by_memory = translate.pod_request(wire.pending("mem", memory_mib=4096, cores=None))
    assert translate.needs_gpu_devices(whole) and not translate.needs_gpu_devices(by_memory)
    for _ in range(3):
        placed = decider.decide(view, PROFILE, whole, now=NOW)
        assert isinstance(placed, Decision) and placed.node == "logical"
    assert {v.node: v.reason for v in decider.verdicts(view, PROFILE, whole) if not v.fits} == {
        "units": translate.MEMORY_UNITS_ONLY
    }
    on_units = decider.decide_on(view, PROFILE, whole, "units", now=NOW)
    assert isinstance(on_units, decider.Waiting)
    assert [(r.reason, r.nodes) for r in on_units.rejection.reasons] == [
        (translate.MEMORY_UNITS_ONLY, 1)
    ]
    assert isinstance(decider.decide_on(view, PROFILE, by_memory, "units", now=NOW), Decision)
    # The logical node full: the whole-GPU pod waits, counting the memory-units node apart.
    whole_gpu = booking("x", (0, 81920, 1000), whole=True)
    view.set_booking("logical", "x", msgspec.structs.replace(whole_gpu, node="logical"), 1)
    waiting = decider.decide(view, PROFILE, whole, now=NOW)
    assert isinstance(waiting, decider.Waiting)
    reasons = {r.reason: r.nodes for r in waiting.rejection.reasons}
    assert reasons[translate.MEMORY_UNITS_ONLY] == 1 and sum(reasons.values()) == 2
    view.set_facts(wire.facts("units", at=NOW))  # the plugin switched to logical mode
    assert view.memory_unit_nodes == set()


@pytest.mark.parametrize(
    ("moved", "decisions", "judgements", "elapsed_s", "due"),
    [
        (False, 10_000, 0, 3600.0, False),  # nothing moved: nothing to compile
        (True, 0, 0, 0.0, True),  # nothing judged since: a compile costs nothing
        (True, 5, 100, 1.0, True),  # a small cluster: paid within a few decisions
        (True, 100, 60_000, 10.0, False),  # a large one in a burst: not paid yet
        (True, 3_000, 60_000, 10.0, True),  # paid at RECOMPILE_JUDGEMENTS a decision
        (True, 100, 60_000, mix.MIX_STALE_S, True),  # stale too long: compiled anyway
    ],
)
def test_a_moved_mix_is_compiled_once_the_last_compile_is_paid_for(
    moved: bool, decisions: int, judgements: int, elapsed_s: float, due: bool
) -> None:
    assert (
        mix.compile_due(
            moved=moved, decisions=decisions, judgements=judgements, elapsed_s=elapsed_s
        )
        is due
    )
