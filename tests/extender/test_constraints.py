"""The extender's filter and prioritize judge a pod's constraints about a node itself
(``nodeSelector``, node affinity, taints) as kube-scheduler does, with its reasons (those that
count pods: ``test_kube_cases.py``)."""

from __future__ import annotations

import copy
import time
from typing import Any

import msgspec

from shared.messages.constraints import Taint
from shared.runtime.nats import NatsBus
from tessera.up.ports import free_port
from tests.extender.conftest import golden, post
from tests.harness import kv
from tests.placer import wire
from tests.placer.conftest import PlacerFactory

SELECTOR = "node(s) didn't match Pod's node affinity/selector"


async def test_filter_and_prioritize_judge_node_constraints_with_kube_scheduler_s_reasons(
    bus: NatsBus, start_placer: PlacerFactory
) -> None:
    now = time.time()
    for node, labels, taints in (
        ("gpu-a", {"zone": "a"}, ()),
        ("gpu-b", {"zone": "b"}, ()),
        ("gpu-c", {"zone": "a"}, (Taint(key="gpu", value="reserved", effect="NoSchedule"),)),
    ):
        await kv.put_inventory(bus, wire.inventory(node, 2, at=now))
        facts = wire.facts(node, at=now, labels=labels)
        await kv.put_facts(bus, msgspec.structs.replace(facts, taints=taints))
    async with start_placer(extender_port=free_port()) as placer:
        assert placer.service is not None and placer.service.extender_port is not None
        port = placer.service.extender_port
        request: dict[str, Any] = copy.deepcopy(golden("filter-node-names"))
        request["NodeNames"] = ["gpu-a", "gpu-b", "gpu-c"]
        pod = request["Pod"]
        pod["metadata"]["labels"].pop("tessera.dev/tenant", None)
        pod["spec"]["nodeSelector"] = {"zone": "a"}
        # An anti-affinity to pods no node runs keeps no node out.
        pod["spec"]["affinity"] = {
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": {"x": "y"}}, "topologyKey": "zone"}
                ]
            }
        }
        status, answer = await post(port, "filter", request)
        assert status == 200
        assert answer["NodeNames"] == ["gpu-a"]
        assert answer["FailedNodes"] == {}
        assert answer["FailedAndUnresolvableNodes"] == {
            "gpu-b": SELECTOR,
            "gpu-c": "node(s) had untolerated taint {gpu: reserved}",
        }
        # Preferred node affinity counts in prioritize (weight 2 of kube-scheduler's profile).
        del pod["spec"]["nodeSelector"]
        pod["spec"]["affinity"]["nodeAffinity"] = {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 10,
                    "preference": {
                        "matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]
                    },
                }
            ]
        }
        pod["spec"]["tolerations"] = [{"key": "gpu", "operator": "Exists"}]
        status, scores = await post(port, "prioritize", request)
        assert status == 200
        ranked = {s["Host"]: s["Score"] for s in scores}
        assert ranked["gpu-b"] == 10
        assert ranked["gpu-b"] > ranked["gpu-a"]
