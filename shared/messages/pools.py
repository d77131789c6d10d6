"""The placers' node pools, KV bucket ``tessera-placer-pools`` (``subjects.pool_key``,
``subjects.pool_member_key``).

With ``--pools N`` above 1 the nodes are split into N pools by a hash of their names
(``services/placer/rules/poolplan.py``), and each pool is held by one replica at a time through a
lease
here: the holder decides pods on its pool's nodes first, and on other pools' nodes only when a
pod fits on none of its own. A lease is renewed by compare-and-set; one not renewed within the
lease time (as each reader sees it: the entry unchanged that long on the reader's own clock) may
be taken over, by compare-and-set, by any replica under its share. Leases are hints for who does
the work, never what keeps a GPU exact: every booking is still a compare-and-set on the node's
ledger entry, whoever holds the pool.
"""

from __future__ import annotations

from shared.messages.base import Message


class PoolLease(Message, frozen=True, kw_only=True):
    """Who holds pool ``pool`` and when it last said so."""

    pool: int
    holder: str
    """The placer id of the replica holding the pool."""
    renewed_at: float
    """Seconds since the epoch, by the holder's clock (for people reading the bucket: readers
    judge a lapse by how long they have seen the entry unchanged, never by this)."""
    lease_s: float
    """The holder's lease time: an entry unchanged for longer may be taken over."""
    pools: int = 0
    """The holder's ``--pools`` (0: not said). Replicas must agree on it: with different
    numbers they split the nodes differently, so a replica that reads another number says so."""


class PoolMember(Message, frozen=True, kw_only=True):
    """A replica taking part in the pools: how the others count the live replicas to share the
    pools among."""

    placer_id: str
    seen_at: float
    """Seconds since the epoch, by the replica's clock (informative, as ``renewed_at``)."""
    lease_s: float
    """An entry unchanged for longer is a replica gone."""
