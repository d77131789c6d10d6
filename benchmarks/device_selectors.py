"""What a DRA claim's selectors cost a decision: none, the model only, and per-GPU attributes.

    .venv/bin/python benchmarks/device_selectors.py [--nodes 1000] [--gpus 8] [--rounds 5]

A cluster of ``--nodes`` nodes of ``--gpus`` GPUs (two models, every node's GPUs on two NUMA
nodes, a few GPUs of each node partly used so that there are some hundred shapes), the default
``tessera`` profile, and three pods alike but for their claim's selectors: none, one on the
model (judged by model, shape by shape), one on the NUMA node and memory (judged GPU by GPU, node
by node: ``core/plugins/deviceselectors.py``). Each round decides each pod once on a fresh copy
of the index (so no memo from the last round), alternating the kinds, then a second pod of the
same kind on it (the memo warm); the median per kind, and the very first decision of each kind
(``cold``: the selectors' verdicts not cached yet).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from services.placer.core.cycle import decide  # noqa: E402
from services.placer.core.index import ClusterIndex  # noqa: E402
from services.placer.core.model import Decision, GpuState, NodeState, PodRequest  # noqa: E402
from services.placer.core.profiles import build_profile  # noqa: E402
from services.placer.rules import translate  # noqa: E402
from shared.dra.claims import ClaimPlan, plan_claims  # noqa: E402
from shared.dra.devices import DEVICE_CLASS, MemoryPolicy  # noqa: E402
from shared.messages.resourceclaims import DeviceRequest, PodResourceClaim  # noqa: E402

T = 'device.attributes["gpu.tessera.dev"]'
K = 'device.attributes["resource.kubernetes.io"]'
KINDS = {
    "none": (),
    "model": (f'{T}.model.startsWith("A100")',),
    "per-GPU": (f"{K}.numaNode == 1", f"{T}.memoryMiB >= 40000"),
}


def nodes(count: int, gpus: int, seed: int) -> list[NodeState]:
    rng = random.Random(seed)
    built = []
    for n in range(count):
        model, mib = ("A100-80GB", 81_920) if n % 2 else ("L40S-48GB", 49_152)
        states = tuple(
            GpuState(
                index=i,
                uuid=f"GPU-{n}-{i}",
                model=model,
                memory_total_mib=mib,
                memory_reserved_mib=rng.choice((0, 0, 0, 4096, 8192)),
                core_milli_reserved=rng.choice((0, 0, 0, 100, 200)),
                numa_node=i * 2 // gpus,
                pcie_root=f"pci0000:{i * 2 // gpus:02x}",
            )
            for i in range(gpus)
        )
        built.append(
            NodeState(
                name=f"n{n:05d}", cpu_milli_total=64_000, memory_mib_total=262_144, gpus=states
            )
        )
    return built


def pod(kind: str, uid: str) -> PodRequest:
    request = DeviceRequest(
        name="r",
        device_class=DEVICE_CLASS,
        capacity={"memory": "8Gi", "compute": "25"},
        selectors=KINDS[kind],
    )
    plan = plan_claims(
        (PodResourceClaim(name="gpu", claim=f"{uid}-gpu", uid=uid, requests=(request,)),),
        policy=MemoryPolicy(),
    )
    assert isinstance(plan, ClaimPlan), plan
    return PodRequest(
        uid=uid,
        namespace="ns",
        name=uid,
        containers=translate.claim_containers(plan),
        gpu_selectors=KINDS[kind],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    states = nodes(args.nodes, args.gpus, seed=1)
    profile = build_profile("tessera")
    times: dict[str, list[float]] = {kind: [] for kind in KINDS}
    again: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for r in range(args.rounds):
        for kind in KINDS:
            index = ClusterIndex(states)
            for into in (times, again):  # a fresh memo, then a second pod of the same shape
                asked = pod(kind, f"{kind}-{r}-{len(into[kind])}")
                started = time.perf_counter()
                outcome = decide(asked, index, profile, now=0)
                into[kind].append(time.perf_counter() - started)
                assert isinstance(outcome, Decision), outcome
    shapes = len({s for s in ClusterIndex(states).shapes})
    print(f"{args.nodes} nodes x {args.gpus} GPUs, {shapes} shapes, {args.rounds} rounds")
    print(f"{'selectors':<10} {'cold ms':>9} {'first pod ms':>13} {'next pod ms':>12}")
    for kind in KINDS:
        cold = times[kind][0] * 1000
        first = statistics.median(times[kind]) * 1000
        second = statistics.median(again[kind]) * 1000
        print(f"{kind:<10} {cold:>9.2f} {first:>13.2f} {second:>12.2f}")


if __name__ == "__main__":
    main()
