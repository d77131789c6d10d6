"""Kubernetes' scheduling constraints through the whole system, driven with the real kubectl:
nodes labelled and tainted, pods pinned by ``nodeSelector``, kept off a tainted node, spread by
``topologySpreadConstraints`` and by required anti-affinity, each where kube-scheduler would put
it, and the pods that cannot be satisfied Pending with kube-scheduler's reasons."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from tessera.up import workload as w
from tessera.up.system import LocalSystem
from tests.e2e.helpers import (
    assert_exact,
    by_name,
    clear,
    kubectl,
    pending_message,
    phase,
    settle,
    until,
)

pytestmark = [pytest.mark.asyncio(loop_scope="package"), pytest.mark.timeout(240)]

NS = "constraints"
HOSTNAME = "kubernetes.io/hostname"
ZONE = "e2e.tessera.dev/spread"
"""The label the spread and anti-affinity pods select their nodes by (h100-1 and l4-1)."""
TAINTED = "a100-1"


def slice_pod(name: str, app: str, **spec: Any) -> dict[str, Any]:
    body = w.pod(name, [w.container(gpu=1, memory_mib=1024, cores=5)], namespace=NS)
    body["metadata"]["labels"] = {"e2e-app": app}
    body["spec"] |= spec
    return body


def apart(app: str) -> dict[str, Any]:
    return {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"e2e-app": app}}, "topologyKey": HOSTNAME}
            ]
        }
    }


def spread(app: str) -> list[dict[str, Any]]:
    return [
        {
            "maxSkew": 1,
            "topologyKey": HOSTNAME,
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"e2e-app": app}},
        }
    ]


async def run(system: LocalSystem, *args: str, stdin: str | None = None) -> str:
    return await asyncio.to_thread(kubectl, system, *args, stdin=stdin)


async def create(system: LocalSystem, *pods: dict[str, Any]) -> None:
    documents = "\n---\n".join(json.dumps(pod) for pod in pods)  # JSON is YAML
    await run(system, "create", "-f", "-", stdin=documents)


async def test_constraints_place_pods_where_kube_scheduler_would(system: LocalSystem) -> None:
    nodes = len(system.plans)
    await run(system, "taint", "node", TAINTED, "gpu=reserved:NoSchedule")
    tainted = True
    await run(system, "label", "node", "h100-1", "l4-1", f"{ZONE}=yes")
    try:
        on_tainted = {HOSTNAME: TAINTED}
        selected = {ZONE: "yes"}
        await create(
            system,
            slice_pod("pinned", "pinned", nodeSelector={HOSTNAME: "a100-2"}),
            slice_pod("untolerated", "untolerated", nodeSelector=on_tainted),
            slice_pod(
                "tolerated",
                "tolerated",
                nodeSelector=on_tainted,
                tolerations=[{"key": "gpu", "operator": "Equal", "value": "reserved"}],
            ),
            slice_pod(
                "spread-1",
                "spread",
                nodeSelector=selected,
                topologySpreadConstraints=spread("spread"),
            ),
            slice_pod(
                "spread-2",
                "spread",
                nodeSelector=selected,
                topologySpreadConstraints=spread("spread"),
            ),
            slice_pod("apart-1", "apart", nodeSelector=selected, affinity=apart("apart")),
            slice_pod("apart-2", "apart", nodeSelector=selected, affinity=apart("apart")),
        )
        pods = by_name(await settle(system, NS, 7))
        node = {n: p["spec"].get("nodeName", "") for n, p in pods.items()}
        assert node["pinned"] == "a100-2"
        assert node["tolerated"] == TAINTED
        assert {node["spread-1"], node["spread-2"]} == {"h100-1", "l4-1"}
        assert {node["apart-1"], node["apart-2"]} == {"h100-1", "l4-1"}
        # Asked onto the tainted node without a toleration: Pending, in kube-scheduler's words.
        assert phase(pods["untolerated"]) == "Pending"
        assert pending_message(pods["untolerated"]) == (
            f"0/{nodes} nodes are available: 1 node(s) had untolerated taint {{gpu: reserved}}, "
            f"{nodes - 1} node(s) didn't match Pod's node affinity/selector."
        )
        # A third replica kept apart from the two has nowhere to go.
        await create(
            system, slice_pod("apart-3", "apart", nodeSelector=selected, affinity=apart("apart"))
        )
        third = await until(
            lambda: next(
                (
                    p
                    for p in pods_now(system)
                    if p["metadata"]["name"] == "apart-3" and pending_message(p)
                ),
                None,
            ),
            what="the third replica explained",
        )
        assert pending_message(third) == (
            f"0/{nodes} nodes are available: 1 node(s) had untolerated taint {{gpu: reserved}}, "
            f"2 node(s) didn't match pod anti-affinity rules, {nodes - 3} node(s) didn't match "
            "Pod's node affinity/selector."
        )
        # The taint lifted, the pod waiting for it is placed without being created again.
        await run(system, "taint", "node", TAINTED, "gpu=reserved:NoSchedule-")
        tainted = False

        def untolerated_placed() -> bool:
            found = next(p for p in pods_now(system) if p["metadata"]["name"] == "untolerated")
            return found["spec"].get("nodeName") == TAINTED and phase(found) == "Running"

        await until(untolerated_placed, what="the untolerated pod placed once the taint is gone")
        running = [p for p in pods_now(system) if phase(p) == "Running"]
        await assert_exact(system, running)
    finally:
        if tainted:
            await run(system, "taint", "node", TAINTED, "gpu=reserved:NoSchedule-")
        await run(system, "label", "node", "h100-1", "l4-1", f"{ZONE}-")
        await clear(system, NS)


def pods_now(system: LocalSystem) -> list[dict[str, Any]]:
    return system.cluster.pods(NS)
