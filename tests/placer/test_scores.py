"""Node scores, each against values worked out by hand from the plugin docstrings' formulas."""

from __future__ import annotations

import math

import pytest

from services.placer.core.facts import pod_facts
from services.placer.core.fragmentation import FragmentationModel, TypicalTask
from services.placer.core.model import NodeState, PodRequest
from services.placer.core.plugins.balance import BalanceArgs, BalanceScore
from services.placer.core.plugins.bestfit import BestFitScore, min_max
from services.placer.core.plugins.binpack import BinpackScore
from services.placer.core.plugins.clustering import ClusteringScore
from services.placer.core.plugins.dotprod import DotProdScore
from services.placer.core.plugins.fgd import FgdScore
from services.placer.core.plugins.packing import PackingScore
from services.placer.core.plugins.spread import SpreadScore
from services.placer.core.shape import node_shape
from tests.placer.builders import node, pod

# Half CPU-only tasks, half 0.5-GPU shares: small enough to work out by hand.
MIX = FragmentationModel(
    (
        TypicalTask(cpu_milli=1_000, gpu_count=0, gpu_milli=0, weight=1),
        TypicalTask(cpu_milli=1_000, gpu_count=1, gpu_milli=500, weight=1),
    )
)
# 2 GPUs: 300 milli free and 1000 free; 32 cores free of 64.
HALF_USED = node("n").cpu(64_000, used=32_000).gpu(used=700).gpu().build()


def score_of(plugin: object, request: PodRequest, state: NodeState) -> float:
    return plugin.score(pod_facts(request), node_shape(state))  # type: ignore[attr-defined,no-any-return]


def test_fragmentation_by_hand() -> None:
    # idle = 1300. CPU-only task: all 1300 stranded. 0.5 share fits on the free GPU, so only the
    # 300 left on the other is stranded. F = 0.5 * 1300 + 0.5 * 300 = 800.
    assert MIX.node(frozenset({"A100"}), 32_000, 0, (300, 1000)) == pytest.approx(800)
    # Without CPU for either task, everything idle is a fragment.
    assert MIX.node(frozenset({"A100"}), 500, 0, (300, 1000)) == pytest.approx(1300)


@pytest.mark.parametrize(
    ("plugin", "request_", "state", "expected"),
    [
        # F = 800; on GPU 0 (300 free) F' = 500 -> sigmoid(0.3) = 0.574 -> 57; on GPU 1 -> 53.
        pytest.param(FgdScore(MIX), pod().share(300).build(), HALF_USED, 57, id="fgd-best-gpu"),
        pytest.param(
            FgdScore(MIX, exact=True),
            pod().share(300).build(),
            HALF_USED,
            100 / (1 + math.exp(-0.3)),
            id="fgd-exact",
        ),
        # Coarser steps: 57 -> 56 with step 4 (more ties, broken by the node order).
        pytest.param(
            FgdScore(MIX, step=4), pod().share(300).build(), HALF_USED, 56, id="fgd-step-4"
        ),
        # CPU-only: F' = F (CPU stays above 1000) -> sigmoid(0) -> 50.
        pytest.param(
            FgdScore(MIX), pod().cpu_only(1_000).build(), HALF_USED, 50, id="fgd-cpu-only"
        ),
        # waste = 31000/128000*0.5 + 1000/8000*0.5 = 0.18359 -> int(81.64) = 81.
        pytest.param(BestFitScore(), pod().share(300).build(), HALF_USED, 81, id="bestfit"),
        # 1 - (32000*1000/128000^2 + 1300*300/8000^2)/2 = 0.99598 -> 99.
        pytest.param(DotProdScore(), pod().share(300).build(), HALF_USED, 99, id="dotprod"),
        # Fits on the used GPU (300 free): 100 - (300*100//1000)//10 = 97.
        pytest.param(PackingScore(), pod().share(300).build(), HALF_USED, 97, id="packing-shared"),
        # Needs the fully free GPU on a used node: max(50 - 1, 33) = 49.
        pytest.param(
            PackingScore(), pod().share(400).build(), HALF_USED, 49, id="packing-used-node"
        ),
        # Every GPU free: max(33 - 8, 8) = 25.
        pytest.param(
            PackingScore(),
            pod().share(400).build(),
            node("n").gpus(8).build(),
            25,
            id="packing-empty",
        ),
        pytest.param(
            PackingScore(),
            pod().whole(2).build(),
            node("n").gpu(used=700).gpus(2).build(),
            48,
            id="packing-two-whole",
        ),
        pytest.param(PackingScore(), pod().cpu_only(1_000).build(), HALF_USED, 0, id="packing-cpu"),
        # base = 25 * (8000 - 1300) // 8000 = 20.
        pytest.param(
            ClusteringScore(),
            pod().share(300).build(),
            node("n").gpu(used=700).gpu().kinds(share=2).build(),
            95,
            id="clustering-same-kind",
        ),
        pytest.param(
            ClusteringScore(),
            pod().share(300).build(),
            node("n").gpu(used=700).gpu().kinds(share=1, **{"1-gpu": 1}).build(),
            70,
            id="clustering-one-of-several",
        ),
        pytest.param(
            ClusteringScore(),
            pod().whole(1).build(),
            node("n").gpu(used=700).gpu().kinds(share=2).build(),
            20,
            id="clustering-other-kind",
        ),
        pytest.param(
            ClusteringScore(),
            pod().whole(1).build(),
            node("n").gpus(8).build(),
            25,
            id="clustering-idle-node",
        ),
        pytest.param(
            ClusteringScore(), pod().cpu_only(1).build(), HALF_USED, 0, id="clustering-cpu"
        ),
        # fill = mean(cpu (32000+1000)/64000, gpu (700+300)/2000) = mean(0.515625, 0.5) -> 50.78.
        pytest.param(BinpackScore(), pod().share(300).build(), HALF_USED, 50.78125, id="binpack"),
        pytest.param(SpreadScore(), pod().share(300).build(), HALF_USED, 49.21875, id="spread"),
    ],
)
def test_score(plugin: object, request_: PodRequest, state: NodeState, expected: float) -> None:
    assert score_of(plugin, request_, state) == pytest.approx(expected)


def test_bestfit_normalises_min_max() -> None:
    assert min_max([40, 90, 65]) == [0, 100, 50]
    assert min_max([7, 7]) == [0, 0]


def test_balanced_score1_keeps_cpu_pods_off_idle_gpus() -> None:
    cpu_pod = pod().cpu_only(16_000, memory=64_000).build()
    # Both nodes end up perfectly balanced (1/4 CPU, 1/4 memory); the GPU node's GPUs are idle.
    gpu_node = node("g").cpu(64_000).memory(256_000).gpus(2).build()
    cpu_node = node("c").cpu(64_000).memory(256_000).build()
    plugin = BalanceScore(BalanceArgs(w1=1, w2=1))
    assert score_of(plugin, cpu_pod, cpu_node) == pytest.approx(100)
    assert score_of(plugin, cpu_pod, gpu_node) == pytest.approx(50)


def test_balanced_score2_by_hand() -> None:
    # GPU: 16000 MiB, 400 milli used, utilisation 50 %; pod asks 0.3 of it, 16 of 64 cores and
    # 64000 of 256000 MiB -> balance 1. quality = 0.5 * 0.6 = 0.3; fit = 300/600 = 0.5.
    state = node("n").cpu(64_000).memory(256_000).gpu(used=400, utilization=50).build()
    request = pod().share(300, cpu=16_000, memory=64_000).build()
    plugin = BalanceScore(BalanceArgs(w3=1, w4=1, w5=2))
    assert score_of(plugin, request, state) == pytest.approx(100 * (0.3 + 0.5 + 2) / 4)
