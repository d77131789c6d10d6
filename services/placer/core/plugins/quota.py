"""The ``quota`` PreFilter (seed 001): reject a pod whose tenant has too little quota left.

It runs once per pod, before any node is looked at, and compares the pod's least possible usage
(``quota.least_usage``) with the tenant's limit minus what it already holds, read from a
:class:`QuotaSource` (the service's ``Tenancy``, which the shell keeps current). Over the limit,
the pod waits with a reason such as ``tenant research: GPU memory quota exceeded (requested 40960
MiB, remaining 8192 MiB)``: releasing the tenant's other pods can make room, so it is
unschedulable, not unresolvable. The exact usage is checked again when the GPUs are chosen.
"""

from __future__ import annotations

from typing import Protocol

from services.placer.core.facts import PodFacts
from services.placer.core.framework import SUCCESS, CycleState, Status
from services.placer.core.groups import TenantQuota
from services.placer.core.index import ClusterIndex
from services.placer.core.quota import Usage, least_usage, quota_reason

NAME = "quota"


class QuotaSource(Protocol):
    """Where the current quotas and usage come from (read on every decision)."""

    def quota_of(self, tenant: str) -> TenantQuota | None: ...

    def used(self, tenant: str) -> Usage: ...


class QuotaPreFilter:
    """Rejects, as data, a pod that would take its tenant over its quota."""

    name = NAME

    def __init__(self, source: QuotaSource) -> None:
        self.source = source

    def pre_filter(self, pod: PodFacts, cluster: ClusterIndex, state: CycleState) -> Status:
        quota = self.source.quota_of(pod.request.tenant)
        if quota is None or not pod.asks:
            return SUCCESS
        live = (cluster.shapes[sid] for sid in cluster.groups)
        asked = least_usage(pod, (gpu for shape in live for gpu in shape.gpus))
        reason = quota_reason(quota, self.source.used(pod.request.tenant), asked)
        if reason:
            return Status(code="unschedulable", reason=reason, plugin=NAME)
        return SUCCESS
