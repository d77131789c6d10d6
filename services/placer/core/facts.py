"""What a pod asks for, worked out once per request and read by every plugin.

``PodFacts`` turns a :class:`~.model.PodRequest` into the numbers plugins need (per-container
share asks, total CPU, the FGD paper's GPU milli, the GPU task kind) so that the hot loop over node
shapes never recomputes them. It also carries the validation verdict: a malformed request is
rejected as data by the framework before any node is looked at.
"""

from __future__ import annotations

import functools

import msgspec

from services.placer.core.model import (
    GPU_MILLI,
    ContainerRequest,
    PodRequest,
    Rejection,
    RejectionReason,
)


class ShareAsk(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """One container's GPU ask: ``shares`` distinct GPUs, each with this much."""

    container: str
    shares: int
    memory_mib: int | None
    memory_pct: int | None
    core_milli: int
    whole: bool
    """An exclusive whole GPU per share."""

    def memory_on(self, gpu_total_mib: int) -> int:
        """MiB this share takes on a GPU with ``gpu_total_mib`` of memory."""
        if self.memory_mib is not None:
            return self.memory_mib
        if self.memory_pct is not None:
            return gpu_total_mib * self.memory_pct // 100
        return 0

    def milli_on(self, gpu_total_mib: int) -> int:
        """This share in GPU milli (the larger of its compute and memory fractions)."""
        if self.whole:
            return GPU_MILLI
        memory = self.memory_on(gpu_total_mib)
        memory_milli = -(-memory * GPU_MILLI // gpu_total_mib) if gpu_total_mib else 0
        return max(self.core_milli, memory_milli)


class PodFacts(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """A validated pod request with everything plugins read precomputed."""

    request: PodRequest
    cpu_milli: int
    memory_mib: int
    asks: tuple[ShareAsk, ...]
    """One per container that wants GPUs, in container order."""
    gpu_count: int
    share_milli: int
    """GPU milli of one share for single-kind pods (1000 for whole GPUs; 0 without GPUs),
    judged against ``reference_gpu_mib``; what the paper's policies call ``gpu_milli``."""
    gpu_milli_total: int
    fractional: bool
    """Exactly one share, not whole and under a whole GPU: the paper's GPU-sharing task."""
    kind: str
    """GPU task kind for clustering: "" (no GPU), "share", or "<k>-gpu"."""
    invalid: str
    """Why the request cannot be placed anywhere (empty when valid)."""


REFERENCE_GPU_MIB = 16_000
"""The GPU size used to express memory-only shares in GPU milli when no GPU is in view yet."""


def _ask(container: ContainerRequest, physical: bool) -> ShareAsk:
    unspecified = (
        container.share_memory_mib is None
        and container.share_memory_pct is None
        and container.share_core_milli is None
    )
    whole = physical or unspecified
    return ShareAsk(
        container=container.name,
        shares=container.shares,
        memory_mib=None if whole else container.share_memory_mib,
        memory_pct=None if whole else container.share_memory_pct,
        core_milli=GPU_MILLI if whole else (container.share_core_milli or 0),
        whole=whole,
    )


def _invalid(request: PodRequest) -> str:
    if not request.containers:
        return "pod has no containers"
    for c in request.containers:
        if c.shares < 0 or c.cpu_milli < 0 or c.memory_mib < 0:
            return f"container {c.name!r}: negative request"
        if c.share_core_milli is not None and not 0 < c.share_core_milli <= GPU_MILLI:
            return f"container {c.name!r}: GPU cores must be 1..100 percent"
        if c.share_memory_pct is not None and not 0 < c.share_memory_pct <= 100:
            return f"container {c.name!r}: GPU memory percentage must be 1..100"
        if c.share_memory_mib is not None and c.share_memory_mib <= 0:
            return f"container {c.name!r}: GPU memory must be positive"
        if c.share_memory_mib is not None and c.share_memory_pct is not None:
            return f"container {c.name!r}: give GPU memory in MiB or as a percentage, not both"
        if c.shares == 0 and (
            c.share_memory_mib is not None
            or c.share_memory_pct is not None
            or c.share_core_milli is not None
        ):
            return f"container {c.name!r}: GPU memory or cores without tessera.dev/gpu"
        if (
            request.gpu_type == "virtual"
            and c.shares
            and (
                c.share_memory_mib is None
                and c.share_memory_pct is None
                and c.share_core_milli is None
            )
        ):
            return f"container {c.name!r}: gpu-type virtual needs GPU memory or cores per share"
    overlap = set(request.gpu_models) & set(request.gpu_models_excluded)
    if overlap:
        return f"GPU model both required and excluded: {', '.join(sorted(overlap))}"
    return ""


@functools.lru_cache(maxsize=4096)
def pod_facts(request: PodRequest) -> PodFacts:
    """Work out the facts of ``request`` (pure). Cached: deciding one pod asks for its facts in
    several places (queue order, tenancy, validation), and equal requests have equal facts."""
    physical = request.gpu_type == "physical"
    asks = tuple(_ask(c, physical) for c in request.containers if c.shares > 0)
    gpu_count = sum(a.shares for a in asks)
    share_milli = asks[0].milli_on(REFERENCE_GPU_MIB) if asks else 0
    gpu_milli_total = sum(a.shares * a.milli_on(REFERENCE_GPU_MIB) for a in asks)
    fractional = gpu_count == 1 and not asks[0].whole and share_milli < GPU_MILLI
    if gpu_count == 0:
        kind = ""
    elif any(not a.whole for a in asks) and share_milli < GPU_MILLI:
        kind = "share"
    else:
        kind = f"{gpu_count}-gpu"
    return PodFacts(
        request=request,
        cpu_milli=request.cpu_milli,
        memory_mib=request.memory_mib,
        asks=asks,
        gpu_count=gpu_count,
        share_milli=share_milli,
        gpu_milli_total=gpu_milli_total,
        fractional=fractional,
        kind=kind,
        invalid=_invalid(request),
    )


def invalid_rejection(facts: PodFacts, *, nodes: int, now: float) -> Rejection:
    """The rejection of a request that can never be placed (``facts.invalid``): unresolvable."""
    return Rejection(
        pod_uid=facts.request.uid,
        reasons=(RejectionReason(reason=f"invalid request: {facts.invalid}", nodes=nodes),),
        unresolvable=True,
        decided_at=now,
    )
