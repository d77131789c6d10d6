"""The simulator: trace reading, workload tuning, metrics on hand-checked traces, the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from services.placer.core.fragmentation import TypicalTask
from services.placer.core.groups import (
    NodeSelector,
    ResourceGroup,
    TenancyConfig,
    TenantPermission,
    TenantQuota,
)
from services.placer.rules.poolplan import pool_of
from services.placer.sim import report
from services.placer.sim.replay import (
    MODEL_LABEL,
    SIM_GPU_MEMORY_MIB,
    Curves,
    Mix,
    ReplayResult,
    replay,
)
from services.placer.sim.synthetic import synthetic_nodes, synthetic_tasks
from services.placer.sim.synthetic_table import NODE_KINDS, TASK_KINDS
from services.placer.sim.trace import TraceError, TraceNode, TraceTask, load_nodes, load_tasks
from services.placer.sim.workload import (
    cluster_gpu_milli,
    named_trace,
    node_order,
    tuned_tasks,
    typical_tasks,
    with_multi_gpu_share,
)
from tessera.cli import main


def share(name: str, milli: int, cpu: int = 1_000) -> TraceTask:
    return TraceTask(name=name, cpu_milli=cpu, memory_mib=1_000, gpu_count=1, gpu_milli=milli)


TWO_NODES = [
    TraceNode(name="n1", cpu_milli=8_000, memory_mib=64_000, gpus=1, model="A"),
    TraceNode(name="n2", cpu_milli=8_000, memory_mib=64_000, gpus=1, model="A"),
]
ONLY_600 = (TypicalTask(cpu_milli=1_000, gpu_count=1, gpu_milli=600, weight=1),)


def test_replay_metrics_by_hand() -> None:
    # Capacity 2000 milli. Binpack, ties to n1: 600 -> n1, 600 -> n2, 600 fails, 200 -> n1.
    # Arrived 600/1200/1800/2000 -> buckets 30/60/90/100; allocated 600/1200/1200/1400.
    # Fragments for a 600 task: n1 400 free (stranded), n2 1000 (fits): 400 -> 800 -> 800 -> 600.
    tasks = [share("a", 600), share("b", 600), share("c", 600), share("d", 200)]
    result = replay(TWO_NODES, tasks, "binpack", order=["n1", "n2"], typical=ONLY_600, seed=1)
    assert result.failed == 1
    assert result.curves.buckets() == [30, 60, 90, 100]
    assert result.curves.alloc_at(60) == pytest.approx(60)
    assert result.curves.alloc_at(90) == pytest.approx(60)
    assert 100 - result.curves.alloc_at(100) == pytest.approx(30)  # type: ignore[operator]
    assert result.curves.frag_at(30) == pytest.approx(20)
    assert result.curves.frag_at(100) == pytest.approx(30)


def whole(name: str, tenant: str, cpu: int = 1_000) -> TraceTask:
    return TraceTask(
        name=name, cpu_milli=cpu, memory_mib=1_000, gpu_count=1, gpu_milli=1000, tenant=tenant
    )


FOUR_NODES = [
    TraceNode(name=f"n{i}", cpu_milli=64_000, memory_mib=64_000, gpus=2, model=model)
    for i, model in enumerate(("A100", "A100", "T4", "T4"))
]
TENANCY = TenancyConfig(
    groups=(
        ResourceGroup(
            name="a100s", tenants=("ls",), nodes=NodeSelector(labels={MODEL_LABEL: "A100"})
        ),
    ),
    permissions=(TenantPermission(tenant="be", nodes=NodeSelector(labels={MODEL_LABEL: "T4"})),),
    quotas=(TenantQuota(tenant="be", gpus=2),),
)


def test_a_replay_keeps_each_tenant_in_its_group_and_quota() -> None:
    # ls's pods go in its group of the two A100 nodes (4 GPUs); be may use only the T4 nodes,
    # and two GPUs in all. Six pods each.
    tasks = [whole(f"{t}{i}", t) for i in range(6) for t in ("ls", "be")]
    result = replay(
        FOUR_NODES,
        tasks,
        "binpack",
        order=[n.name for n in FOUR_NODES],
        typical=ONLY_600,
        seed=1,
        tenancy=TENANCY,
    )
    ls, be = result.tenants["ls"], result.tenants["be"]
    assert (ls.placed, ls.waiting, ls.gpus, ls.gpu_milli) == (4, 2, 4, 4_000)
    assert (be.placed, be.waiting, be.gpus) == (2, 4, 2)
    assert result.failed == 6
    assert ls.gpu_memory_mib == be.gpu_memory_mib * 2 == 4 * SIM_GPU_MEMORY_MIB


def test_without_a_tenancy_the_same_tasks_all_fit() -> None:
    tasks = [whole(f"{t}{i}", t) for i in range(4) for t in ("ls", "be")]
    result = replay(
        FOUR_NODES, tasks, "binpack", order=[n.name for n in FOUR_NODES], typical=ONLY_600, seed=1
    )
    assert result.failed == 0
    assert {t: r.placed for t, r in result.tenants.items()} == {"ls": 4, "be": 4}


def test_with_pools_a_task_whose_pool_has_no_room_is_placed_on_another_pools_node() -> None:
    """One node, two pools: about half the tasks are taken by the replica whose pool is empty,
    and every one of them is placed on the node all the same."""
    node = [TraceNode(name="only", cpu_milli=64_000, memory_mib=256_000, gpus=8, model="A")]
    assert pool_of("only", 2) in (0, 1)  # so the other pool holds no node
    tasks = [whole(f"w{i}", "") for i in range(8)]
    pooled = replay(node, tasks, "binpack", order=["only"], typical=ONLY_600, seed=1, pools=2)
    alone = replay(node, tasks, "binpack", order=["only"], typical=ONLY_600, seed=1)
    assert pooled.failed == alone.failed == 0
    assert pooled.curves.alloc_at(100) == alone.curves.alloc_at(100)


@pytest.mark.parametrize(
    ("burst", "failed", "allocated"),
    [
        pytest.param(1, 1, 30.0, id="in-trace-order-the-share-strands-the-whole-gpu"),
        pytest.param(2, 1, 100.0, id="a-burst-places-the-larger-pod-first"),
    ],
)
def test_bursts_are_placed_in_the_queue_order(burst: int, failed: int, allocated: float) -> None:
    one_gpu = [TraceNode(name="n1", cpu_milli=8_000, memory_mib=64_000, gpus=1, model="A")]
    tasks = [share("small", 300), whole("big", "")]
    result = replay(one_gpu, tasks, "binpack", order=["n1"], typical=ONLY_600, seed=1, burst=burst)
    assert result.failed == failed
    assert result.curves.alloc_at(130) == pytest.approx(allocated)


@pytest.mark.parametrize("policy", ["bestfit", "fgd"])
def test_an_online_mix_is_learned_from_the_pods_placed(policy: str) -> None:
    nodes, original = synthetic_nodes(scale=20), synthetic_tasks(300)
    typical = typical_tasks(original)
    tasks = tuned_tasks(original, cluster_gpu_milli(nodes), seed=5)

    def run(mix: Mix) -> ReplayResult:
        order = node_order(nodes, seed=5)
        return replay(nodes, tasks, policy, order=order, typical=typical, seed=5, mix=mix)

    trace, online, again = run("trace"), run("online"), run("online")
    assert trace.profile_builds == 1
    assert online.profile_builds > 1  # compiled again as the mix moved
    assert (online.failed, online.curves) == (again.failed, again.curves)  # deterministic
    if policy == "bestfit":  # reads no mix: the same placements either way
        assert (online.failed, online.curves) == (trace.failed, trace.curves)


def test_curve_falls_back_to_neighbouring_buckets() -> None:
    curves = Curves()
    curves.add(30, 10.0, 1.0)
    curves.add(32, 20.0, 3.0)
    assert curves.alloc_at(31) == pytest.approx(15)
    assert curves.frag_at(31) == pytest.approx(2)
    assert curves.alloc_at(50) is None


@pytest.mark.parametrize(
    ("original", "expected_tasks"),
    [
        pytest.param([share("a", 500), share("b", 500)], 2, id="next-clone-would-overshoot"),
        pytest.param([share("a", 100)], 13, id="clones-up-to-130-percent"),
        pytest.param(
            [
                TraceTask(name=f"w{i}", cpu_milli=1, memory_mib=1, gpu_count=1, gpu_milli=1000)
                for i in range(3)
            ],
            1,
            id="over-target-drops-tasks",
        ),
    ],
)
def test_tuning_to_130_percent(original: list[TraceTask], expected_tasks: int) -> None:
    tasks = tuned_tasks(original, 1_000, seed=3)
    assert len(tasks) == expected_tasks
    assert sum(t.total_gpu_milli for t in tasks) <= 1_300


def test_shuffle_and_node_order_depend_on_the_seed_only() -> None:
    original = [share(f"t{i}", 100 + i) for i in range(50)]
    assert tuned_tasks(original, 10_000, seed=1) == tuned_tasks(original, 10_000, seed=1)
    assert tuned_tasks(original, 10_000, seed=1) != tuned_tasks(original, 10_000, seed=2)
    nodes = [
        TraceNode(name=f"n{i}", cpu_milli=1, memory_mib=1, gpus=1, model="") for i in range(20)
    ]
    assert sorted(node_order(nodes, seed=5)) == sorted(n.name for n in nodes)
    assert node_order(nodes, seed=5) != node_order(nodes, seed=6)


def test_typical_tasks_cover_95_percent() -> None:
    original = [share(f"a{i}", 500) for i in range(90)] + [share(f"b{i}", 300) for i in range(6)]
    original += [share(f"c{i}", 200) for i in range(4)]
    mix = typical_tasks(original)
    # 90 % < 95 %, so the second spec is kept (96 %); the third is not.
    assert [(t.gpu_milli, round(t.weight, 4)) for t in mix] == [
        (500, round(90 / 96, 4)),
        (300, round(6 / 96, 4)),
    ]


def gpus(name: str, count: int) -> TraceTask:
    return TraceTask(name=name, cpu_milli=1_000, memory_mib=1_000, gpu_count=count, gpu_milli=1000)


def multi_share(tasks: list[TraceTask]) -> float:
    total = sum(t.total_gpu_milli for t in tasks)
    return sum(t.total_gpu_milli for t in tasks if t.gpu_count > 1) / total


@pytest.mark.parametrize("carried", [0.3, 0.5])
def test_multi_gpu_variants_append_copies_of_multi_gpu_tasks(carried: float) -> None:
    original = [share(f"openb-pod-{i:04d}", 500) for i in range(80)]  # 20 % on 2 and 8 GPUs
    original += [gpus("openb-pod-0080", 2), gpus("openb-pod-0081", 8)]
    tasks = with_multi_gpu_share(original, carried, seed=3)
    assert tasks[: len(original)] == original
    added = tasks[len(original) :]
    assert added and all(t.gpu_count in (2, 8) for t in added)
    assert [t.name for t in added] == [f"openb-pod-{82 + i:04d}" for i in range(len(added))]
    assert multi_share(tasks) >= carried > multi_share(tasks[:-1])
    assert with_multi_gpu_share(original, carried, seed=3) == tasks
    assert with_multi_gpu_share(original, 0.1) == original  # already carries more


def test_a_multi_gpu_variant_not_stored_is_built_from_the_default_trace(tmp_path: Path) -> None:
    rows = "".join(f"openb-pod-{i:04d},1000,10,1,500\n" for i in range(20))
    write(
        tmp_path / "openb_pod_list_default.csv",
        f"name,cpu_milli,memory_mib,num_gpu,gpu_milli\n{rows}openb-pod-0020,8000,10,4,1000\n",
    )
    built = named_trace(tmp_path, "multigpu40")
    assert len(built) > 21 and multi_share(built) >= 0.4
    write(
        tmp_path / "openb_pod_list_multigpu40.csv",
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\nx,1,1,0,0\n",
    )
    assert [t.name for t in named_trace(tmp_path, "multigpu40")] == ["x"]  # a stored one wins
    with pytest.raises(TraceError, match="no such file"):
        named_trace(tmp_path, "gpushare40")


def test_the_builtin_workload_follows_the_trace_distributions() -> None:
    nodes = synthetic_nodes()
    trace_nodes = sum(kind[0] for kind in NODE_KINDS)
    assert len(nodes) == round(trace_nodes / 10)
    kinds = {(n.cpu_milli, n.memory_mib, n.gpus, n.model) for n in nodes}
    for count, *kind in NODE_KINDS:
        got = sum(1 for n in nodes if (n.cpu_milli, n.memory_mib, n.gpus, n.model) == tuple(kind))
        assert abs(got - count / 10) < 1  # every kind in proportion (largest remainders)
    assert len(kinds) >= 10
    tasks = synthetic_tasks()
    gpus = sum(n.gpus for n in nodes)
    assert len(tasks) == round(8_152 / 6_212 * gpus)
    specs = {(cpu, memory, g, milli) for _, cpu, memory, g, milli in TASK_KINDS}
    assert all((t.cpu_milli, t.memory_mib, t.gpu_count, t.gpu_milli) in specs for t in tasks)
    assert {t.gpu_count for t in tasks} >= {0, 1, 2, 8}


def test_the_policies_separate_on_the_builtin_workload() -> None:
    """As on the trace: BestFit behind FGD, FGD behind the tessera profile (seed 42)."""
    nodes, original = synthetic_nodes(), synthetic_tasks()
    tasks = tuned_tasks(original, cluster_gpu_milli(nodes), seed=42)
    unallocated = {}
    for policy in ("bestfit", "fgd", "tessera"):
        result = replay(
            nodes,
            tasks,
            policy,
            order=node_order(nodes, seed=42),
            typical=typical_tasks(original),
            seed=42,
        )
        value = result.curves.alloc_at(100)
        assert value is not None
        unallocated[policy] = 100 - value
    assert unallocated["bestfit"] - unallocated["fgd"] >= 0.5
    assert unallocated["fgd"] - unallocated["tessera"] >= 0.5


def test_the_builtin_table_is_what_the_trace_gives() -> None:
    root = Path(__file__).resolve().parents[2]
    data = root.parent / "shared" / "data" / "alibaba-gpu-v2023" / "csv"
    if not (data / "openb_pod_list_default.csv").exists():
        pytest.skip("the Alibaba trace is not beside the repository")
    script = root / "scripts" / "synthetic_table.py"
    result = subprocess.run(
        [sys.executable, str(script), "--check", "--data", str(data)], timeout=60, check=False
    )
    assert result.returncode == 0, "run scripts/synthetic_table.py"


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_trace_files_load(tmp_path: Path) -> None:
    nodes = write(
        tmp_path / "nodes.csv",
        "sn,cpu_milli,memory_mib,gpu,model\nb,64000,1000,2,T4\na,32000,1000,0,\n",
    )
    pods = write(
        tmp_path / "pods.csv",
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\np2,1000,10,1,500,T4|A10\np1,2000,10,0,0,\n",
    )
    assert load_nodes(nodes) == [
        TraceNode(name="b", cpu_milli=64_000, memory_mib=1_000, gpus=2, model="T4")
    ]
    first, second = load_tasks(pods)
    assert first.name == "p1" and first.gpu_count == 0
    assert second.models == ("T4", "A10")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        pytest.param(
            "name,cpu_milli\np,1\n",
            "missing column(s) memory_mib, num_gpu, gpu_milli",
            id="columns",
        ),
        pytest.param(
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,lots,1,0,0\n",
            "pods.csv:2: column 'cpu_milli': 'lots' is not a number",
            id="number",
        ),
        pytest.param(
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,2,500\n",
            "a multi-GPU task must ask for whole GPUs",
            id="multi-gpu-share",
        ),
        pytest.param("name,cpu_milli,memory_mib,num_gpu,gpu_milli\n", "no tasks", id="empty"),
    ],
)
def test_malformed_pod_csv(tmp_path: Path, content: str, message: str) -> None:
    path = write(tmp_path / "pods.csv", content)
    with pytest.raises(TraceError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_tasks(path)


def test_cli_json_on_the_builtin_workload(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--policy", "fgd,bestfit", "--seeds", "1-2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    fgd = out["policies"]["fgd"]
    assert fgd["seeds"] == [1, 2]
    assert set(fgd["unallocated_pct_at_100"]) == {"mean", "median"}
    assert 0 < fgd["unallocated_pct_at_100"]["mean"] < 20
    assert fgd["tasks"] > 800
    assert fgd["wall_s"] > 0
    assert set(out["policies"]) == {"fgd", "bestfit"}


def test_cli_table_and_parallel_jobs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--policy", "packing", "--seeds", "3,4", "--jobs", "2"]) == 0
    out = capsys.readouterr().out
    assert "packing" in out and "unalloc@100" in out and "seeds 3-4" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(["--trace", "/nonexistent/pods.csv"], "no such file", id="missing-trace"),
        pytest.param(["--nodes", "x.csv"], "--nodes needs --trace", id="nodes-without-trace"),
        pytest.param(["--jobs", "0"], "--jobs must be at least 1", id="jobs"),
        pytest.param(["--burst", "0"], "--burst must be at least 1", id="burst"),
        pytest.param(["--pools", "0"], "--pools must be at least 1", id="pools"),
        pytest.param(
            ["--tenancy-file", "/nonexistent/tenancy.json"], "cannot read", id="missing-tenancy"
        ),
    ],
)
def test_cli_clear_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


def test_cli_replays_under_a_tenancy_file_and_reports_each_tenant(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes = write(
        tmp_path / "nodes.csv",
        "sn,cpu_milli,memory_mib,gpu,model\n"
        + "".join(f"n{i},64000,262144,4,{'A100' if i < 2 else 'T4'}\n" for i in range(4)),
    )
    pods = write(
        tmp_path / "pods.csv",
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos\n"
        + "".join(f"p{i},4000,8192,1,250,,{'LS' if i % 2 else 'BE'}\n" for i in range(24)),
    )
    tenancy = write(
        tmp_path / "tenancy.toml",
        '[[quotas]]\ntenant = "be"\ngpus = 5\n\n'
        '[[groups]]\nname = "a100s"\ntenants = ["ls"]\n'
        'nodes = { labels = { "nvidia.com/gpu.product" = "A100" } }\n',
    )
    argv = ["simulate", "--trace", str(pods), "--nodes", str(nodes), "--policy", "bestfit"]
    assert main([*argv, "--tenancy-file", str(tenancy), "--seeds", "1-2"]) == 0
    table = capsys.readouterr().out
    assert "tenancy " in table and "bestfit, per tenant at the end" in table
    assert main([*argv, "--tenancy-file", str(tenancy), "--json"]) == 0
    tenants = json.loads(capsys.readouterr().out)["policies"]["bestfit"]["tenants"]
    assert tenants["be"]["gpus"] == 5  # its quota, of about 40 shares asked
    assert tenants["be"]["waiting"] > 30
    assert 0 < tenants["ls"]["gpus"] <= 2 * 16  # the A100 nodes hold 16 such tasks each (CPU)


def test_cli_bound_is_below_every_policy(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("scipy")
    argv = ["simulate", "--policy", "bestfit", "--seeds", "1", "--bound", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["bound"]["seeds"] == [1]
    (bound,) = out["bound"]["per_seed_unallocated_pct_at_100"]
    assert bound > 0  # the trace's share sizes leave holes nothing fills
    for policy in out["policies"].values():
        assert bound <= policy["unallocated_pct_at_100"]["mean"]
    assert "bound (LP)" in report.table(out)


def test_cli_bound_without_scipy_is_a_clear_error() -> None:
    code = (
        "import sys; sys.modules['scipy'] = None; from tessera.cli import main; "
        "sys.exit(main(['simulate', '--bound']))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert result.returncode == 2
    assert "--bound needs scipy" in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_rejects_unknown_policy(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["simulate", "--policy", "fgd,best"])
    assert stop.value.code == 2
    assert "unknown policy best" in capsys.readouterr().err


def test_cli_plot_draws_a_png(tmp_path: Path) -> None:
    target = tmp_path / "curves.png"
    assert main(["simulate", "--policy", "fgd,random", "--plot", str(target), "--no-progress"]) == 0
    data = target.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    assert len(data) > 10_000  # axes, two curves and a legend, not an empty canvas


def test_cli_plot_without_matplotlib_is_a_clear_error(tmp_path: Path) -> None:
    """Run where matplotlib cannot be imported (a None entry in sys.modules blocks it)."""
    code = (
        "import sys; sys.modules['matplotlib'] = None; from tessera.cli import main; "
        f"sys.exit(main(['simulate', '--plot', {str(tmp_path / 'x.png')!r}]))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert result.returncode == 2
    assert "--plot needs matplotlib" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "x.png").exists()
