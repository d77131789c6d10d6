"""filter and prioritize over HTTP, as kube-scheduler calls them (golden requests, both the
``NodeNames`` and the ``Nodes`` form), answered by a real placer from its view of a real NATS."""

from __future__ import annotations

import asyncio
import copy
import json
import time
from pathlib import Path
from typing import Any

import msgspec

from services.placer.rules.decider import UNKNOWN_NODE
from shared import codec, subjects
from shared.kubeobjects import Pod
from shared.messages.ledger import PodClaim
from shared.messages.pods import PodPending
from shared.podspec import parse_pending
from shared.runtime.nats import NatsBus
from tessera.up.ports import free_port
from tests.extender.conftest import golden, post
from tests.harness import kv
from tests.placer import wire
from tests.placer.conftest import PlacerFactory, until

FITTING = ["gpu-roomy", "gpu-busy"]
FAILED = {"gpu-full": "insufficient GPU memory or cores"}
UNRESOLVABLE = {"cpu-only": "no GPUs", "gpu-ghost": UNKNOWN_NODE}


async def cluster(bus: NatsBus) -> None:
    """gpu-roomy: two idle GPUs; gpu-busy: 6 GiB of one GPU in use; gpu-full: 2 GiB free;
    cpu-only: no GPUs; gpu-ghost: unknown to Tessera."""
    now = time.time()
    for node, gpus, used in (
        ("gpu-roomy", 2, ()),
        ("gpu-busy", 2, (6144,)),
        ("gpu-full", 1, (14336,)),
    ):
        await kv.put_inventory(bus, wire.inventory(node, gpus, used_mib=used, at=now))
        await kv.put_facts(bus, wire.facts(node, at=now))
    await kv.put_facts(bus, wire.facts("cpu-only", at=now))


def tenancy(directory: Path) -> str:
    """A tenancy file under which the golden pod (namespace ml, ``tessera.dev/tenant:
    research``) may be tenant research."""
    path = directory / "tenancy.json"
    path.write_text(json.dumps({"namespaces": [{"namespace": "ml", "choices": ["research"]}]}))
    return str(path)


def with_pod(request: dict[str, Any], change: Any) -> dict[str, Any]:
    changed = copy.deepcopy(request)
    change(changed["Pod"])
    return changed


async def test_filter_and_prioritize_answer_from_the_placer_s_view(
    bus: NatsBus, start_placer: PlacerFactory, tmp_path: Path
) -> None:
    await cluster(bus)
    async with start_placer(extender_port=free_port(), tenancy_file=tenancy(tmp_path)) as placer:
        assert placer.service is not None and placer.service.extender_port is not None
        port = placer.service.extender_port
        by_name = golden("filter-node-names")

        status, answer = await post(port, "filter", by_name)
        assert status == 200
        assert answer == {
            "Nodes": None,
            "NodeNames": FITTING,
            "FailedNodes": FAILED,
            "FailedAndUnresolvableNodes": UNRESOLVABLE,
            "Error": "",
        }

        # Full node objects in, the passing ones echoed back as they came.
        by_object = golden("filter-nodes")
        status, answer = await post(port, "filter", by_object)
        assert status == 200
        items = by_object["Nodes"]["items"]
        assert answer["NodeNames"] is None
        assert answer["Nodes"] == {"metadata": {}, "items": items[:2]}
        assert (answer["FailedNodes"], answer["FailedAndUnresolvableNodes"]) == (
            FAILED,
            UNRESOLVABLE,
        )
        assert answer["Error"] == ""

        # prioritize: the profile's preference on a 0..10 scale, the same in both forms.
        status, scores = await post(port, "prioritize", by_name)
        assert status == 200
        assert [s["Host"] for s in scores] == by_name["NodeNames"]
        assert all(set(s) == {"Host", "Score"} for s in scores)
        ranked = {s["Host"]: s["Score"] for s in scores}
        assert (await post(port, "prioritize", by_object))[1] == scores
        assert ranked["gpu-full"] == ranked["cpu-only"] == ranked["gpu-ghost"] == 0
        assert max(ranked[n] for n in FITTING) == 10
        assert min(ranked[n] for n in FITTING) < 10, "the two nodes differ for the profile"
        preferred = max(FITTING, key=lambda n: ranked[n])

        # The same pod placed by the placer itself goes where prioritize said it prefers.
        twin = parse_pending(msgspec.convert(by_name["Pod"], Pod))
        assert isinstance(twin, PodPending)
        await wire.publish_pod(bus, msgspec.structs.replace(twin, uid="twin"))

        async def claimed() -> PodClaim | None:
            entry = await bus.kv_get(subjects.KV_CLAIMS, subjects.claim_key("twin"))
            return None if entry is None else codec.decode(entry.value, PodClaim)

        deadline = time.monotonic() + 20
        while (claim := await claimed()) is None:
            assert time.monotonic() < deadline, "no placement of the twin"
            await asyncio.sleep(0.05)
        assert claim.booking is not None and claim.booking.node == preferred

        # A pod that is invalid as written fails everywhere, for the reason the binder gives.
        def bad_hint(pod: dict[str, Any]) -> None:
            pod["metadata"]["annotations"]["tessera.dev/gpu-policy"] = "fastest"

        status, answer = await post(port, "filter", with_pod(by_name, bad_hint))
        assert status == 200 and answer["NodeNames"] == []
        assert answer["FailedNodes"] == {}
        assert set(answer["FailedAndUnresolvableNodes"]) == set(by_name["NodeNames"])
        assert set(answer["FailedAndUnresolvableNodes"].values()) == {
            "invalid request: metadata.annotations[tessera.dev/gpu-policy]: 'fastest' is not "
            "one of binpack, spread, colocate"
        }

        # A tenant its namespace may not choose fails everywhere, for the placer's reason.
        def foreign_tenant(pod: dict[str, Any]) -> None:
            pod["metadata"]["labels"]["tessera.dev/tenant"] = "victim"

        status, answer = await post(port, "filter", with_pod(by_name, foreign_tenant))
        assert status == 200 and answer["NodeNames"] == [] and answer["FailedNodes"] == {}
        assert set(answer["FailedAndUnresolvableNodes"]) == set(by_name["NodeNames"])
        assert set(answer["FailedAndUnresolvableNodes"].values()) == {
            "label tessera.dev/tenant: namespace ml may not choose tenant 'victim' (it may "
            "choose: ml, research)"
        }

        # A pod asking for no Tessera resource is none of the extender's business.
        def no_gpu(pod: dict[str, Any]) -> None:
            for resources in pod["spec"]["containers"][0]["resources"].values():
                for name in [r for r in resources if r.startswith("tessera.dev/")]:
                    del resources[name]

        plain = with_pod(by_name, no_gpu)
        status, answer = await post(port, "filter", plain)
        assert (status, answer["NodeNames"], answer["FailedNodes"]) == (
            200,
            by_name["NodeNames"],
            {},
        )
        status, scores = await post(port, "prioritize", plain)
        assert {s["Score"] for s in scores} == {0}
        assert (
            placer.metric("tessera_placer_extender_requests_total", verb="filter", outcome="ok")
            == 5
        )


async def test_malformed_requests_get_400_with_the_reason_and_change_nothing(
    bus: NatsBus, start_placer: PlacerFactory, tmp_path: Path
) -> None:
    await cluster(bus)
    async with start_placer(extender_port=free_port(), tenancy_file=tenancy(tmp_path)) as placer:
        assert placer.service is not None and placer.service.extender_port is not None
        port = placer.service.extender_port
        pod = golden("filter-node-names")["Pod"]
        cases: list[tuple[str, Any, str]] = [
            ("filter", b"{not json", "not an ExtenderArgs: JSON is malformed"),
            ("filter", {"Nodes": None, "NodeNames": ["gpu-roomy"]}, "missing required field `Pod`"),
            ("prioritize", {"Pod": pod, "Nodes": None, "NodeNames": None}, "neither Nodes nor"),
            (
                "filter",
                {"Pod": pod, "NodeNames": "gpu-roomy"},
                "Expected `array | null`, got `str` - at `$.NodeNames`",
            ),
            (
                "filter",
                {"Pod": pod, "Nodes": {"items": [{"metadata": {}}]}},
                "without metadata.name",
            ),
            ("bind", {"PodName": "train-0"}, "missing required field `PodNamespace`"),
            ("bind", {**golden("bind"), "PodUID": ""}, "PodUID must not be empty"),
            ("bind", [1, 2], "not an ExtenderBindingArgs: Expected `object`, got `array`"),
        ]
        for verb, body, reason in cases:
            status, answer = await post(port, verb, body)
            assert status == 400, (verb, body)
            assert reason in answer["Error"], (reason, answer)
        status, answer = await post(port, "preempt", golden("filter-node-names"))
        assert status == 404 and "the verbs are filter, prioritize, bind" in answer["Error"]
        assert (
            placer.metric(
                "tessera_placer_extender_requests_total", verb="filter", outcome="bad_request"
            )
            == 4
        )
        # Still serving, and nothing was booked.
        status, answer = await post(port, "filter", golden("filter-node-names"))
        assert (status, answer["NodeNames"]) == (200, FITTING)
        state = await wire.cluster_state(bus)
        assert state.bookings() == [] and state.claims == {}
        await until(lambda: not placer.task.done(), what="the placer still running")
