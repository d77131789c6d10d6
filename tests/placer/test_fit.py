"""NodeFit: CPU, memory, GPU count, memory and cores per share, model, health, physical/virtual."""

from __future__ import annotations

import pytest

from services.placer.core.facts import pod_facts
from services.placer.core.model import NodeState, PodRequest
from services.placer.core.plugins.fit import GpuModel, NodeFit
from services.placer.core.shape import node_shape
from tests.placer.builders import node, pod

FIT = NodeFit((GpuModel(),))


@pytest.mark.parametrize(
    ("request_", "state", "reason"),
    [
        pytest.param(
            pod().cpu_only(4_000).build(), node("n").cpu(8_000).build(), None, id="cpu-fits"
        ),
        pytest.param(
            pod().cpu_only(9_000).build(),
            node("n").cpu(8_000).build(),
            "insufficient CPU",
            id="cpu-short",
        ),
        pytest.param(
            pod().cpu_only(1_000, memory=9_000).build(),
            node("n").memory(16_000, used=8_000).build(),
            "insufficient memory",
            id="memory-short",
        ),
        pytest.param(
            pod().cpu_only(1_000).build(),
            node("n").cordoned().build(),
            "node unschedulable",
            id="cordoned",
        ),
        pytest.param(
            pod().share(500).build(), node("n").gpu(used=400).build(), None, id="share-fits"
        ),
        pytest.param(
            pod().share(700).build(),
            node("n").gpu(used=400).build(),
            "insufficient GPU memory or cores",
            id="share-too-big",
        ),
        pytest.param(
            pod().share(500).build(),
            node("n").gpu(foreign_mib=9_000).build(),
            "insufficient GPU memory or cores",
            id="foreign-memory-is-not-free",
        ),
        pytest.param(
            pod().container(shares=1, mib=4_000, cores=60).build(),
            node("n").gpu(used=0, cores_used=500).build(),
            "insufficient GPU memory or cores",
            id="cores-short-memory-fine",
        ),
        pytest.param(
            pod().container(shares=1, pct=50).build(),
            node("n").gpu(mib=40_000, used=400).build(),
            None,
            id="percentage-of-gpu-memory",
        ),
        pytest.param(
            pod().whole(2).build(),
            node("n").gpu().gpu(used=100).build(),
            "not enough idle GPUs",
            id="two-whole-one-idle",
        ),
        pytest.param(pod().whole(2).build(), node("n").gpus(2).build(), None, id="two-whole"),
        pytest.param(
            pod().share(100).build(),
            node("n").gpu(healthy=False).build(),
            "unhealthy GPU",
            id="unhealthy-only",
        ),
        pytest.param(
            pod().share(100).build(),
            node("n").gpu(exclusive=True).build(),
            "insufficient GPU memory or cores",
            id="exclusive-held",
        ),
        pytest.param(
            pod().share(100).with_(gpu_models=("H100",)).build(),
            node("n").gpu(model="A100").build(),
            "too few GPUs of an allowed model or group",
            id="model-required",
        ),
        pytest.param(
            pod().share(100).with_(gpu_models_excluded=("A100",)).build(),
            node("n").gpu(model="A100").gpu(model="T4").build(),
            None,
            id="model-excluded-other-fits",
        ),
        pytest.param(
            pod().share(100).with_(gpu_models_excluded=("A100",)).build(),
            node("n").gpu(model="A100").build(),
            "too few GPUs of an allowed model or group",
            id="model-excluded",
        ),
        pytest.param(
            pod().share(100).with_(gpu_models=("A100",)).build(),
            node("n").gpu(model="NVIDIA A100-SXM4-80GB").build(),
            None,
            id="model-family-matches-nvml-name",
        ),
        pytest.param(
            pod().share(100).with_(gpu_models=("a100",)).build(),
            node("n").gpu(model="A100-80GB").build(),
            None,
            id="model-family-matches-memory-suffix",
        ),
        pytest.param(
            pod().share(100).with_(gpu_models=("A10",)).build(),
            node("n").gpu(model="A100-80GB").build(),
            "too few GPUs of an allowed model or group",
            id="model-family-is-not-a-prefix-of-another",
        ),
        pytest.param(
            pod().share(100).with_(gpu_models_excluded=("A100",)).build(),
            node("n").gpu(model="A100-80GB").build(),
            "too few GPUs of an allowed model or group",
            id="model-family-excluded",
        ),
        pytest.param(pod().share(100).build(), node("n").build(), "no GPUs", id="no-gpus"),
        pytest.param(
            pod().container(shares=1, mib=1_000).with_(gpu_type="physical").build(),
            node("n").gpu(used=100).build(),
            "not enough idle GPUs",
            id="physical-needs-idle",
        ),
        pytest.param(
            pod().container(shares=2, mib=6_000).build(),
            node("n").gpu(used=500).gpu(used=700).gpu().build(),
            None,
            id="two-shares-distinct-gpus",
        ),
        pytest.param(
            pod().container(shares=2, mib=9_000).build(),
            node("n").gpu(used=500).gpu().build(),
            "insufficient GPU memory or cores",
            id="two-shares-need-two-gpus",
        ),
        pytest.param(
            pod().container("a", shares=1, mib=6_000).container("b", shares=1, mib=6_000).build(),
            node("n").gpu().build(),
            None,
            id="two-containers-share-one-gpu",
        ),
        pytest.param(
            pod().container("a", shares=1, mib=9_000).container("b", shares=1, mib=9_000).build(),
            node("n").gpu().build(),
            "insufficient GPU memory or cores",
            id="two-containers-too-big-together",
        ),
        pytest.param(
            pod().share(100).build(),
            node("n").gpu(slots=2, slots_used=2).build(),
            "insufficient GPU memory or cores",
            id="no-logical-slot-left",
        ),
    ],
)
def test_node_fit(request_: PodRequest, state: NodeState, reason: str | None) -> None:
    assert FIT.filter(pod_facts(request_), node_shape(state)) == reason
