"""KV ``tessera-stats``: cluster statistics a placer measures on its books (placer -> dashboard).

Each placer replica puts its latest :class:`ClusterStats` under ``subjects.stats_key(placer_id)``
periodically. Fragmentation is measured the way the placement core measures it (FGD, Weng et al.,
ATC '23: for the typical task mix, the expected GPU capacity no typical task could use), which only
the placer can compute; the dashboard shows the freshest entry and says "n/a" when there is none.
"""

from __future__ import annotations

from shared.messages.base import Message


class TenantUsage(Message, frozen=True, kw_only=True):
    """What one tenant holds in the placer's books, and its quota when the tenancy gives one."""

    tenant: str
    pods: int = 0
    gpus: int = 0
    """GPU shares booked (a whole GPU and a slice each count one, as quotas count them)."""
    gpu_memory_mib: int = 0
    core_milli: int = 0
    """Thousandths of GPUs' SMs (a whole GPU is 1000)."""
    quota_gpus: int | None = None
    quota_gpu_memory_mib: int | None = None


class ClusterStats(Message, frozen=True, kw_only=True):
    """One placer's view of the whole cluster at ``computed_at``.

    GPU capacity is counted in milli-GPUs (1000 per physical GPU), as in the placement core.
    """

    placer_id: str
    computed_at: float
    """Seconds since the epoch when the figures were taken."""
    profile: str = ""
    """The placement profile the placer runs (its task mix and scoring)."""
    nodes: int = 0
    """GPU nodes the placer can place on."""
    gpus: int = 0
    gpu_milli_capacity: int = 0
    """1000 per GPU the placer counts (healthy GPUs on placeable nodes)."""
    gpu_milli_allocated: int = 0
    """Booked in the placer's ledger (reserved, bound and allocated records)."""
    fragmented_milli: float = 0.0
    """Sum over nodes of the expected GPU milli the typical task mix cannot use (F_n)."""
    fragmentation_pct: float = 0.0
    """``100 * fragmented_milli / gpu_milli_capacity`` (0 when there is no capacity)."""
    node_fragmented_milli: dict[str, float] = {}
    """Per node ``F_n``: where the fragments are."""
    typical_tasks: int = 0
    """Entries in the typical task mix the measure used (0 = the profile's built-in mix)."""
    pending_pods: int = 0
    """Pods in the placer's queue waiting for a fit."""
    pods_reserved: int = 0
    """Pods placed (booking and claim written) with no record of that commit yet: the
    ``reserved`` stage, before the binder writes the record ``bound``."""
    tenants: tuple[TenantUsage, ...] = ()
    """Per tenant with a booking or a quota, by name (empty in statistics of older placers)."""
