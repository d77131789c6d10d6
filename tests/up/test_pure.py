"""The pure parts of ``tessera up``: node specs and the report's independent checks."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from tessera.up import report
from tessera.up.command import configure, nodes_and_pods
from tessera.up.spec import (
    POOL_MIN_NODES,
    SpecError,
    default_pools,
    in_dra_mode,
    plan_nodes,
)
from tessera.up.system import permission_violations
from tessera.up.workload import WorkloadError, trace_sample


@pytest.mark.parametrize(
    ("gpus", "nodes", "expected"),
    [
        pytest.param(
            "8xA100-80GB,4xT4",
            3,
            [
                ("node-1", "8xA100-80GB-81920MiB"),
                ("node-2", "4xT4-16GB-16384MiB"),
                ("node-3", "8xA100-80GB-81920MiB"),
            ],
            id="cycled",
        ),
        pytest.param(
            "a=2xA100-80GB+2xT4,b=cpu",
            None,
            [("a", "2xA100-80GB-81920MiB,2xT4-16GB-16384MiB"), ("b", "")],
            id="named",
        ),
        pytest.param("1xX9-12GB", 1, [("node-1", "1xX9-12GB-12288MiB")], id="unknown-model-sized"),
    ],
)
def test_node_entries(gpus: str, nodes: int | None, expected: list[tuple[str, str]]) -> None:
    assert [(p.name, p.fake_gpus) for p in plan_nodes(gpus, nodes)] == expected


def test_node_options() -> None:
    (plan,) = plan_nodes("n=2xT4:mode=memory-units:isolation=mps:cpu=8:memory=64Gi")
    assert (plan.mode, plan.isolation, plan.cpu, plan.memory) == (
        "memory-units",
        "mps",
        "8",
        "64Gi",
    )
    assert plan.resource == "tessera.dev/gpu-memory"


def test_a_node_in_dra_mode_is_labelled_so() -> None:
    dra, plugin, cpu = plan_nodes("a=8xA100-80GB:api=dra,b=4xT4,c=cpu")
    assert dra.dra and dra.labels == {"tessera.dev/gpu-api": "dra"}
    assert not plugin.dra
    assert [p.dra for p in map(in_dra_mode, (plugin, cpu))] == [True, False]
    dealt = plan_nodes("4xA100-80GB:api=dra,4xT4", 3)  # unnamed entries keep their api too
    assert [(p.name, p.dra) for p in dealt] == [
        ("node-1", True),
        ("node-2", False),
        ("node-3", True),
    ]


@pytest.mark.parametrize(
    ("gpus", "nodes", "message"),
    [
        pytest.param("", None, "empty", id="empty"),
        pytest.param("4xZ9", None, "memory of 'Z9' is not known", id="unknown-model"),
        pytest.param("four", None, "COUNTxMODEL", id="garbage"),
        pytest.param("a=4xT4,4xT4", None, "name every entry", id="half-named"),
        pytest.param("a=4xT4", 3, "--nodes 3", id="named-count"),
        pytest.param("4xT4:mode=fast", None, "mode 'fast'", id="bad-mode"),
        pytest.param("cpu:isolation=mps", None, "need GPUs", id="cpu-isolation"),
        pytest.param("A=4xT4", None, "DNS label", id="bad-name"),
        pytest.param("4xT4:api=csi", None, "api 'csi'", id="bad-api"),
    ],
)
def test_bad_node_entries_say_what_is_wrong(gpus: str, nodes: int | None, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        plan_nodes(gpus, nodes)


SLICES = [report.Slice("GPU-a", 4096, 25), report.Slice("GPU-b", 2048, 10)]
GOOD = {
    "NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b",
    "TESSERA_GPU_MEMORY_LIMIT_MIB": "4096,2048",
    "TESSERA_GPU_CORES": "25,10",
}


@pytest.mark.parametrize(
    ("envs", "slices", "wrong"),
    [
        pytest.param(GOOD, SLICES, "", id="exact"),
        pytest.param(
            {**GOOD, "NVIDIA_VISIBLE_DEVICES": "GPU-b,GPU-a"},
            SLICES,
            "NVIDIA_VISIBLE_DEVICES",
            id="other-gpu-order",
        ),
        pytest.param(
            {**GOOD, "TESSERA_GPU_MEMORY_LIMIT_MIB": "4096,4096"},
            SLICES,
            "TESSERA_GPU_MEMORY_LIMIT_MIB",
            id="more-memory",
        ),
        pytest.param(
            {
                **GOOD,
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "GPU-a=4096M,GPU-b=4096M",
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "10",
            },
            SLICES,
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
            id="mps-limit",
        ),
        pytest.param(
            {
                **GOOD,
                "CUDA_DEVICE_SM_LIMIT": "10",
                "CUDA_DEVICE_MEMORY_LIMIT_0": "4096m",
                "CUDA_DEVICE_MEMORY_LIMIT_1": "1m",
            },
            SLICES,
            "CUDA_DEVICE_MEMORY_LIMIT_1",
            id="hami-limit",
        ),
        pytest.param(GOOD, [], "no GPU decided", id="gpu-without-decision"),
        pytest.param({}, SLICES, "<unset>", id="decided-but-not-given"),
    ],
)
def test_container_problems(envs: dict[str, str], slices: list[report.Slice], wrong: str) -> None:
    problem = report.container_problem(envs, slices)
    assert (wrong in problem) if wrong else problem == ""


def _pod(uid: str, containers: dict[str, list[tuple[str, int, int]]]) -> dict[str, Any]:
    import json

    assignment = {
        "node": "n",
        "decided_at": 100.0,
        "placer_id": "p",
        "containers": [
            {
                "container": c,
                "gpus": [{"uuid": u, "index": 0, "memory_mib": m, "cores": k} for u, m, k in gpus],
            }
            for c, gpus in containers.items()
        ],
    }
    return {
        "metadata": {
            "uid": uid,
            "namespace": "d",
            "name": uid,
            "annotations": {
                "tessera.dev/assignment": json.dumps(assignment),
                "tessera.dev/bind-time": "1970-01-01T00:01:40.500000Z",
            },
        },
        "spec": {"containers": [{"name": c} for c in containers]},
        "status": {"phase": "Running"},
    }


def _seen(uid: str, envs: dict[str, dict[str, str]]) -> report.PodSeen:
    return report.PodSeen(
        uid=uid,
        node="n",
        containers=tuple(report.ContainerSeen(c, e) for c, e in envs.items()),
        allocated_at=100.75,
        running_at=100.8,
    )


def test_summary_counts_mismatches_and_overcommits_from_what_the_kubelets_recorded() -> None:
    gpu = [report.GpuSeen(uuid="GPU-a", node="n", memory_mib=8192)]
    one = {
        "NVIDIA_VISIBLE_DEVICES": "GPU-a",
        "TESSERA_GPU_MEMORY_LIMIT_MIB": "6000",
        "TESSERA_GPU_CORES": "50",
    }
    pods = [
        _pod("p1", {"main": [("GPU-a", 6000, 50)]}),
        _pod("p2", {"main": [("GPU-a", 1000, 20)]}),
    ]
    seen = {"p1": _seen("p1", {"main": one}), "p2": _seen("p2", {"main": one})}  # p2 got p1's
    summary = report.summarize(
        pods, seen, created_at={"p1": 99.9, "p2": 99.9}, gpus=gpu, observed=[]
    )
    assert summary.mismatched_containers == 1 and "d/p2" in summary.mismatches[0]
    assert summary.overcommitted_gpus == 1  # 12000 MiB held on an 8192 MiB GPU
    assert summary.latency_ms["decided_to_bound"]["p50"] == 500.0
    assert summary.latency_ms["created_to_running"]["n"] == 2


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert report.percentile(values, 50) == 50.0
    assert report.percentile(values, 99) == 99.0
    assert report.percentile([3.0], 99) == 3.0


@pytest.mark.parametrize(
    ("line", "counted"),
    [
        pytest.param(
            '[7001] 2026/11/26 22:56:50.102311 [ERR] 127.0.0.1:51022 - cid:9 - "v2.16.0:python:'
            'placer-1" - "$G/user:placer" - Publish Violation - Subject "tessera.binder.x"',
            True,
            id="publish",
        ),
        pytest.param(
            '[7001] 2026/11/26 22:56:50.102311 [ERR] 127.0.0.1:51022 - cid:9 - "v2.16.0:python:'
            'dp" - "$G/user:deviceplugin-node-1" - Subscription Violation - Subject '
            '"$KV.tessera-assignments.node-2.>", SID 4',
            True,
            id="subscribe",
        ),
        pytest.param(
            '[7001] 2026/11/26 22:56:50.102311 [ERR] 127.0.0.1:51022 - cid:9 - "v2.16.0:python:'
            'binder" - Protocol Violation - Unknown Protocol Operation',
            True,
            id="a client that broke the protocol",
        ),
        pytest.param(
            "[7378] 2026/11/26 22:56:51.309994 [INF] 127.0.0.1:34233 - rid:11 - Router "
            "connection closed: Protocol Violation - Remote: n1",
            False,
            id="a route cut by a killed server",
        ),
        pytest.param(
            "[7378] 2026/11/26 22:56:51.309994 [INF] Server is ready", False, id="anything else"
        ),
    ],
)
def test_refusals_of_clients_count_as_violations_not_cut_routes(line: str, counted: bool) -> None:
    assert permission_violations(f"before\n{line}\nafter") == ([line] if counted else [])


@pytest.mark.parametrize(
    ("placers", "nodes", "pools"),
    [
        (2, 5, 1),  # the demo: a pool of two or three nodes packs badly
        (2, 2 * POOL_MIN_NODES - 1, 1),
        (2, 2 * POOL_MIN_NODES, 2),
        (2, 100, 2),  # benchmarks/e2e.py's cluster
        (3, 1_000, 3),
        (1, 1_000, 1),
    ],
)
def test_node_pools_by_default_only_where_each_gets_enough_nodes(
    placers: int, nodes: int, pools: int
) -> None:
    assert default_pools(placers, nodes) == pools


def _trace(tmp_path: Path) -> Path:
    (tmp_path / "openb_node_list_gpu_node.csv").write_text(
        "sn,cpu_milli,memory_mib,gpu,model\n"
        + "".join(f"openb-node-{i:04d},96000,393216,8,G2\n" for i in range(10))
        + "".join(f"openb-node-{i:04d},104000,524288,2,T4\n" for i in range(10, 30)),
        encoding="utf-8",
    )
    pods = tmp_path / "openb_pod_list_default.csv"
    pods.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
        + "".join(f"openb-pod-{i:04d},4000,8192,1,{(i % 4 + 1) * 250}\n" for i in range(60))
        + "openb-pod-0060,16000,65536,0,0\n",
        encoding="utf-8",
    )
    return pods


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    configure(parser)
    return parser.parse_args(list(argv))


def test_a_trace_sample_runs_on_nodes_sampled_from_the_trace_at_its_scale(tmp_path: Path) -> None:
    pods_csv = _trace(tmp_path)
    nodes, pods = nodes_and_pods(_args("--trace", str(pods_csv), "--pods", "40"))
    assert len(pods) == 40
    demand = sum(t.total_gpu_milli for t in trace_sample(pods_csv, 40, seed=42))
    capacity = 1000 * sum(n.gpu_count for n in nodes)
    largest = 8_000
    assert demand <= capacity < demand + largest  # just enough GPUs: 100 % arrived
    assert {n.describe() for n in nodes} <= {"8xG2-32GB", "2xT4-16GB"}
    assert all(n.name.startswith("openb-node-") for n in nodes)
    assert {(n.cpu, n.memory) for n in nodes} <= {("96000m", "393216Mi"), ("104000m", "524288Mi")}
    again, _ = nodes_and_pods(_args("--trace", str(pods_csv), "--pods", "40"))
    assert again == nodes  # seeded
    other, _ = nodes_and_pods(_args("--trace", str(pods_csv), "--pods", "40", "--seed", "7"))
    assert other != nodes


def test_nodes_given_on_the_command_line_win_over_the_trace_sample(tmp_path: Path) -> None:
    pods_csv = _trace(tmp_path)
    nodes, pods = nodes_and_pods(_args("--trace", str(pods_csv), "--pods", "10", "--nodes", "2"))
    assert [n.name for n in nodes] == ["node-1", "node-2"] and len(pods) == 10
    nodes, _ = nodes_and_pods(_args("--trace", str(pods_csv), "--gpus", "4xT4"))
    assert [n.describe() for n in nodes] == ["4xT4-16GB"] * 5


def test_a_trace_without_its_node_list_needs_nodes(tmp_path: Path) -> None:
    pods_csv = _trace(tmp_path)
    (tmp_path / "openb_node_list_gpu_node.csv").unlink()
    with pytest.raises(WorkloadError, match=r"no such file.*--nodes / --gpus"):
        nodes_and_pods(_args("--trace", str(pods_csv)))
