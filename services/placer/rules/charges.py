"""Tenant charges as pure functions: what a commit takes from its tenant's quota, and whether
it fits (no I/O). Step 0 of the commit protocol (``commit.py`` has the whole protocol and why
each step is safe): a tenant's entry in ``tessera-tenants`` lists one charge per placed pod that
counts against its quota, and a charge is added by compare-and-set only if every charge of the
entry as read, plus this one, fits."""

from __future__ import annotations

from collections.abc import Sequence

from services.placer.core.groups import TenantQuota
from services.placer.core.quota import Usage, quota_reason, reservation_usage
from services.placer.core.tenancy import Tenancy
from services.placer.rules.translate import reservation_of
from shared.messages.ledger import Booking, TenantCharge, TenantLedger
from shared.subjects import tenant_key

# --- tenant charges --------------------------------------------------------------------------

MAX_TENANT_CHARGES = 2000
"""Charges one tenant's entry holds at most (about 300 bytes each: 2,000 stay well inside NATS's
default 1 MiB message). One charge per placed pod that counts against the quota, so a quota of
more than this many GPU shares cannot be used up; a pod past it is refused with that reason
rather than by a KV write that fails."""


def charge_of(booking: Booking, *, now: float) -> TenantCharge:
    """What ``booking`` counts against its tenant's quota."""
    usage = reservation_usage(reservation_of(booking))
    return TenantCharge(
        pod_uid=booking.pod_uid,
        namespace=booking.namespace,
        name=booking.name,
        node=booking.node,
        commit=booking.commit,
        gpus=usage.gpus,
        gpu_memory_mib=usage.gpu_memory_mib,
        charged_at=now,
        placer_id=booking.placer_id,
    )


def counts_against(quota: TenantQuota, charge: TenantCharge) -> bool:
    """Whether ``charge`` takes anything ``quota`` limits (a pod without GPU memory takes nothing
    from a memory-only quota): only those are charged, so a tenant's entry never lists more
    charges than its quota could hold."""
    return (quota.gpus is not None and charge.gpus > 0) or (
        quota.gpu_memory_mib is not None and charge.gpu_memory_mib > 0
    )


def charge_usage(charge: TenantCharge) -> Usage:
    return Usage(gpus=charge.gpus, gpu_memory_mib=charge.gpu_memory_mib)


def charged(ledger: TenantLedger | None) -> Usage:
    """Everything ``ledger`` charges."""
    total = Usage()
    for charge in ledger.charges if ledger else ():
        total = total + charge_usage(charge)
    return total


def charge_all(
    ledger: TenantLedger | None,
    tenant: str,
    quota: TenantQuota | None,
    charges: Sequence[TenantCharge],
    *,
    now: float,
) -> tuple[TenantLedger | None, dict[str, str]]:
    """The tenant's entry with every charge of ``charges`` that fits in ``quota`` on top of what
    the entry holds, one after the other; None when there is nothing to write.

    Also returns why each refused charge (by commit id) does not fit. A charge of a commit the
    entry already lists counts as done (a retry). Several commits of one tenant are charged by one
    compare-and-set this way (written together, like :func:`book_all`).
    """
    refused: dict[str, str] = {}
    accepted: list[TenantCharge] = []
    used = charged(ledger)
    listed = {c.commit for c in (ledger.charges if ledger else ())}
    for charge in charges:
        if charge.commit in listed:
            continue
        asked = charge_usage(charge)
        reason = quota_reason(quota, used, asked)
        if not reason and len(listed) >= MAX_TENANT_CHARGES:
            reason = (
                f"tenant {tenant}: {len(listed)} placements are charged against its quota, the "
                f"most one usage entry holds"
            )
        if reason:
            refused[charge.commit] = reason
            continue
        used = used + asked
        listed.add(charge.commit)
        accepted.append(charge)
    if not accepted:
        return None, refused
    kept = ledger.charges if ledger else ()
    return TenantLedger(tenant=tenant, charges=(*kept, *accepted), updated_at=now), refused


def with_charge(
    ledger: TenantLedger | None, tenant: str, charge: TenantCharge, *, now: float
) -> TenantLedger | None:
    """The entry with ``charge`` added whatever the quota (a placement that already exists is
    counted, it is not refused); None when it is listed already."""
    if ledger is not None and any(c.commit == charge.commit for c in ledger.charges):
        return None
    kept = ledger.charges if ledger else ()
    return TenantLedger(tenant=tenant, charges=(*kept, charge), updated_at=now)


def without_charge(ledger: TenantLedger | None, commit: str, *, now: float) -> TenantLedger | None:
    """The entry without the charge of ``commit``; None: it holds none (nothing to write)."""
    if ledger is None:
        return None
    kept = tuple(c for c in ledger.charges if c.commit != commit)
    if len(kept) == len(ledger.charges):
        return None
    return TenantLedger(tenant=ledger.tenant, charges=kept, updated_at=now)


def fence_of(charge: TenantCharge, tenant: str) -> Booking:
    """The booking-shaped fence of a charge whose commit never booked: what :func:`released_record`
    needs to leave the commit's record ``released`` (it holds no GPUs)."""
    return Booking(
        pod_uid=charge.pod_uid,
        namespace=charge.namespace,
        name=charge.name,
        node=charge.node,
        commit=charge.commit,
        tenant=tenant,
        decided_at=charge.charged_at,
        placer_id=charge.placer_id,
    )


class TenantEntries:
    """Each tenant's usage entry as the placer's view holds it, with its KV revision; the
    committed charges of each go into ``tenancy``'s usage."""

    def __init__(self, tenancy: Tenancy) -> None:
        self._tenancy = tenancy
        self._entries: dict[str, tuple[TenantLedger, int]] = {}

    def ledger(self, tenant: str) -> tuple[TenantLedger | None, int]:
        """``tenant``'s usage entry and its revision (None, 0: none yet)."""
        held = self._entries.get(tenant)
        return held if held is not None else (None, 0)

    def ledgers(self) -> dict[str, TenantLedger]:
        return {tenant: ledger for tenant, (ledger, _) in self._entries.items()}

    def keys(self) -> set[str]:
        return {tenant_key(tenant) for tenant in self._entries}

    def take(self, ledger: TenantLedger, revision: int) -> tuple[bool, bool]:
        """Take a tenant's usage entry at ``revision``: (taken: no newer one is held, gave back:
        its charges now add up to less than before)."""
        held = self._entries.get(ledger.tenant)
        if held is not None and revision <= held[1]:
            return False, False
        before = charged(held[0]) if held is not None else Usage()
        self._entries[ledger.tenant] = (ledger, revision)
        self._tenancy.set_committed(
            ledger.tenant, {c.pod_uid: charge_usage(c) for c in ledger.charges}
        )
        after = charged(ledger)
        return True, after.gpus < before.gpus or after.gpu_memory_mib < before.gpu_memory_mib

    def forget(self, key: str) -> bool:
        """Forget the entry under ``key`` (the store no longer has it); whether there was one."""
        gone = [t for t in self._entries if tenant_key(t) == key]
        for tenant in gone:
            del self._entries[tenant]
            self._tenancy.set_committed(tenant, {})
        return bool(gone)
