"""The extender's pure parts: kube-scheduler's JSON in and out (``extender_api.py``) and the
node verdicts it answers from (``decider.verdicts``), which must agree with the placer's own
decisions."""

from __future__ import annotations

import json
import random
import time

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.placer.core.model import Decision
from services.placer.core.profiles import build_profile
from services.placer.rules import decider
from services.placer.rules.decider import UNKNOWN_NODE, NodeVerdict
from services.placer.rules.extender_api import (
    MAX_PRIORITY,
    BadRequestError,
    HostPriority,
    binding_args,
    filter_args,
    filter_result,
    priorities,
    refused,
)
from services.placer.rules.state import ClusterView
from services.placer.rules.translate import pod_request
from services.placer.shell.upkeep import service_profile
from tests.placer import wire

POD = {"metadata": {"name": "p", "namespace": "ml", "uid": "u"}, "spec": {"containers": []}}


def fits(node: str, score: float) -> NodeVerdict:
    return NodeVerdict(node=node, fits=True, score=score)


def fails(node: str, reason: str, unresolvable: bool = False) -> NodeVerdict:
    return NodeVerdict(node=node, fits=False, reason=reason, unresolvable=unresolvable)


@pytest.mark.parametrize(
    ("verdicts", "scores"),
    [
        pytest.param([fits("a", 80.0), fits("b", 40.0), fits("c", 60.0)], [10, 0, 5], id="spread"),
        pytest.param([fits("a", 7.0), fits("b", 7.0)], [10, 10], id="equal"),
        pytest.param([fits("a", -3.0), fails("b", "insufficient CPU")], [10, 0], id="one-fits"),
        pytest.param([fails("a", "no GPUs", True)], [0], id="none-fit"),
        pytest.param([], [], id="no-candidates"),
    ],
)
def test_priorities_put_the_preferred_node_at_10_and_the_least_preferred_at_0(
    verdicts: list[NodeVerdict], scores: list[int]
) -> None:
    answer = priorities(verdicts)
    assert [p.host for p in answer] == [v.node for v in verdicts]
    assert [p.score for p in answer] == scores
    assert all(0 <= p.score <= MAX_PRIORITY for p in answer)
    assert msgspec.json.encode([HostPriority(host="a", score=3)]) == b'[{"Host":"a","Score":3}]'


def node_item(name: str) -> dict[str, object]:
    return {"metadata": {"name": name, "labels": {"zone": "z"}}, "status": {"images": []}}


def test_filter_answers_in_the_form_it_was_asked_in() -> None:
    verdicts = [
        fits("a", 1.0),
        fails("b", "insufficient GPU memory or cores"),
        fails("c", "no GPUs", unresolvable=True),
    ]
    by_name = filter_args(
        json.dumps({"Pod": POD, "Nodes": None, "NodeNames": ["a", "b", "c"]}).encode()
    )
    answer = json.loads(msgspec.json.encode(filter_result(by_name, ["a", "b", "c"], verdicts)))
    assert answer == {
        "Nodes": None,
        "NodeNames": ["a"],
        "FailedNodes": {"b": "insufficient GPU memory or cores"},
        "FailedAndUnresolvableNodes": {"c": "no GPUs"},
        "Error": "",
    }
    items = [node_item(n) for n in "abc"]
    by_object = filter_args(
        json.dumps(
            {"Pod": POD, "Nodes": {"metadata": {}, "items": items}, "NodeNames": None}
        ).encode()
    )
    assert by_object.candidates() == ["a", "b", "c"]
    answer = json.loads(msgspec.json.encode(filter_result(by_object, ["a", "b", "c"], verdicts)))
    assert answer["Nodes"] == {"metadata": {}, "items": [items[0]]}  # echoed as sent
    assert answer["NodeNames"] is None
    nobody = json.loads(msgspec.json.encode(refused(by_name, ["a", "b", "c"], "invalid request")))
    assert nobody["NodeNames"] == [] and nobody["FailedNodes"] == {}
    assert nobody["FailedAndUnresolvableNodes"] == dict.fromkeys("abc", "invalid request")


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"", "not an ExtenderArgs: Input data was truncated"),
        (b'{"Pod": null, "NodeNames": []}', "Expected `object`, got `null` - at `$.Pod`"),
        (b'{"Pod": {"metadata": {}}, "NodeNames": [1]}', "Expected `str`, got `int`"),
    ],
)
def test_filter_args_that_kube_scheduler_never_sends_are_bad_requests(
    body: bytes, reason: str
) -> None:
    with pytest.raises(BadRequestError, match=reason.replace("[", r"\[").replace("$", r"\$")):
        filter_args(body)


def test_binding_args_need_every_field() -> None:
    args = binding_args(b'{"PodName":"p","PodNamespace":"ml","PodUID":"u-1","Node":"n1"}')
    assert (args.pod_name, args.pod_namespace, args.pod_uid, args.node) == ("p", "ml", "u-1", "n1")
    with pytest.raises(BadRequestError, match="Node must not be empty"):
        binding_args(b'{"PodName":"p","PodNamespace":"ml","PodUID":"u-1","Node":""}')
    with pytest.raises(BadRequestError, match="missing required field `PodUID`"):
        binding_args(b'{"PodName":"p","PodNamespace":"ml","Node":"n1"}')


# --- verdicts agree with decisions ----------------------------------------------------------

NODES = [f"n{i}" for i in range(6)]
PROFILES = ["tessera", "bestfit", "spread"]


def cluster(seed: int) -> ClusterView:
    rng = random.Random(seed)
    view = ClusterView(inventory_stale_s=3600, task_mix_window=100)
    now = time.time()
    for name in NODES[:-1]:  # the last one is unknown to the placer
        gpus = rng.choice((0, 1, 2, 4))
        used = [rng.choice((0, 4096, 12_288, 16_000)) for _ in range(gpus)]
        if gpus:
            view.set_inventory(wire.inventory(name, gpus, used_mib=used, at=now), now=now)
        view.set_facts(
            wire.facts(name, cpu_milli=rng.choice((500, 64_000)), ready=rng.random() > 0.1, at=now)
        )
    view.finish_load(now)
    return view


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    shares=st.integers(1, 3),
    memory=st.sampled_from([None, 2048, 8192, 15_000]),
    profile_name=st.sampled_from(PROFILES),
)
def test_a_node_passes_filter_exactly_when_the_placer_would_place_the_pod_there(
    seed: int, shares: int, memory: int | None, profile_name: str
) -> None:
    view = cluster(seed)
    profile = build_profile(service_profile(profile_name), typical_tasks=view.mix.typical())
    pod = pod_request(
        wire.pending("p", shares=shares, memory_mib=memory, cores=None if memory is None else 20)
    )
    first = decider.verdicts(view, profile, pod, NODES)
    again = decider.verdicts(view, profile, pod, NODES)  # from the memo
    fresh = build_profile(service_profile(profile_name), typical_tasks=view.mix.typical())
    assert first == again == decider.verdicts(view, fresh, pod, NODES)
    for verdict in first:
        placed = decider.decide_on(view, profile, pod, verdict.node, now=time.time())
        assert verdict.fits == isinstance(placed, Decision), (verdict, placed)
        if verdict.node == NODES[-1]:
            assert (verdict.reason, verdict.unresolvable) == (UNKNOWN_NODE, True)
        elif not verdict.fits:
            capacity = verdict.reason.startswith("insufficient") or "idle" in verdict.reason
            assert verdict.unresolvable is not capacity, verdict
