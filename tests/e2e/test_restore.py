"""Issue 45's reproduction in real processes: a pod's ``tessera.dev/assignment`` edited to name
another GPU of the same size, then NATS loses its store. The restore must book the GPU the pod
really holds (as its device plugin granted it), so the next pod does not over-commit it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shared import annotations as names
from shared.runtime.bus import BusUnavailableError
from tessera.devcluster.resources import EVENT, POD
from tessera.up import workload as w
from tessera.up.spec import plan_nodes
from tessera.up.system import LocalSystem, SystemOptions
from tests.e2e.helpers import by_name, gpus_of, phase, pods_of, record_of, settle, until

pytestmark = [pytest.mark.asyncio(loop_scope="package"), pytest.mark.timeout(240)]
NS = "restore"


def gpu_pod(name: str) -> dict[str, object]:
    """60,000 MiB and half the SMs of an 80 GB GPU: two never fit one GPU."""
    return w.pod(name, [w.container(gpu=1, memory_mib=60_000, cores=50)], namespace=NS)


async def test_a_restore_books_what_the_plugin_granted_not_an_edited_annotation(
    tmp_path: Path,
) -> None:
    options = SystemOptions(
        nodes=plan_nodes("2xA100-80GB", 1),
        run_dir=tmp_path,
        placers=1,
        binders=1,
        dashboard=False,
        webhook=False,  # the edit below is what the webhook now refuses: made in process here
        ready_timeout_s=150.0,
    )
    async with LocalSystem(options) as system:
        system.cluster.create_pod(gpu_pod("after-0"))
        (first,) = await settle(system, NS, 1)
        assert phase(first) == "Running"
        (held,) = gpus_of(system, first)
        assignment = json.loads(first["metadata"]["annotations"][names.ASSIGNMENT])
        (piece,) = assignment["containers"][0]["gpus"]
        other = next(g for g in system.gpus() if g.uuid != held)
        piece["uuid"], piece["index"] = other.uuid, 1 - piece["index"]
        system.cluster.api.patch(
            POD,
            NS,
            "after-0",
            {"metadata": {"annotations": {names.ASSIGNMENT: json.dumps(assignment)}}},
            "application/merge-patch+json",
        )

        system.wipe_nats_store()
        system.restart("nats-server")

        async def restored() -> bool:
            try:
                return await record_of(system, first) is not None
            except BusUnavailableError:  # the new store is being made
                return False

        await until(restored, timeout=90.0, what="after-0's placement restored")
        record = await record_of(system, first)
        assert record is not None
        assert [s.uuid for c in record.containers for s in c.gpus] == [held], (
            "restored as the device plugin granted it"
        )

        system.cluster.create_pod(gpu_pod("after-1"))

        def running() -> dict[str, dict[str, object]] | None:
            pods = by_name(pods_of(system, NS))
            return pods if {phase(p) for p in pods.values()} == {"Running"} else None

        # Until the inventory is published again into the new store, the pod may wait.
        pods = await until(running, timeout=90.0, what="after-1 Running")
        assert not system.cluster.overcommits(), system.cluster.overcommits()
        assert gpus_of(system, pods["after-1"]) == [other.uuid]
        notes = [
            e.get("note", "")
            for e in system.cluster.api.objects(EVENT, NS)
            if e.get("reason") == "RestoreCorrected"
            and (e.get("regarding") or {}).get("name") == "after-0"
        ]
        assert notes and "the device plugin on " in notes[0] and held in notes[0], notes
