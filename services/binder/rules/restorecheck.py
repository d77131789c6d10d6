"""Pure: the placements restored on one node, checked before any is booked (docs/design.md §12).

A placement restored from a pod's ``tessera.dev/assignment`` annotation is what the annotation
says, and an annotation can be wrong (edited before the webhook guarded it, written by a binder
that died half-way). Booked blindly, a wrong one books a GPU the pod does not use and leaves the
one it does use looking emptier: the next pod placed there over-commits it. So the placements of
one node are checked together against what the node's device plugin records it granted
(``shared.messages.grants.NodeGrants``: kept across its restarts and across the store loss) and
against the node's GPUs:

1. A pod the plugin granted GPUs to is restored as the plugin granted them: its granted
   containers get the slices they were handed and the grant's commit, whatever the annotation
   says (``corrected``, with each difference named), and a pod whose every GPU container was
   granted is restored ``allocated``. Of any other pod, a slice smaller than its spec asks is
   raised to it (``corrected``).
2. Those placements are booked as they are (they are what runs). Then, in the order they were
   decided, each placement the plugin cannot vouch for is booked only if it puts no GPU over its
   memory or 100 % of its SMs and names GPUs the node has; otherwise it is not booked
   (``overcommit``): the plugin handed that pod nothing, so no GPU of it is in use.
3. When the plugin did not answer (its node down, an older plugin), nothing can be vouched for:
   every placement is booked as its annotation says, and one that puts a GPU over 100 % of its
   SMs is booked all the same (``overfull``: the GPU then counts as full, which never
   over-commits it) and reported. GPU memory is unknown without the plugin's answer.

Every outcome but ``restored`` is reported by the shell (an Event on the pod, a metric, a log
line, ``restoring.py``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Final, Literal

import msgspec

from shared.messages.base import ContainerSlices, GpuSlice
from shared.messages.grants import GrantedPod, NodeGrants
from shared.messages.pods import ContainerRequest, PodRestore

Outcome = Literal["restored", "corrected", "overcommit", "overfull"]

FULL_CORES: Final = 100


class Checked(msgspec.Struct, frozen=True, kw_only=True):
    """One pod's placement after the check: what to book (None: nothing) and why."""

    pod_uid: str
    restore: PodRestore | None
    outcome: Outcome
    problems: tuple[str, ...] = ()


def _shown(gpus: Sequence[GpuSlice]) -> str:
    return ", ".join(f"GPU {s.uuid} ({s.memory_mib} MiB, {s.cores}% of SMs)" for s in gpus) or (
        "no GPU"
    )


def _whole(asked: ContainerRequest | None, restore: PodRestore) -> bool:
    if asked is None:
        return False
    unspecified = asked.gpu_memory_mib is None and asked.gpu_memory_pct is None
    return restore.pod.hints.gpu_type == "physical" or (unspecified and asked.gpu_cores is None)


def _at_least_the_spec(restore: PodRestore) -> tuple[PodRestore, list[str]]:
    """Each slice raised to what the pod's spec asks per share (MiB and SMs), when smaller."""
    asked = {c.name: c for c in restore.pod.containers}
    problems: list[str] = []
    containers = []
    for placed in restore.containers:
        request = asked.get(placed.container)
        memory = request.gpu_memory_mib if request is not None else None
        cores = request.gpu_cores if request is not None else None
        if _whole(request, restore):
            cores = FULL_CORES
        gpus = []
        for piece in placed.gpus:
            fixed = msgspec.structs.replace(
                piece,
                memory_mib=max(piece.memory_mib, memory or 0),
                cores=max(piece.cores, cores or 0),
            )
            if fixed != piece:
                problems.append(
                    f"container {placed.container!r}: the annotation gives {_shown([piece])}, "
                    f"less than its spec asks; counted as {fixed.memory_mib} MiB, "
                    f"{fixed.cores}% of SMs"
                )
            gpus.append(fixed)
        containers.append(msgspec.structs.replace(placed, gpus=tuple(gpus)))
    return msgspec.structs.replace(restore, containers=tuple(containers)), problems


def _as_granted(restore: PodRestore, grant: GrantedPod) -> tuple[PodRestore, list[str]]:
    """``restore`` with each granted container's slices as the plugin handed them."""
    granted = {c.container: c for c in grant.containers if c.gpus}
    problems: list[str] = []
    containers: list[ContainerSlices] = []
    for placed in restore.containers:
        handed = granted.get(placed.container)
        if handed is None:
            containers.append(placed)
            continue
        if handed.gpus != placed.gpus:
            problems.append(
                f"tessera.dev/assignment gives container {placed.container!r} "
                f"{_shown(placed.gpus)}; the device plugin on {restore.node} granted it "
                f"{_shown(handed.gpus)}"
            )
        containers.append(msgspec.structs.replace(placed, gpus=handed.gpus))
    commit = restore.commit
    if grant.commit and grant.commit != restore.commit:
        problems.append(
            f"tessera.dev/assignment names commit {restore.commit}; the device plugin granted "
            f"commit {grant.commit}"
        )
        commit = grant.commit
    with_gpus = {c.container for c in restore.containers if c.gpus}
    state = "allocated" if with_gpus and with_gpus <= set(granted) else restore.state
    corrected = msgspec.structs.replace(
        restore, containers=tuple(containers), commit=commit, state=state
    )
    return corrected, problems


class _Gpus:
    """What the placements booked so far take of each GPU."""

    def __init__(self, answer: NodeGrants | None) -> None:
        self.size = {g.uuid: g.memory_mib for g in answer.gpus} if answer is not None else None
        self.memory: dict[str, int] = defaultdict(int)
        self.cores: dict[str, int] = defaultdict(int)

    def problem(self, restore: PodRestore) -> str | None:
        """Why booking ``restore`` on top would be impossible or over-commit a GPU."""
        memory, cores = dict(self.memory), dict(self.cores)
        for placed in restore.containers:
            for piece in placed.gpus:
                if self.size is not None and piece.uuid not in self.size:
                    return f"it names GPU {piece.uuid}, which node {restore.node} does not have"
                memory[piece.uuid] = memory.get(piece.uuid, 0) + piece.memory_mib
                cores[piece.uuid] = cores.get(piece.uuid, 0) + piece.cores
        for uuid, used in sorted(cores.items()):
            if used > FULL_CORES:
                return f"GPU {uuid} would be handed {used}% of its SMs"
            size = self.size.get(uuid) if self.size is not None else None
            if size is not None and memory[uuid] > size:
                return f"GPU {uuid} would be handed {memory[uuid]} MiB of its {size} MiB"
        return None

    def book(self, restore: PodRestore) -> None:
        for placed in restore.containers:
            for piece in placed.gpus:
                self.memory[piece.uuid] += piece.memory_mib
                self.cores[piece.uuid] += piece.cores


def check_node(restores: Sequence[PodRestore], answer: NodeGrants | None) -> list[Checked]:
    """The placements restored on one node (every bound pod there, recorded or not: they all
    hold GPUs), checked against the plugin's ``answer`` (None: it did not answer); one
    :class:`Checked` per restore, in the order given (see the module docstring)."""
    grants = {g.pod_uid: g for g in answer.granted} if answer is not None else {}
    vouched: list[tuple[PodRestore, list[str]]] = []
    unvouched: list[tuple[PodRestore, list[str]]] = []
    for restore in restores:
        grant = grants.get(restore.pod.uid)
        if grant is not None and any(c.gpus for c in grant.containers):
            vouched.append(_as_granted(restore, grant))
        else:
            unvouched.append(_at_least_the_spec(restore))
    gpus = _Gpus(answer)
    checked: dict[str, Checked] = {}
    for restore, problems in vouched:
        overflow = gpus.problem(restore)
        gpus.book(restore)
        outcome: Outcome = "overfull" if overflow else "corrected" if problems else "restored"
        notes = (*problems, *([overflow] if overflow else []))
        checked[restore.pod.uid] = Checked(
            pod_uid=restore.pod.uid, restore=restore, outcome=outcome, problems=notes
        )
    for restore, problems in sorted(unvouched, key=lambda r: (r[0].decided_at, r[0].pod.uid)):
        overflow = gpus.problem(restore)
        if overflow is None:
            outcome = "corrected" if problems else "restored"
            gpus.book(restore)
            checked[restore.pod.uid] = Checked(
                pod_uid=restore.pod.uid, restore=restore, outcome=outcome, problems=tuple(problems)
            )
        elif answer is not None:
            reason = f"not booked: {overflow}, and the device plugin granted this pod nothing"
            checked[restore.pod.uid] = Checked(
                pod_uid=restore.pod.uid,
                restore=None,
                outcome="overcommit",
                problems=(*problems, reason),
            )
        else:
            reason = f"booked as annotated though {overflow} (the device plugin did not answer)"
            gpus.book(restore)
            checked[restore.pod.uid] = Checked(
                pod_uid=restore.pod.uid,
                restore=restore,
                outcome="overfull",
                problems=(*problems, reason),
            )
    return [checked[r.pod.uid] for r in restores]
