"""A node's restored placements checked before they are booked (``restorecheck.py``, pure):
against what the node's device plugin granted, and against its GPUs, table-driven."""

from __future__ import annotations

import msgspec
import pytest

from services.binder.rules.restorecheck import Outcome, check_node
from shared.messages.base import ContainerSlices, GpuSlice
from shared.messages.grants import GrantedPod, NodeGpu, NodeGrants
from shared.messages.pods import ContainerRequest, PlacementHints, PodPending, PodRestore

GPUS = (
    NodeGpu(uuid="GPU-0", index=0, memory_mib=81920),
    NodeGpu(uuid="GPU-1", index=1, memory_mib=81920),
)


def on(uuid: str, memory: int = 60000, cores: int = 50) -> GpuSlice:
    return GpuSlice(uuid=uuid, index=int(uuid[-1]), memory_mib=memory, cores=cores)


def restore(
    uid: str, *gpus: GpuSlice, memory: int = 60000, cores: int = 50, at: float = 1.0
) -> PodRestore:
    request = ContainerRequest(
        name="main", gpu_shares=len(gpus), gpu_memory_mib=memory, gpu_cores=cores
    )
    return PodRestore(
        pod=PodPending(
            uid=uid, namespace="ml", name=uid, containers=(request,), hints=PlacementHints()
        ),
        node="n1",
        containers=(ContainerSlices(container="main", gpus=gpus),),
        decided_at=at,
        placer_id="placer-1",
        commit=f"c-{uid}",
        state="bound",
        epoch="e2",
    )


def granted(uid: str, *gpus: GpuSlice, commit: str = "") -> GrantedPod:
    return GrantedPod(
        pod_uid=uid,
        commit=commit or f"c-{uid}",
        containers=(ContainerSlices(container="main", gpus=gpus),),
    )


def answer(*pods: GrantedPod) -> NodeGrants:
    return NodeGrants(node="n1", gpus=GPUS, granted=pods, answered_at=2.0)


CASES = [
    pytest.param(
        [restore("a", on("GPU-0"))],
        answer(granted("a", on("GPU-0"))),
        [("restored", ("GPU-0",), "allocated", "")],
        id="as-granted",
    ),
    pytest.param(
        [restore("a", on("GPU-1"))],  # the owner pointed the annotation at the other GPU
        answer(granted("a", on("GPU-0"))),
        [
            (
                "corrected",
                ("GPU-0",),
                "allocated",
                "tessera.dev/assignment gives container 'main' GPU GPU-1 (60000 MiB, 50% of SMs); "
                "the device plugin on n1 granted it GPU GPU-0 (60000 MiB, 50% of SMs)",
            )
        ],
        id="edited-annotation-resolved-from-the-plugin",
    ),
    pytest.param(
        [restore("a", on("GPU-0")), restore("b", on("GPU-0"), at=2.0)],
        answer(granted("a", on("GPU-0"))),
        [
            ("restored", ("GPU-0",), "allocated", ""),
            (
                "overcommit",
                None,
                "",
                "not booked: GPU GPU-0 would be handed 120000 MiB of its 81920 MiB, and the "
                "device plugin granted this pod nothing",
            ),
        ],
        id="unvouched-over-commit-not-booked",
    ),
    pytest.param(
        [
            restore("a", on("GPU-0", cores=60)),
            restore("b", on("GPU-0", memory=1000, cores=60), memory=1000, cores=60, at=2.0),
        ],
        None,
        [
            ("restored", ("GPU-0",), "bound", ""),
            (
                "overfull",
                ("GPU-0",),
                "bound",
                "booked as annotated though GPU GPU-0 would be handed 120% of its SMs (the "
                "device plugin did not answer)",
            ),
        ],
        id="no-answer-booked-over-full",
    ),
    pytest.param(
        [restore("a", on("GPU-7"))],
        answer(),
        [
            (
                "overcommit",
                None,
                "",
                "not booked: it names GPU GPU-7, which node n1 does not have, and the device "
                "plugin granted this pod nothing",
            )
        ],
        id="no-such-gpu",
    ),
    pytest.param(
        [restore("a", on("GPU-1", memory=1, cores=1))],  # edited down to look small
        answer(),
        [
            (
                "corrected",
                ("GPU-1",),
                "bound",
                "container 'main': the annotation gives GPU GPU-1 (1 MiB, 1% of SMs), less than "
                "its spec asks; counted as 60000 MiB, 50% of SMs",
            )
        ],
        id="smaller-than-the-spec-raised",
    ),
]


@pytest.mark.parametrize(("restores", "grants", "expected"), CASES)
def test_restored_placements_are_checked_against_the_plugin_and_the_gpus(
    restores: list[PodRestore],
    grants: NodeGrants | None,
    expected: list[tuple[Outcome, tuple[str, ...] | None, str, str]],
) -> None:
    checked = check_node(restores, grants)
    assert [c.pod_uid for c in checked] == [r.pod.uid for r in restores]
    for verdict, (outcome, gpus, state, problem) in zip(checked, expected, strict=True):
        assert verdict.outcome == outcome, verdict
        if gpus is None:
            assert verdict.restore is None
        else:
            assert verdict.restore is not None
            assert tuple(g.uuid for c in verdict.restore.containers for g in c.gpus) == gpus
            assert verdict.restore.state == state
        assert list(verdict.problems) == ([problem] if problem else [])


def test_a_corrected_placement_takes_the_grant_s_commit() -> None:
    (verdict,) = check_node(
        [restore("a", on("GPU-1"))], answer(granted("a", on("GPU-0"), commit="placer-2.x"))
    )
    assert verdict.restore is not None and verdict.restore.commit == "placer-2.x"
    assert verdict.problems[-1] == (
        "tessera.dev/assignment names commit c-a; the device plugin granted commit placer-2.x"
    )
    unchanged = msgspec.structs.replace(verdict.restore, commit="c-a")
    assert unchanged.containers[0].gpus == (on("GPU-0"),)
