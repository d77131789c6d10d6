"""Seed 001's tenant quota: an upper limit minus what is already allocated caps what a tenant gets.

A tenant's usage is the sum over the reservations of its pods: one GPU per share placed (whole or
slice) and the MiB each share was booked with (a whole GPU counts the memory it was handed).
:class:`TenantUsage` keeps that sum per tenant as reservations are charged and refunded, by pod UID
so that both are idempotent, and refuses a charge that would take a tenant over its quota: like
the ledger, the quota cannot be exceeded whatever the caller computed.

Before any node is looked at, :func:`quota_reason` checks a pod's *least possible* usage against
what the tenant has left (the ``quota`` PreFilter). Memory given in MiB is exact; a percentage of
a GPU counts on the smallest GPU in view; a whole GPU counts the least free memory of any idle GPU.
The exact usage is known once GPUs are chosen, and is checked again then.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from services.placer.core.facts import PodFacts
from services.placer.core.groups import TenantQuota
from services.placer.core.model import Reservation
from services.placer.core.shape import GpuShape


class Usage(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """GPU shares and GPU memory held (or asked for)."""

    gpus: int = 0
    gpu_memory_mib: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            gpus=self.gpus + other.gpus, gpu_memory_mib=self.gpu_memory_mib + other.gpu_memory_mib
        )

    def __sub__(self, other: Usage) -> Usage:
        return Usage(
            gpus=self.gpus - other.gpus, gpu_memory_mib=self.gpu_memory_mib - other.gpu_memory_mib
        )


def reservation_usage(reservation: Reservation) -> Usage:
    """What ``reservation`` counts against its tenant's quota."""
    slices = [piece for container in reservation.containers for piece in container.gpus]
    return Usage(gpus=len(slices), gpu_memory_mib=sum(piece.memory_mib for piece in slices))


def least_usage(pod: PodFacts, gpus: Iterable[GpuShape]) -> Usage:
    """The least ``pod`` can count against a quota on any of ``gpus`` (see the module docstring)."""
    memory = 0
    smallest_total: int | None = None
    smallest_idle_free: int | None = None
    for ask in pod.asks:
        if ask.memory_mib is not None:
            memory += ask.shares * ask.memory_mib
            continue
        if ask.memory_pct is None and not ask.whole:
            continue  # cores only: no memory
        if smallest_total is None:
            shapes = list(gpus)
            healthy = [g for g in shapes if g.healthy]
            smallest_total = min((g.memory_total_mib for g in healthy), default=0)
            smallest_idle_free = min((g.memory_free_mib for g in healthy if g.idle), default=0)
        if ask.whole:
            memory += ask.shares * (smallest_idle_free or 0)
        else:
            memory += ask.shares * ask.memory_on(smallest_total)
    return Usage(gpus=pod.gpu_count, gpu_memory_mib=memory)


def quota_reason(quota: TenantQuota | None, used: Usage, asked: Usage) -> str:
    """Empty when ``asked`` fits in what the tenant has left, else a sentence saying what not."""
    if quota is None:
        return ""
    tenant = quota.tenant
    if quota.gpus is not None and used.gpus + asked.gpus > quota.gpus:
        left = max(0, quota.gpus - used.gpus)
        return (
            f"tenant {tenant}: GPU quota exceeded "
            f"(requested {asked.gpus} GPUs, remaining {left} of {quota.gpus})"
        )
    limit = quota.gpu_memory_mib
    if limit is not None and used.gpu_memory_mib + asked.gpu_memory_mib > limit:
        left = max(0, limit - used.gpu_memory_mib)
        return (
            f"tenant {tenant}: GPU memory quota exceeded "
            f"(requested {asked.gpu_memory_mib} MiB, remaining {left} MiB)"
        )
    return ""


class TenantUsage:
    """Usage per tenant, charged and refunded by pod UID (both idempotent)."""

    def __init__(self) -> None:
        self._by_tenant: dict[str, Usage] = {}
        self._charges: dict[str, tuple[str, Usage]] = {}

    def __contains__(self, pod_uid: object) -> bool:
        return pod_uid in self._charges

    def used(self, tenant: str) -> Usage:
        return self._by_tenant.get(tenant, Usage())

    def tenants(self) -> dict[str, Usage]:
        return dict(self._by_tenant)

    def charge(self, tenant: str, reservation: Reservation, quota: TenantQuota | None) -> str:
        """Count ``reservation`` against ``tenant``; empty on success, else why not (nothing done).

        A pod already charged is left as it is (a redelivered decision).
        """
        if reservation.pod_uid in self._charges:
            return ""
        usage = reservation_usage(reservation)
        reason = quota_reason(quota, self.used(tenant), usage)
        if reason:
            return reason
        self._charges[reservation.pod_uid] = (tenant, usage)
        self._by_tenant[tenant] = self.used(tenant) + usage
        return ""

    def refund(self, pod_uid: str) -> bool:
        """Give ``pod_uid``'s usage back; False when it held none."""
        charged = self._charges.pop(pod_uid, None)
        if charged is None:
            return False
        tenant, usage = charged
        left = self.used(tenant) - usage
        if left == Usage():
            del self._by_tenant[tenant]
        else:
            self._by_tenant[tenant] = left
        return True
