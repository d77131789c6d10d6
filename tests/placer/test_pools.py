"""Node pools: the pool of a node, one replica's round of lease keeping (pure), what a replica
holds of the pools' bucket, and the view deciding on its own pools' nodes first and on every node
when none of them fits."""

from __future__ import annotations

from collections import Counter

import msgspec
import pytest

from services.placer.core.model import Decision
from services.placer.core.profiles import build_profile
from services.placer.rules import decider, translate
from services.placer.rules.decider import Waiting
from services.placer.rules.poolplan import LeasePlan, fair_share, plan_leases, pool_of
from services.placer.shell.poolleases import PoolEntries
from shared.messages.pools import PoolLease, PoolMember
from shared.runtime.bus import KvEntry
from tests.placer import wire
from tests.placer.test_translate import NOW, booking
from tests.placer.test_view import view_of

PROFILE = build_profile("binpack")
LEASE_S = 3.0


def named_in(pool: int, pools: int, count: int) -> list[str]:
    """The first ``count`` names ``node-<n>`` that fall in ``pool``."""
    names = (f"node-{n}" for n in range(10_000))
    return [name for name in names if pool_of(name, pools) == pool][:count]


def test_every_node_has_one_stable_pool_and_the_pools_are_about_even() -> None:
    names = [f"gpu-{n:05d}.zone-{n % 7}" for n in range(3_000)]
    pools = [pool_of(name, 3) for name in names]
    assert pools == [pool_of(name, 3) for name in names]  # the same on every replica
    sizes = Counter(pools)
    assert set(sizes) == {0, 1, 2}
    assert min(sizes.values()) > 900, sizes
    assert {pool_of(name, 1) for name in names} == {0}


def lease(pool: int, holder: str) -> PoolLease:
    # renewed_at is for people: the plan judges lapses by ``ages`` alone.
    return PoolLease(pool=pool, holder=holder, renewed_at=0.0, lease_s=LEASE_S)


def member(placer_id: str) -> tuple[PoolMember, int]:
    return PoolMember(placer_id=placer_id, seen_at=0.0, lease_s=LEASE_S), 1


GONE = 2 * LEASE_S
"""Seen unchanged for two lease times: lapsed."""
LONG_GONE = 11 * LEASE_S


@pytest.mark.parametrize(
    ("case", "leases", "members", "ages", "pools", "expected"),
    [
        (
            "alone on an empty bucket: every pool, created",
            {},
            {},
            {},
            3,
            LeasePlan(take=((0, 0), (1, 0), (2, 0)), share=3),
        ),
        (
            "three live replicas: one pool each, its own renewed",
            {0: (lease(0, "me"), 7), 1: (lease(1, "b"), 8), 2: (lease(2, "c"), 9)},
            {"member.b": member("b"), "member.c": member("c")},
            {"pool.1": LEASE_S / 3, "member.b": LEASE_S / 3},
            3,
            LeasePlan(renew=((0, 7),), share=1),
        ),
        (
            "others joined: what is beyond the share is given back",
            {0: (lease(0, "me"), 7), 1: (lease(1, "me"), 8), 2: (lease(2, "me"), 9)},
            {"member.b": member("b"), "member.c": member("c")},
            {},
            3,
            LeasePlan(renew=((0, 7),), give_back=((1, 8), (2, 9)), share=1),
        ),
        (
            "a holder stopped renewing: its pool is taken at the lease's revision",
            {0: (lease(0, "me"), 7), 1: (lease(1, "b"), 8), 2: (lease(2, "c"), 9)},
            {"member.b": member("b"), "member.c": member("c")},
            {"pool.1": GONE, "member.b": GONE},
            3,
            LeasePlan(renew=((0, 7),), take=((1, 8),), share=2),
        ),
        (
            "a live holder's pool is never taken, however old the time it wrote",
            {0: (lease(0, "b"), 7), 1: (lease(1, "c"), 8)},
            {"member.b": member("b"), "member.c": member("c")},
            {"pool.0": LEASE_S, "pool.1": 0.0},
            2,
            LeasePlan(share=1),
        ),
        (
            "a standby (more replicas than pools) holds nothing until a lease lapses",
            {0: (lease(0, "b"), 7), 1: (lease(1, "c"), 8)},
            {"member.b": member("b"), "member.c": member("c")},
            {"pool.1": GONE},
            2,
            LeasePlan(take=((1, 8),), share=1),
        ),
        (
            "fewer pools configured than held: the ones beyond are given back",
            {0: (lease(0, "me"), 7), 3: (lease(3, "me"), 8)},
            {},
            {},
            2,
            LeasePlan(renew=((0, 7),), give_back=((3, 8),), take=((1, 0),), share=2),
        ),
        (
            "a member gone for ten lease times is forgotten; one gone briefly is not",
            {0: (lease(0, "me"), 7)},
            {"member.b": member("b"), "member.c": member("c")},
            {"member.b": LONG_GONE, "member.c": GONE},
            1 + 1,
            LeasePlan(renew=((0, 7),), take=((1, 0),), forget=("member.b",), share=2),
        ),
    ],
)
def test_a_round_of_lease_keeping(
    case: str,
    leases: dict[int, tuple[PoolLease, int]],
    members: dict[str, tuple[PoolMember, int]],
    ages: dict[str, float],
    pools: int,
    expected: LeasePlan,
) -> None:
    plan = plan_leases(me="me", pools=pools, leases=leases, members=members, ages=ages)
    # Where to start looking for free pools depends on the replica's name: compare as sets.
    assert sorted(plan.take) == sorted(expected.take), case
    rest, wanted = (msgspec.structs.replace(p, take=()) for p in (plan, expected))
    assert rest == wanted, case


def test_replicas_starting_together_look_for_free_pools_from_different_places() -> None:
    firsts = {
        plan_leases(me=f"placer-{n}", pools=8, leases={}, members={}, ages={}).take[0][0]
        for n in range(8)
    }
    assert len(firsts) > 2
    assert fair_share(8, 3) == 3 and fair_share(3, 4) == 1 and fair_share(3, 0) == 3


# --- the view with pools -----------------------------------------------------------------------


def test_a_replica_decides_on_its_own_pool_first_and_on_every_node_when_none_fits() -> None:
    mine, theirs = named_in(0, 2, 2), named_in(1, 2, 2)
    view = view_of(*mine, *theirs, gpus=1, pools=2)
    view.set_owned(frozenset({0}))
    assert sorted(n.name for n in view.index) == sorted(mine)
    assert sorted(n.name for n in view.everywhere()) == sorted(mine + theirs)
    assert view.owns(mine[0]) and not view.owns(theirs[0])
    assert view.node_count() == 4
    small = translate.pod_request(wire.pending("p", memory_mib=4096, cores=20))
    decided = decider.decide(view, PROFILE, small, now=NOW)
    assert isinstance(decided, Decision) and decided.node in mine
    for name in mine:  # the own pool is full: the pod goes to the other pool's nodes
        full = msgspec.structs.replace(booking(f"full-{name}", (0, 80 * 1024, 1000)), node=name)
        assert view.set_booking(name, full.pod_uid, full, revision=3)
    fallback = decider.decide(view, PROFILE, small, now=NOW)
    assert isinstance(fallback, Decision) and fallback.node in theirs
    # Holding the other pool moves its nodes into the index, and these out.
    view.set_owned(frozenset({1}))
    assert sorted(n.name for n in view.index) == sorted(theirs)
    moved = decider.decide(view, PROFILE, small, now=NOW)
    assert isinstance(moved, Decision) and moved.node in theirs


def test_a_pod_that_fits_nowhere_is_explained_over_every_node() -> None:
    mine, theirs = named_in(0, 2, 1), named_in(1, 2, 2)
    view = view_of(*mine, *theirs, gpus=1, pools=2)
    view.set_owned(frozenset({0}))
    huge = translate.pod_request(wire.pending("p", shares=2, memory_mib=1024, cores=10))
    waiting = decider.decide(view, PROFILE, huge, now=NOW)
    assert isinstance(waiting, Waiting)
    assert waiting.rejection.unresolvable
    assert sum(r.nodes for r in waiting.rejection.reasons) == 3  # every node, not one pool's


def test_room_given_back_on_another_pools_node_wakes_waiting_pods_once_derived() -> None:
    mine, theirs = named_in(0, 2, 1), named_in(1, 2, 1)
    view = view_of(*mine, *theirs, gpus=1, pools=2)
    view.set_owned(frozenset({0}))
    other = theirs[0]
    held = msgspec.structs.replace(booking("x", (0, 8192, 500)), node=other)
    view.set_booking(other, "x", held, revision=1)
    view.everywhere()
    freed = view.freed
    view.set_booking(other, "x", None, revision=2)
    assert other not in view.index
    view.everywhere()
    assert view.freed > freed
    assert view.tenancy.used("ml").gpus == 0  # usage counts every pool's bookings


def test_without_pools_every_node_is_owned_and_everywhere_is_the_index() -> None:
    view = view_of("a", "b")
    assert view.everywhere() is view.index
    assert view.owns("a") and view.owns("b")
    view.set_owned(frozenset())  # no pools: nothing to hold or give back
    assert len(view.index) == 2


Step = KvEntry | tuple[str, int] | set[str]
"""A value or deletion the watch brings (or this replica's own write, answered), this
replica's deletion of a key at a revision, or a watch's initial values listing these keys."""


def put(key: str, revision: int) -> KvEntry:
    return KvEntry(key=key, value=b"v", revision=revision)


def gone(key: str, revision: int) -> KvEntry:
    return KvEntry(key=key, value=b"", revision=revision, deleted=True)


@pytest.mark.parametrize(
    ("steps", "live"),
    [
        pytest.param([put("a", 1), put("b", 2)], {"a": 1, "b": 2}, id="values"),
        pytest.param([put("a", 5), put("a", 3)], {"a": 5}, id="an older value late"),
        pytest.param([put("a", 3), gone("a", 4)], {}, id="a deletion"),
        pytest.param([gone("a", 4), put("a", 3)], {}, id="a value older than it"),
        pytest.param([gone("a", 4), put("a", 6)], {"a": 6}, id="written again after it"),
        pytest.param([put("a", 3), ("a", 3)], {}, id="my deletion"),
        pytest.param([put("a", 3), ("a", 3), put("a", 3)], {}, id="the old value late"),
        pytest.param([put("a", 3), ("a", 3), gone("a", 4)], {}, id="my deletion's marker"),
        pytest.param([put("a", 3), ("a", 3), put("a", 9)], {"a": 9}, id="written after mine"),
        pytest.param([put("a", 1), put("b", 2), {"b"}], {"b": 2}, id="deleted while unwatched"),
    ],
)
def test_a_replica_holds_each_key_s_newest_value_heard_of(
    steps: list[Step], live: dict[str, int]
) -> None:
    # The bucket is watched, and the replica's own writes are taken as soon as answered: the
    # watch brings them (and older values) later, and those must not undo what it knows.
    entries = PoolEntries()
    for step in steps:
        if isinstance(step, KvEntry):
            entries.take(step)
        elif isinstance(step, tuple):
            entries.deleted(*step)
        else:
            entries.listed(step)
            assert entries.loaded.is_set()
    assert {key: entry.revision for key, entry in entries.live.items()} == live
