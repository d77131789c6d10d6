"""Why a GPU request can never fit a cluster's GPUs: the dimension named, or nothing."""

from __future__ import annotations

import pytest

from shared.capacity import GpuAsk, Models, NodeGpus, model_matches, never_fits

A100: NodeGpus = (("NVIDIA A100-SXM4-80GB", 81920),) * 4
T4: NodeGpus = (("T4", 15360),) * 2


def ask(shares: int = 1, memory_mib: int | None = None, pct: int | None = None) -> GpuAsk:
    return GpuAsk(container="main", shares=shares, memory_mib=memory_mib, memory_pct=pct)


@pytest.mark.parametrize(
    ("asks", "nodes", "models", "problem"),
    [
        pytest.param([ask(4, 81920)], [A100], Models(), None, id="fits-exactly"),
        pytest.param([ask(9)], [], Models(), None, id="no-node-known"),
        pytest.param([ask(0)], [T4], Models(), None, id="no-gpu-asked"),
        pytest.param([ask(2, pct=100)], [T4], Models(), None, id="percentages-fit-any-size"),
        pytest.param(
            [ask(1, 200000)],
            [A100, T4],
            Models(),
            "asks 200000 MiB per GPU; the largest GPU here has 81920 MiB",
            id="memory",
        ),
        pytest.param(
            [ask(1, 20000)],
            [A100, T4],
            Models(wanted=("T4",)),
            "asks 20000 MiB per GPU; the largest GPU of model T4 here has 15360 MiB",
            id="memory-of-a-model",
        ),
        pytest.param(
            [ask(9)],
            [A100, T4],
            Models(),
            "asks 9 GPUs; a node here has at most 4 GPUs",
            id="count",
        ),
        pytest.param(
            [ask(3, 16000)],
            [A100[:2], T4],
            Models(),
            "asks 3 GPUs with 16000 MiB each; a node here has at most 2 GPUs that large",
            id="count-of-a-size",
        ),
        pytest.param(
            [ask(1)],
            [T4],
            Models(wanted=("A100", "H100"), excluded=("H100-PCIE",)),
            "asks GPUs of model A100|H100, not of model H100-PCIE; no node here has one",
            id="model",
        ),
        pytest.param(
            [ask(2, pct=50), GpuAsk(container="b", shares=1, memory_mib=20000)],
            [T4, (("A100", 81920),)],
            Models(),
            "no node here has the GPUs its containers ask for all together",
            id="each-fits-somewhere-never-all-on-one",
        ),
    ],
)
def test_never_fits_names_the_first_dimension_no_node_has(
    asks: list[GpuAsk], nodes: list[NodeGpus], models: Models, problem: str | None
) -> None:
    found = never_fits(asks, nodes, models)
    assert (found.problem if found else None) == problem


@pytest.mark.parametrize(
    ("model", "wanted", "matches"),
    [
        ("NVIDIA A100-SXM4-80GB", "A100", True),
        ("A100-80GB", "a100", True),
        ("NVIDIA A100X", "A100", False),
        ("A100", "A10", False),
        ("H100", "", False),
    ],
)
def test_models_match_as_people_name_them(model: str, wanted: str, matches: bool) -> None:
    assert model_matches(model, wanted) is matches
