"""Every seed feature through the whole system: real services, simulated kubelets, real NATS."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tessera.devcluster.resources import POD
from tessera.up import workload as w
from tessera.up.system import LocalSystem
from tests.e2e.helpers import (
    assert_exact,
    by_name,
    clear,
    envs_of,
    gpus_of,
    kubectl,
    pending_message,
    phase,
    pods_of,
    settle,
    until,
)

pytestmark = [pytest.mark.asyncio(loop_scope="package"), pytest.mark.timeout(240)]


def submit(system: LocalSystem, namespace: str, pods: list[dict[str, Any]]) -> None:
    for manifest in pods:
        manifest["metadata"]["namespace"] = namespace
        system.cluster.create_pod(manifest)


async def test_gpu_policies_models_and_isolation_environments(system: LocalSystem) -> None:
    ns = "policies"
    h100 = {"tessera.dev/gpu-model": "H100"}
    submit(
        system,
        ns,
        [
            w.pod(
                "pack-1",
                [w.container(gpu=1, memory_mib=10240, cores=10)],
                annotations={**h100, "tessera.dev/gpu-policy": "binpack"},
            ),
            w.pod(
                "pack-2",
                [w.container(gpu=1, memory_mib=10240, cores=10)],
                annotations={**h100, "tessera.dev/gpu-policy": "binpack"},
            ),
            w.pod(
                "coloc",
                [
                    w.container("a", gpu=1, memory_mib=2048, cores=10),
                    w.container("b", gpu=1, memory_mib=2048, cores=10),
                ],
                annotations={"tessera.dev/gpu-model": "L4", "tessera.dev/gpu-policy": "colocate"},
            ),
            w.pod(
                "only-t4",
                [w.container(gpu=1, memory_mib=4096)],
                annotations={"tessera.dev/gpu-model": "T4"},
            ),
            w.pod(
                "not-a100-h100-l4",
                [w.container(gpu=1, memory_mib=2048)],
                annotations={"tessera.dev/gpu-model-exclude": "A100|H100|L4"},
            ),
            w.pod("two-whole", [w.container(gpu=2)], annotations={"tessera.dev/gpu-model": "A100"}),
            w.pod(
                "pipeline",
                [
                    w.container("reader", gpu=1, memory_mib=4096, cores=20),
                    w.container("model", gpu=2, memory_mib=8192, cores=30),
                    w.container("sidecar"),
                ],
                annotations={"tessera.dev/gpu-model": "A100"},
            ),
            w.pod(
                "cpu-only",
                [w.container(cpu="2", memory="2Gi")],
                annotations={"tessera.dev/node-policy": "balanced"},
            ),
        ],
    )
    pods = by_name(await settle(system, ns, 8))
    assert {n: phase(p) for n, p in pods.items()} == {n: "Running" for n in pods}
    node = {n: p["spec"]["nodeName"] for n, p in pods.items()}
    # binpack (seed 004): the second slice goes on the GPU the first already fills.
    assert node["pack-1"] == node["pack-2"] == "h100-1"
    assert gpus_of(system, pods["pack-1"]) == gpus_of(system, pods["pack-2"])
    # colocate (seed 000, flag 2): both containers' shares on one physical GPU.
    assert node["coloc"] == "l4-1"
    assert len(set(gpus_of(system, pods["coloc"]))) == 1
    # model include / exclude, memory-units (seeds 003/004) on the only T4 node.
    assert node["only-t4"] == node["not-a100-h100-l4"] == "t4-1"
    t4 = envs_of(system, pods["only-t4"])["main"]
    assert t4["TESSERA_GPU_MEMORY_LIMIT_MIB"] == "4096"
    assert t4["TESSERA_GPU_MEMORY_TOTAL_MIB"] == "16384"
    kubelet = system.cluster.kubelets["t4-1"].pods[pods["only-t4"]["metadata"]["uid"]]
    assert [len(c.device_ids) for c in kubelet.containers] == [4096]  # one device per MiB
    # multi-GPU and multi-container pods: distinct GPUs per container, a sidecar without any.
    assert len(set(gpus_of(system, pods["two-whole"]))) == 2
    pipeline = envs_of(system, pods["pipeline"])
    assert "sidecar" not in pipeline
    assert len(pipeline["model"]["NVIDIA_VISIBLE_DEVICES"].split(",")) == 2
    # isolation providers: MPS on the L4 node, HAMi-core on the H100 node.
    coloc = envs_of(system, pods["coloc"])["a"]
    assert coloc["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"].endswith("=2048M")
    assert coloc["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "10"
    packed = envs_of(system, pods["pack-1"])["main"]
    assert packed["CUDA_DEVICE_MEMORY_LIMIT_0"] == "10240m"
    assert packed["CUDA_DEVICE_SM_LIMIT"] == "10"
    # non-GPU pods are kept off (idle) GPU nodes (seed 002's score, the balanced policy).
    assert node["cpu-only"] == "cpu-1"
    await assert_exact(system, list(pods.values()))
    await clear(system, ns)


async def test_spread_puts_slices_on_different_gpus(system: LocalSystem) -> None:
    ns = "spread"
    submit(
        system,
        ns,
        [
            w.pod(
                f"s-{i}",
                [w.container(gpu=1, memory_mib=4096, cores=10)],
                annotations={"tessera.dev/gpu-model": "H100", "tessera.dev/gpu-policy": "spread"},
            )
            for i in range(3)
        ],
    )
    pods = await settle(system, ns, 3)
    assert all(phase(p) == "Running" for p in pods)
    used = [gpus_of(system, p)[0] for p in pods]
    assert len(set(used)) == 3, used
    await assert_exact(system, pods)
    await clear(system, ns)


async def test_groups_permissions_and_quotas(system: LocalSystem) -> None:
    submit(
        system,
        "grouped",
        [
            w.pod(
                f"g-{i}",
                [w.container(gpu=1, memory_mib=2048)],
                annotations={"tessera.dev/group": "a100-pool"},
            )
            for i in range(2)
        ],
    )
    submit(system, "restricted", [w.pod("r-1", [w.container(gpu=1, memory_mib=2048)])])
    submit(
        system,
        "quota-team",
        [w.pod(f"q-{i}", [w.container(gpu=1, memory_mib=1024)]) for i in range(3)],
    )
    grouped = await settle(system, "grouped", 2)
    assert {p["spec"]["nodeName"] for p in grouped} == {"a100-1"}
    restricted = await settle(system, "restricted", 1)
    assert restricted[0]["spec"]["nodeName"] == "l4-1"
    quota = await settle(system, "quota-team", 3)
    phases = sorted(phase(p) for p in quota)
    assert phases == ["Pending", "Running", "Running"]
    waiting = next(p for p in quota if phase(p) == "Pending")
    assert "quota" in pending_message(waiting).lower(), pending_message(waiting)
    await assert_exact(system, grouped + restricted + quota)
    for ns in ("grouped", "restricted", "quota-team"):
        await clear(system, ns)


async def test_a_tenant_label_never_moves_a_pod_into_another_tenant(system: LocalSystem) -> None:
    """Issue 19 finding 3, as it was found: labelled pods of quota-team (quota 2), restricted
    (l4-1 only) and intruder ran as another tenant, outside their quota, permissions and group.
    Each now waits, and ``kubectl describe`` says why in one line."""
    gpu = [w.container(gpu=1, memory_mib=1024)]
    submit(system, "quota-team", [w.pod(f"q-{i}", gpu) for i in range(3)])
    label = "tessera.dev/tenant"
    labelled = {
        "quota-team": w.pod("rider", gpu, labels={label: "free-rider"}),
        "restricted": w.pod("escapee", gpu, labels={label: "free-rider"}),
        "intruder": w.pod(
            "intruder",
            gpu,
            labels={label: "victim"},
            annotations={"tessera.dev/group": "victim-pool"},
        ),
    }
    for namespace, pod in labelled.items():
        submit(system, namespace, [pod])
    ended: dict[str, tuple[str, str, str]] = {}  # namespace -> (phase, node, why pending)
    for namespace, pod in labelled.items():
        settled = await settle(system, namespace, 4 if namespace == "quota-team" else 1)
        held = by_name(settled)[pod["metadata"]["name"]]
        ended[namespace] = (phase(held), held["spec"].get("nodeName", ""), pending_message(held))
    assert {ns: e[:2] for ns, e in ended.items()} == dict.fromkeys(labelled, ("Pending", ""))
    for namespace, (_, _, why) in ended.items():
        asked = labelled[namespace]["metadata"]["labels"][label]
        assert f"label {label}: namespace {namespace} may not choose tenant '{asked}'" in why
    quota = by_name(pods_of(system, "quota-team"))
    assert sorted(phase(p) for p in quota.values()) == ["Pending", "Pending", "Running", "Running"]
    sibling = next(p for n, p in quota.items() if n != "rider" and phase(p) == "Pending")
    assert "quota exceeded" in pending_message(sibling), pending_message(sibling)
    described = await asyncio.to_thread(
        kubectl, system, "describe", "pod", "-n", "intruder", "intruder"
    )
    assert "FailedScheduling" in described
    assert (
        "namespace intruder may not choose tenant 'victim' (it may choose: intruder)" in described
    )
    await assert_exact(system, [p for p in quota.values() if phase(p) == "Running"])
    for namespace in labelled:
        await clear(system, namespace)


async def test_priority_decides_who_gets_freed_capacity(system: LocalSystem) -> None:
    ns = "prio"  # quota: 1 GPU share
    submit(system, ns, [w.pod("blocker", [w.container(gpu=1, memory_mib=1024)])])
    await settle(system, ns, 1)
    submit(
        system,
        ns,
        [
            w.pod("low", [w.container(gpu=1, memory_mib=1024)], priority=0),
            w.pod("high", [w.container(gpu=1, memory_mib=1024)], priority=1000),
        ],
    )
    pods = by_name(await settle(system, ns, 3))
    assert phase(pods["low"]) == phase(pods["high"]) == "Pending"
    system.cluster.api.delete(POD, ns, "blocker")

    def high_running() -> bool:
        current = by_name(system.cluster.pods(ns))
        return "blocker" not in current and phase(current["high"]) == "Running"

    await until(high_running, timeout=60, what="the high-priority pod Running")
    pods = by_name(await settle(system, ns, 2))
    assert phase(pods["low"]) == "Pending"
    await assert_exact(system, list(pods.values()))
    await clear(system, ns)
