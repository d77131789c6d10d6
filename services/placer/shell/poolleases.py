"""Node pools for one replica: keeps its share of the pools' leases in ``tessera-placer-pools``
(``services/placer/poolplan.py`` plans each round; this carries the plan out) and tells the view
which pools it holds. Only runs with ``--pools`` above 1.

The bucket is followed by a KV watch (:class:`PoolEntries`), not listed every round: a listing
makes and deletes a consumer on the server, and every replica's round did it every third of the
lease time (on a JetStream cluster, each consumer made or deleted is a change of the cluster's
metadata, agreed on by every server). Every write here is a compare-and-set or a create, so a
round that planned on an entry the watch had not yet brought up to date only loses its write."""

from __future__ import annotations

import asyncio
import contextlib
from typing import TypeVar

from services.placer.rules import poolplan
from services.placer.shell.context import Shell, log
from services.placer.shell.watches import kv_delivery
from shared import codec, subjects
from shared.messages.pools import PoolLease, PoolMember
from shared.runtime.bus import BusUnavailableError, KvEntry, OutcomeUnknownError
from shared.runtime.follow import follow

_T = TypeVar("_T")

GIVE_BACK_TIMEOUT_S = 2.0
"""At most this long is spent giving the leases back on a clean stop (else they lapse)."""


class PoolEntries:
    """The live entries of ``tessera-placer-pools`` as this replica last heard of them: what its
    watch brings, and its own writes as soon as they are answered (the watch brings those a
    moment later, and an older value of a key never replaces a newer one)."""

    def __init__(self) -> None:
        self.live: dict[str, KvEntry] = {}
        self._newest: dict[str, int] = {}
        """Key -> the newest revision heard of (written, or deleted at)."""
        self.loaded = asyncio.Event()
        """Set once the watch's first initial values are in."""

    def take(self, entry: KvEntry) -> None:
        """A value or deletion of a key, as the watch brings it."""
        if entry.revision <= self._newest.get(entry.key, 0):
            return
        self._newest[entry.key] = entry.revision
        if entry.deleted:
            self.live.pop(entry.key, None)
        else:
            self.live[entry.key] = entry

    def written(self, key: str, value: bytes, revision: int) -> None:
        """This replica wrote ``value`` to ``key`` at ``revision``."""
        self.take(KvEntry(key=key, value=value, revision=revision))

    def deleted(self, key: str, revision: int) -> None:
        """This replica deleted ``key``, which was at ``revision``. The deletion's own revision
        is not known here, only that it is above ``revision``: so is any later value's."""
        self.take(KvEntry(key=key, value=b"", revision=revision + 1, deleted=True))

    def listed(self, keys: set[str]) -> None:
        """A watch's initial values are in; ``keys``: every key they listed (one held and not
        listed was deleted while no watch ran)."""
        for key in set(self.live) - keys:
            del self.live[key]
        self.loaded.set()


class PoolKeeper:
    """Takes, renews and gives back this replica's pools (see the module docstring)."""

    def __init__(self, *, shell: Shell) -> None:
        self._shell = shell
        self.entries = PoolEntries()
        self.holding = asyncio.Event()
        """Set while this replica holds at least one pool: only then does it take new pods."""
        self._revisions: dict[int, int] = {}
        """Pool -> the revision of this replica's lease as last written."""
        self._renewed_at: dict[int, float] = {}
        """Pool -> when (monotonic clock) this replica last renewed it."""
        self._seen: dict[str, tuple[int, float]] = {}
        """Key -> (revision, when this replica first read it at that revision, monotonic)."""
        self._disagreeing: set[tuple[str, int]] = set()
        """(holder, its --pools) already warned about."""
        self._rejected: set[tuple[str, int]] = set()
        """(key, revision) of entries already rejected at the edge, so each is counted once."""

    @property
    def held(self) -> frozenset[int]:
        return frozenset(self._revisions)

    async def follow(self) -> None:
        """Follow the bucket into :attr:`entries`, forever (``loaded`` once it is in)."""

        async def on_entry(entry: KvEntry) -> None:
            self.entries.take(entry)

        async def on_loaded(keys: set[str]) -> None:
            self.entries.listed(keys)

        await follow(
            self._shell.bus,
            subjects.KV_POOLS,
            on_entry=on_entry,
            on_loaded=on_loaded,
            clock=self._shell.clock,
            what="pools",
        )

    async def run(self) -> None:
        """Keep the leases, a round every third of the lease time, forever."""
        shell = self._shell
        interval = shell.config.pool_lease_s / 3
        while True:
            try:
                await self.keep()
            except (BusUnavailableError, OutcomeUnknownError) as error:
                log.warning("pool leases not kept this round", extra={"error": str(error)})
                self._drop_lapsed()
            await shell.clock.sleep(interval)

    async def keep(self) -> None:
        """One round: say this replica is live, read the bucket, carry out the plan. The first
        waits for :meth:`follow` to have brought the bucket's entries in."""
        await self.entries.loaded.wait()
        shell, bus = self._shell, self._shell.bus
        config = shell.config
        now = shell.clock.now()
        # A renewal counts from before it is sent: no reader starts its count earlier.
        started = shell.clock.monotonic()
        member = PoolMember(placer_id=config.placer_id, seen_at=now, lease_s=config.pool_lease_s)
        key, value = subjects.pool_member_key(config.placer_id), codec.encode(member)
        self.entries.written(key, value, await bus.kv_put(subjects.KV_POOLS, key, value))
        leases, members, ages = await self._read()
        plan = poolplan.plan_leases(
            me=config.placer_id, pools=config.pools, leases=leases, members=members, ages=ages
        )
        for pool in self.held - {pool for pool, _ in plan.renew}:
            self._forget(pool)  # the bucket says another replica holds it now
        for pool, revision in plan.give_back:
            self._forget(pool)  # stop deciding on it before another replica may take it
            await self._delete(subjects.pool_key(pool), revision)
        for pool, revision in (*plan.renew, *plan.take):
            lease = PoolLease(
                pool=pool,
                holder=config.placer_id,
                renewed_at=now,
                lease_s=config.pool_lease_s,
                pools=config.pools,
            )
            key, value = subjects.pool_key(pool), codec.encode(lease)
            if revision:
                written = await bus.kv_update(subjects.KV_POOLS, key, value, revision=revision)
            else:
                written = await bus.kv_create(subjects.KV_POOLS, key, value)
            if written is None:  # another replica wrote first: the pool is its own now
                self._forget(pool)
            else:
                self.entries.written(key, value, written)
                self._revisions[pool] = written
                self._renewed_at[pool] = started
        for key in plan.forget:  # any replica may tidy up: the one that comes first does
            await self._delete(key, members[key][1])
        self._drop_lapsed()

    async def _delete(self, key: str, revision: int) -> None:
        """Delete ``key`` if it is still at ``revision``."""
        if (
            await self._shell.bus.kv_delete_if(subjects.KV_POOLS, key, revision=revision)
            is not None
        ):
            self.entries.deleted(key, revision)

    async def give_back_all(self) -> None:
        """On a clean stop: give every lease back, so that others take the pools at once."""
        held, self._revisions, self._renewed_at = dict(self._revisions), {}, {}
        self._show()
        with contextlib.suppress(Exception, TimeoutError):
            async with asyncio.timeout(GIVE_BACK_TIMEOUT_S):
                for pool, revision in held.items():
                    await self._shell.bus.kv_delete_if(
                        subjects.KV_POOLS, subjects.pool_key(pool), revision=revision
                    )

    async def _read(
        self,
    ) -> tuple[
        dict[int, tuple[PoolLease, int]], dict[str, tuple[PoolMember, int]], dict[str, float]
    ]:
        """The bucket's leases and members as :attr:`entries` holds them, and how long this
        replica has seen each unchanged."""
        leases: dict[int, tuple[PoolLease, int]] = {}
        members: dict[str, tuple[PoolMember, int]] = {}
        ages: dict[str, float] = {}
        seen: dict[str, tuple[int, float]] = {}
        now = self._shell.clock.monotonic()
        for key, entry in sorted(self.entries.live.items()):
            revision, since = self._seen.get(key, (entry.revision, now))
            if revision != entry.revision:
                since = now
            seen[key] = (entry.revision, since)
            ages[key] = now - since
            if key.startswith("member."):
                member = await self._decode(entry, PoolMember)
                if member is not None and subjects.pool_member_key(member.placer_id) == key:
                    members[key] = (member, entry.revision)
            elif key.startswith("pool."):
                lease = await self._decode(entry, PoolLease)
                if lease is not None and subjects.pool_key(lease.pool) == key:
                    leases[lease.pool] = (lease, entry.revision)
                    self._check_agreement(lease)
                    continue
                if lease is not None:
                    await self._reject(entry, f"entry under key {key} names pool {lease.pool}")
                if key.removeprefix("pool.").isdigit():
                    # Unreadable, or naming another pool: lapsed, so it is taken over by
                    # compare-and-set at its revision rather than left unheld for good.
                    pool = int(key.removeprefix("pool."))
                    lapsed = PoolLease(pool=pool, holder="", renewed_at=0.0, lease_s=0.0)
                    leases[pool] = (lapsed, entry.revision)
        self._seen = seen
        return leases, members, ages

    async def _decode(self, entry: KvEntry, message: type[_T]) -> _T | None:
        try:
            return codec.decode(entry.value, message)
        except codec.DecodeError as error:
            await self._reject(entry, str(error), kind="decode")
            return None

    async def _reject(self, entry: KvEntry, reason: str, *, kind: str = "validate") -> None:
        """Reject ``entry`` at the edge, once per revision (the bucket is read every round)."""
        if (entry.key, entry.revision) in self._rejected:
            return
        self._rejected.add((entry.key, entry.revision))
        await self._shell.edge.reject(
            kv_delivery(entry, subjects.KV_POOLS), family="pools", reason=reason, kind=kind
        )

    def _check_agreement(self, lease: PoolLease) -> None:
        """Warn (once per holder and number) when another replica runs another ``--pools``:
        each then decides on its own split of the nodes, which is safe (every booking is still a
        compare-and-set) but brings back the contention pools are there to remove."""
        pools = self._shell.config.pools
        if not lease.pools or lease.pools == pools or lease.holder == self._shell.config.placer_id:
            return
        if (lease.holder, lease.pools) in self._disagreeing:
            return
        self._disagreeing.add((lease.holder, lease.pools))
        log.warning(
            "another placer runs with another number of node pools; give every replica the "
            "same --pools",
            extra={"holder": lease.holder, "its_pools": lease.pools, "pools": pools},
        )

    def _forget(self, pool: int) -> None:
        self._revisions.pop(pool, None)
        self._renewed_at.pop(pool, None)

    def _drop_lapsed(self) -> None:
        """Stop deciding on pools not renewed within the lease time (another may hold them by
        now), then show the view what is held."""
        now = self._shell.clock.monotonic()
        lease_s = self._shell.config.pool_lease_s
        for pool, renewed_at in list(self._renewed_at.items()):
            if renewed_at + lease_s < now:
                self._forget(pool)
        self._show()

    def _show(self) -> None:
        shell = self._shell
        held = self.held
        if held == shell.view.owned:
            return
        log.info(
            "node pools held",
            extra={
                "pools": sorted(held),
                "of": shell.config.pools,
                "before": sorted(shell.view.owned),
            },
        )
        shell.view.set_owned(held)
        shell.metrics.pools_held.set(len(held))
        if held:
            self.holding.set()
        else:
            self.holding.clear()
        shell.work.set()
        shell.poke()
