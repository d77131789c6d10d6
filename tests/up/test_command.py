"""``tessera up`` as a user runs it: the JSON summary, and no process left behind, ever."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tessera.up.processes import StartError
from tessera.up.spec import plan_nodes
from tessera.up.system import LocalSystem, SystemOptions
from tests.harness.nats import environment_without_proxies

ROOT = Path(__file__).resolve().parents[2]


def up(*args: str, run_dir: Path, stderr: int = subprocess.PIPE) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tessera.cli", "up", "--run-dir", str(run_dir), *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        env=environment_without_proxies(),
    )


def descendants(pid: int) -> set[int]:
    """Every process whose parent chain reaches ``pid`` (from /proc)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents[int(entry.name)] = int(fields[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.timeout(240)
def test_exit_when_done_prints_one_json_summary(tmp_path: Path) -> None:
    process = up(
        "--exit-when-done",
        "--json",
        "--gpus",
        "gpu-a=4xA100-80GB,gpu-b=8xT4,cpu-a=cpu",
        "--pods",
        "14",
        "--timeout",
        "150",
        run_dir=tmp_path,
    )
    out, err = process.communicate(timeout=220)
    assert process.returncode == 0, err[-3000:]
    summary = json.loads(out)
    assert summary["settled"] is True
    assert summary["mismatched_containers"] == 0
    assert summary["overcommitted_gpus"] == 0
    assert sum(summary["pods_by_phase"].values()) == 14
    # The built-in mix: everything runs but the one pod no GPU can hold, Pending with reasons.
    assert summary["pods_by_phase"] == {"Pending": 1, "Running": 13}
    assert summary["pending"][0]["pod"] == "default/too-big-1"
    assert "nodes are available" in summary["pending"][0]["reason"]
    for stage in (
        "created_to_decided",
        "decided_to_bound",
        "bound_to_allocated",
        "allocated_to_running",
        "created_to_running",
    ):
        assert summary["latency_ms"][stage]["n"] >= 12
        assert summary["latency_ms"][stage]["p50"] <= summary["latency_ms"][stage]["p99"]
    assert "dashboard" in err and "http://127.0.0.1:" in err
    # Three nodes are too few for a pool each: by default both placers decide on every node.
    logs = [(tmp_path / "logs" / f"placer-{n}.log").read_text() for n in (1, 2)]
    assert not any('"node pools held"' in log for log in logs), "pools on three nodes"


def test_a_negative_pool_count_is_refused_before_anything_starts(tmp_path: Path) -> None:
    process = up("--pools", "-1", run_dir=tmp_path)
    out, err = process.communicate(timeout=60)
    assert (process.returncode, out) == (2, "")
    assert "--pools at least 0" in err
    assert "Traceback" not in err


@pytest.mark.timeout(240)
def test_a_killed_tessera_up_leaves_no_process_behind(tmp_path: Path) -> None:
    process = up(
        "--keep",
        "--json",
        "--gpus",
        "n1=2xA100-80GB",
        "--pods",
        "4",
        run_dir=tmp_path,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert process.stdout is not None
        summary = json.loads(process.stdout.readline())  # printed once settled; --keep goes on
        assert summary["mismatched_containers"] == 0
        children = descendants(process.pid)
        assert len(children) >= 6  # nats-server, inventory, device plugin, binder, 2 placers, ...
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(alive(pid) for pid in children):
            time.sleep(0.1)
        assert not [pid for pid in children if alive(pid)]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        assert process.stdout is not None
        process.stdout.close()


@pytest.mark.timeout(120)
async def test_a_service_that_never_turns_ready_is_named_with_its_reasons(tmp_path: Path) -> None:
    """``tessera up`` says why it gave up: each service not ready, with its failing /readyz
    checks (here a device plugin whose 1 TiB GPU in 1 MiB devices the kubelet cannot take)."""
    (plan,) = plan_nodes("n=1xBIG-1048576MiB:mode=memory-units")
    system = LocalSystem(
        SystemOptions(
            nodes=[plan],
            run_dir=tmp_path,
            plugin_args=("--memory-unit-mib", "1"),
            env=environment_without_proxies(),
        )
    )
    try:
        for name in system.nats_names():
            system.start_nats(name)
        await system.cluster.start()
        await system.open_bus()  # the store's epoch, which the node services wait for
        system.start_node_services(plan)
        # Asked again every 2 s until the inventory is ready and the plugin has said why it is
        # not (waiting 20 s at once spent them all on a plugin that can never be ready).
        patience = time.monotonic() + 20
        while True:
            with pytest.raises(StartError) as failed:
                await system.wait_ready(2)
            message = str(failed.value)
            settled = "inventory/n" not in message and "ListAndWatch message" in message
            if settled or time.monotonic() > patience:
                break
    finally:
        await system.stop()
    assert "not ready within 2 s" in message
    assert (
        "\n  deviceplugin/n: devices: 1048576 devices make a ListAndWatch message of about"
        in message
    ), message
    assert "raise --memory-unit-mib to at least" in message
    assert "inventory/n" not in message, "the inventory was ready"
