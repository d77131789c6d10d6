"""A burst of identical pods onto a few nodes (issue 22): none Failed, none timed out at the gate.

A thousand pods asking the same slice at once, onto ten nodes: every node's ambiguity gate lets
one such pod through to Allocate at a time, so each node's queue is long. A gate deadline
counted from a pod's first wait failed the tail of the queue back to the placer, and its
requeue landed on the same node again (Failed pods, once a livelock). Now the placers spread the
burst over the nodes, and a wait times out only when the record it waits on stays put.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import aiohttp
import pytest

from tessera.up import workload as w
from tessera.up.spec import plan_nodes
from tessera.up.system import LocalSystem, SystemOptions
from tests.e2e.helpers import assert_exact, phase, settle

pytestmark = [pytest.mark.asyncio(loop_scope="package"), pytest.mark.timeout(600)]

NAMESPACE = "burst"
BURST = 1000
NODES = 10
GATE_TIMEOUT_S = 5


async def gate_waits(system: LocalSystem) -> dict[str, float]:
    """The binders' ``tessera_binder_gate_waits_total`` by outcome, summed over replicas."""
    found: dict[str, float] = {}
    names = [n for n in system.supervisor.children if n.startswith("binder")]
    async with aiohttp.ClientSession(trust_env=False) as http:
        for name in names:
            port = system.supervisor.http_port(name)
            async with http.get(f"http://127.0.0.1:{port}/metrics") as answer:
                text = await answer.text()
            for line in text.splitlines():
                if line.startswith("tessera_binder_gate_waits_total{"):
                    outcome = line.split('outcome="', 1)[1].split('"', 1)[0]
                    found[outcome] = found.get(outcome, 0.0) + float(line.rsplit(" ", 1)[1])
    return found


async def test_a_burst_of_identical_pods_onto_ten_nodes_fails_none(tmp_path: Path) -> None:
    options = SystemOptions(
        nodes=plan_nodes("8xA100-80GB", NODES),
        run_dir=tmp_path,
        placers=2,
        binders=1,
        dashboard=False,
        webhook=False,
        nodes_per_process=5,
        ready_timeout_s=150.0,
        # Far below the time the tail of a node's queue waits in all, far above what one
        # bind -> Allocate takes: a deadline from the first wait would fail pods here.
        binder_args=("--gate-timeout-s", str(GATE_TIMEOUT_S)),
    )
    async with LocalSystem(options) as system:
        for i in range(BURST):
            shape = w.container(gpu=1, memory_mib=4096, cores=5, cpu="10m", memory="16Mi")
            system.cluster.create_pod(w.pod(f"b-{i}", [shape], namespace=NAMESPACE))
        pods = await settle(system, NAMESPACE, BURST, timeout=420.0)
        by_phase = Counter(phase(pod) or "Pending" for pod in pods)
        print(f"{BURST} pods onto {NODES} nodes: {by_phase}")
        assert by_phase.get("Failed", 0) == 0, by_phase
        assert by_phase.get("Running", 0) > BURST // 2, by_phase
        await assert_exact(system, pods)
        waits = await gate_waits(system)
        print(f"gate waits: {waits}")
        assert waits.get("timed_out", 0.0) == 0, waits
        assert waits.get("passed", 0.0) > 0, "the burst did queue at the gate"
