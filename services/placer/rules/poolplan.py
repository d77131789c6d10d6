"""Node pools (pure): which pool a node is in, and what one replica does with the pools' leases.

With ``--pools N`` above 1 the nodes are split into N pools by a hash of their names, and each
replica holds some pools through leases in ``tessera-placer-pools`` (``shared/messages/pools.py``):
it decides pods on its own pools' nodes, so replicas stop deciding onto the same nodes, stop
losing compare-and-sets to each other, and stop deriving the state of every node another replica
places on. Leases only share out the work: a booking is still a compare-and-set on the node's
ledger entry, so two replicas that both believe they hold a pool (a lease taken over from a
replica that was only slow) can only lose a compare-and-set, never over-commit a GPU.

:func:`plan_leases` is one round of a replica's lease keeping: renew what it holds up to its fair
share (the pools over the live replicas, rounded up), give back what is beyond it, and take free
or lapsed pools up to it. A replica that stops renewing (killed, partitioned) loses its pools to
the others within a lease time; a standby (a replica beyond the pools' number) holds none until
one lapses.

Whether a lease lapsed is judged without comparing clocks: by how long *this* replica has seen
the entry at the same KV revision (its ``ages``, on its monotonic clock), against the lease time
its holder wrote. Renewing writes a new revision, so a live holder's entry never ages past a
round; replicas whose wall clocks disagree by minutes still agree on who is gone.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping

import msgspec

from shared.messages.pools import PoolLease, PoolMember
from shared.subjects import pool_key

MEMBER_FORGET_LEASES = 10
"""A member entry not renewed for this many lease times is deleted (a replica long gone)."""


def pool_of(node: str, pools: int) -> int:
    """The pool of ``node`` among ``pools`` (stable: the same on every replica and restart)."""
    if pools <= 1:
        return 0
    return zlib.crc32(node.encode()) % pools


def lapsed(lease: PoolLease, age: float) -> bool:
    """Whether ``lease``, seen unchanged for ``age`` seconds, was not renewed in its time."""
    return age > lease.lease_s


class LeasePlan(msgspec.Struct, frozen=True, kw_only=True):
    """One round of lease keeping for one replica (revisions are the KV revisions read)."""

    renew: tuple[tuple[int, int], ...] = ()
    """(pool, revision) held by this replica and kept."""
    give_back: tuple[tuple[int, int], ...] = ()
    """(pool, revision) held beyond the fair share, or beyond the pools' number."""
    take: tuple[tuple[int, int], ...] = ()
    """(pool, revision) to take: revision 0 for a pool never leased (create), else the revision
    of a lapsed lease (compare-and-set)."""
    forget: tuple[str, ...] = ()
    """Member keys long lapsed, to delete."""
    share: int = 0
    """How many pools this replica should hold."""


def fair_share(pools: int, live: int) -> int:
    return math.ceil(pools / max(live, 1))


def plan_leases(
    *,
    me: str,
    pools: int,
    leases: Mapping[int, tuple[PoolLease, int]],
    members: Mapping[str, tuple[PoolMember, int]],
    ages: Mapping[str, float],
) -> LeasePlan:
    """What ``me`` does this round, from the bucket as read (``leases`` by pool, ``members`` by
    key, each with its revision; ``ages``: by key, how long this replica has seen the entry at
    that revision, 0 when new to it). This replica counts itself live whatever its entry says."""
    fresh = (m.placer_id for key, (m, _) in members.items() if ages.get(key, 0.0) <= m.lease_s)
    live = {me, *fresh}
    share = fair_share(pools, len(live))
    mine = sorted(p for p, (lease, _) in leases.items() if lease.holder == me)
    kept = [p for p in mine if p < pools][:share]
    renew = tuple((p, leases[p][1]) for p in kept)
    give_back = tuple((p, leases[p][1]) for p in mine if p not in kept)
    # Each replica looks for free pools from its own starting point, so that replicas starting
    # together do not all race for pool 0.
    start = zlib.crc32(me.encode()) % pools
    order = sorted(range(pools), key=lambda p: (p - start) % pools)
    free = [
        (p, leases[p][1] if p in leases else 0)
        for p in order
        if p not in leases
        or (leases[p][0].holder != me and lapsed(leases[p][0], ages.get(pool_key(p), 0.0)))
    ]
    take = tuple(free[: max(share - len(kept), 0)])
    forget = tuple(
        sorted(
            key
            for key, (m, _) in members.items()
            if m.placer_id != me and ages.get(key, 0.0) > MEMBER_FORGET_LEASES * m.lease_s
        )
    )
    return LeasePlan(renew=renew, give_back=give_back, take=take, forget=forget, share=share)
