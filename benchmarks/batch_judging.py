"""Judging a request never seen on every node shape: one shape at a time, and all together.

    .venv/bin/python benchmarks/batch_judging.py [--nodes 1000] [--gpus 8] [--repeat 7]

A cluster of ``--nodes`` nodes whose every GPU has its own memory and cores in use (so every node
is a shape of its own, as in ``benchmarks/extender.py``), the default ``tessera`` profile, and a
few requests as kube-scheduler asks about them: a GPU share, a share on each of two GPUs, a whole
GPU. For each, the time to judge every shape with ``Profile.judge`` (a fresh profile, so its
fragmentation memo starts empty, as for a request never seen) and with the profile's batch judge
(``services/placer/core/batch.py``) on an index that has copied its shapes' rows already (as a
running placer has); the median of ``--repeat`` runs. Both judgements are compared: the script
fails if one differs.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from services.placer.core.facts import PodFacts, pod_facts  # noqa: E402
from services.placer.core.index import ClusterIndex  # noqa: E402
from services.placer.core.model import GpuState, NodeState, PodRequest  # noqa: E402
from services.placer.core.profiles import build_profile  # noqa: E402
from tests.placer.builders import pod  # noqa: E402

GPU_MIB = 81_920


def cluster(nodes: int, gpus: int, seed: int) -> ClusterIndex:
    rng = random.Random(seed)
    states = []
    for n in range(nodes):
        states.append(
            NodeState(
                name=f"node-{n:05d}",
                cpu_milli_total=128_000,
                memory_mib_total=1_048_576,
                cpu_milli_reserved=rng.randrange(0, 64) * 1_000,
                gpus=tuple(
                    GpuState(
                        index=g,
                        uuid=f"GPU-{n}-{g}",
                        model="A100",
                        memory_total_mib=GPU_MIB,
                        memory_reserved_mib=rng.randrange(0, GPU_MIB // 2, 512),
                        core_milli_reserved=rng.randrange(0, 500, 10),
                    )
                    for g in range(gpus)
                ),
            )
        )
    return ClusterIndex(states)


REQUESTS: dict[str, PodRequest] = {
    "share (8 GiB, 30 %)": pod("share").container(shares=1, mib=8_192, cores=30).build(),
    "a share on each of 2 GPUs": pod("two").container(shares=2, mib=4_096, cores=20).build(),
    "a whole GPU": pod("whole").whole(1).build(),
}


def median_ms(runs: list[Callable[[], object]]) -> float:
    """The median wall time of ``runs``, each called once."""
    times = []
    for run in runs:
        start = time.perf_counter()
        run()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def one_at_a_time(facts: PodFacts, index: ClusterIndex, sids: list[int]) -> Callable[[], object]:
    """Judging every shape with a fresh profile's scalar plugins (built before the clock runs:
    an empty fragmentation memo, as for a request never seen)."""
    profile = build_profile("tessera")
    return lambda: {sid: profile.judge(facts, index.shapes[sid]) for sid in sids}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1_000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    index = cluster(args.nodes, args.gpus, seed=7)
    sids = list(range(len(index.shapes)))
    print(f"{args.nodes} nodes x {args.gpus} GPUs, {len(sids)} distinct shapes, profile tessera")
    print("| request | one shape at a time | all together | ratio |")
    print("|---|---|---|---|")
    for label, request in REQUESTS.items():
        facts = pod_facts(request)
        batch = build_profile("tessera").batch
        assert batch is not None
        together = batch.judge(facts, index, sids)  # copies the rows: a running placer has them
        if together != one_at_a_time(facts, index, sids)():
            print(f"{label}: the judgements differ", file=sys.stderr)
            return 1
        scalar = median_ms([one_at_a_time(facts, index, sids) for _ in range(args.repeat)])
        batched = median_ms(
            [lambda: batch.judge(facts, index, sids) for _ in range(args.repeat)]  # noqa: B023
        )
        print(f"| {label} | {scalar:.1f} ms | {batched:.2f} ms | {scalar / batched:.1f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
