"""The typical task mix FGD and the tessera profile score with, learned online (pure).

FGD scores a node by how much a placement changes its expected fragmentation *for the cluster's
typical tasks* (docs/design.md §6). The simulator reads that mix from a trace; the service learns it
from what it places:

- **What is seen.** Every pod any replica placed, as its claim holds it (so
  every replica, and a replica started later, sees the same pods: the mix is a function of the KV
  state, not of which replica happened to receive which pod). A pod counts once, with its latest
  placement. Its spec is (CPU milli, GPU count, GPU milli per GPU, memory MiB), GPU milli being
  the larger of the share's compute and memory fractions of its GPU (1000 for a whole GPU).
- **Sliding window.** The newest ``window`` pods by decision time (``--task-mix-window``,
  default :data:`WINDOW`). From them, :func:`~.core.fragmentation.typical_mix` keeps the most
  frequent specs covering 95 % of the window, each with the median memory of its spec, as in the
  FGD paper's methodology.
- **Prior.** Until enough pods were seen the learned mix is noisy, so it is blended with
  :data:`~.core.profiles.DEFAULT_TYPICAL_TASKS` (a generic shared-GPU cluster) counted as
  :data:`PRIOR_PODS` pods: with ``n`` pods in the window the learned mix weighs
  ``n / (n + 200)``: nothing at start, half at 200 pods, 91 % at a full window of 2,000. A task
  only the prior gives is ``assumed``: the fed measure keeps no scarce hosts for it.
- **Stability.** Weights are rounded to :data:`WEIGHT_STEP`, so the mix (and the compiled profile,
  whose shape memo starts over with it) changes only when the proportions really move.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

import msgspec

from services.placer.core.fragmentation import TypicalTask, typical_mix, with_median_memory
from services.placer.core.model import GPU_MILLI, Reservation
from services.placer.core.profiles import DEFAULT_TYPICAL_TASKS

WINDOW = 2000
"""Placed pods the mix is learned from, by default."""
PRIOR_PODS = 200
"""How many pods the prior mix counts as."""

WEIGHT_STEP = 0.005
RECOMPILE_JUDGEMENTS = 20
"""Node-shape judgements per decision a compile of the profile may cost, on average."""
MIX_STALE_S = 60.0
"""A mix that moved is compiled after this long at the latest, however few decisions ran."""
COVERAGE = 0.95
FALLBACK_GPU_MIB = 16_000
"""GPU memory assumed for a share whose GPU is not in view (only shapes a fraction)."""


class TaskSpec(msgspec.Struct, frozen=True, gc=False, kw_only=True, order=True):
    cpu_milli: int
    gpu_milli: int
    gpu_count: int
    memory_mib: int


def task_spec(
    reservation: Reservation, gpu_memory_mib: Callable[[str, int], int | None]
) -> TaskSpec:
    """The spec of a placed pod; ``gpu_memory_mib(node, index)`` gives a GPU's total memory."""
    slices = [s for c in reservation.containers for s in c.gpus]
    milli = 0
    for piece in slices:
        if piece.exclusive:
            milli = GPU_MILLI
            break
        total = gpu_memory_mib(reservation.node, piece.index) or FALLBACK_GPU_MIB
        memory = -(-piece.memory_mib * GPU_MILLI // total)
        milli = max(milli, piece.core_milli, min(GPU_MILLI, memory))
    return TaskSpec(
        cpu_milli=reservation.cpu_milli,
        gpu_milli=milli,
        gpu_count=len(slices),
        memory_mib=reservation.memory_mib,
    )


def _spec_of(task: TypicalTask) -> TypicalTask:
    """``task`` without its weight and mark: what tasks of the same spec merge on."""
    return msgspec.structs.replace(task, weight=0.0, assumed=False)


def blend(
    learned: Sequence[TypicalTask], seen: int, prior: Sequence[TypicalTask], prior_pods: int
) -> tuple[TypicalTask, ...]:
    """``learned`` (from ``seen`` pods) and ``prior`` weighed by pods, weights rounded; a task
    only the prior gives is marked ``assumed``."""
    learned_share = seen / (seen + prior_pods) if seen + prior_pods else 0.0
    prior_total = sum(t.weight for t in prior) or 1.0
    learned_total = sum(t.weight for t in learned) or 1.0
    weighted = [
        *(
            (t, (1 - learned_share) * t.weight / prior_total)
            for t in prior
            if learned_share < 1 and t.weight > 0
        ),
        *((t, learned_share * t.weight / learned_total) for t in learned),
    ]
    merged: dict[TypicalTask, float] = {}
    for task, weight in weighted:
        key = _spec_of(task)
        merged[key] = merged.get(key, 0.0) + weight
    steps = {task: round(weight / WEIGHT_STEP) for task, weight in merged.items()}
    learned_specs = {_spec_of(t) for t in learned}
    return tuple(
        msgspec.structs.replace(task, weight=n * WEIGHT_STEP, assumed=task not in learned_specs)
        for task, n in sorted(
            steps.items(), key=lambda kv: (kv[0].gpu_count, kv[0].gpu_milli, kv[0].cpu_milli)
        )
        if n > 0
    )


def compile_due(*, moved: bool, decisions: int, judgements: int, elapsed_s: float) -> bool:
    """Whether to compile the profile again now that the learned mix ``moved``.

    A compile starts the profile's judgement memo over: every node shape is judged again for
    every request asked (about 100 us each for the tessera profile on 8 GPUs; thousands of shapes
    on a large cluster, so seconds of work). So a compile waits until the ``decisions`` since the
    last one have paid for the ``judgements`` made since, at :data:`RECOMPILE_JUDGEMENTS` each,
    or until :data:`MIX_STALE_S` passed (``elapsed_s``). A small cluster compiles within a few
    decisions, as before; a burst onto 10,000 nodes no longer spends most of its time judging
    again after compiles that its own placements keep triggering.
    """
    if not moved:
        return False
    return decisions * RECOMPILE_JUDGEMENTS >= judgements or elapsed_s >= MIX_STALE_S


class TaskMix:
    """The pods seen, by UID, and the typical mix of the newest ``window`` of them."""

    def __init__(
        self,
        *,
        window: int,
        prior: Sequence[TypicalTask] = DEFAULT_TYPICAL_TASKS,
        prior_pods: int = PRIOR_PODS,
    ) -> None:
        if window < 1:
            raise ValueError("the task mix window must hold at least one pod")
        self.window = window
        self.prior = tuple(prior)
        self.prior_pods = prior_pods
        self._seen: dict[str, tuple[float, TaskSpec]] = {}

    def __len__(self) -> int:
        return len(self._seen)

    def observe(self, pod_uid: str, spec: TaskSpec, at: float) -> None:
        """Count ``pod_uid`` with ``spec``, placed at ``at`` (replaces an earlier placement)."""
        self._seen[pod_uid] = (at, spec)

    def forget(self, pod_uid: str) -> None:
        self._seen.pop(pod_uid, None)

    def typical(self) -> tuple[TypicalTask, ...]:
        """The blended, rounded mix (deterministic for equal pods seen)."""
        newest = heapq.nlargest(
            self.window, ((at, uid, spec) for uid, (at, spec) in self._seen.items())
        )
        specs = [spec for _, _, spec in newest]
        learned = typical_mix(
            ((s.cpu_milli, s.gpu_milli, s.gpu_count, ()) for s in specs), coverage=COVERAGE
        )
        learned = with_median_memory(
            learned, ((s.cpu_milli, s.gpu_milli, s.gpu_count, (), s.memory_mib) for s in specs)
        )
        return blend(learned, len(specs), self.prior, self.prior_pods)
