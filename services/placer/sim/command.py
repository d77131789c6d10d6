"""``tessera simulate``: replay a trace (or the built-in workload) through the placer's path.

Follows the FGD paper's methodology (``research/perf-anchor.md`` section 4): GPU nodes only,
trace sorted then shuffled per seed, tuned to 130 % of GPU capacity, a per-seed node order for
tie-breaks, metrics after every task. Every task goes through the placer's queue and placement
cycle (``sim/replay.py``). Prints a table (or ``--json``) of allocated, unallocated and
fragmented GPU share at 100 % and 130 % arrived workload, mean and median over the seeds.

- ``--mix trace`` (default): FGD and the tessera profile know the whole trace's typical task mix
  in advance, as in the FGD artifact (the published figures are measured so); ``--mix online``:
  they learn it as the placer service does, from the pods placed so far.
- ``--tenancy-file FILE``: the operator's groups, permissions and quotas (JSON or TOML, as for
  ``tessera placer``); a task's tenant is the trace's ``tenant`` column, else its ``qos`` class
  in lower case. The table then adds each tenant's pods placed and waiting and what it holds.
- ``--burst N``: tasks arrive N at a time and are placed in the queue's order (priority, then
  larger pods first).
- ``--pools N``: each task is decided as N placer replicas with ``--pools N`` decide it: on the
  nodes of one pool (the pool of the replica that took it, a draw), and on every node when none
  of them fits; what node pools cost in packing.
- ``--bound``: adds, per seed, a lower bound on the unallocated GPU share at 100 % arrived that
  no placement of the seed's tasks, online or offline, can beat (an LP solved by HiGHS,
  ``sim/bound.py``; needs scipy). It counts CPU, memory, GPUs and models, not the tenancy's
  groups and quotas, so with ``--tenancy-file`` it is a looser bound still.
"""

from __future__ import annotations

import argparse
import importlib
import json
import multiprocessing
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from services.placer.config import ConfigFileError, parse_tenancy
from services.placer.core.fragmentation import TypicalTask
from services.placer.core.groups import TenancyConfig
from services.placer.core.profiles import BUILTIN, ProfileError, build_profile
from services.placer.sim import bound as placement_bound
from services.placer.sim import report
from services.placer.sim.replay import Mix, ReplayResult, replay
from services.placer.sim.synthetic import synthetic_nodes, synthetic_tasks
from services.placer.sim.trace import TraceError, TraceNode, TraceTask, load_nodes, load_tasks
from services.placer.sim.workload import cluster_gpu_milli, node_order, tuned_tasks, typical_tasks
from shared.runtime.command import Command

EXIT_USAGE = 2
PAPER_POLICIES = ("random", "dotprod", "clustering", "packing", "bestfit", "fgd")


def parse_seeds(text: str) -> list[int]:
    """``42-51``, ``42,43`` or ``7`` to a list of seeds."""
    seeds: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if match is None:
            raise argparse.ArgumentTypeError(f"bad seeds {text!r}: use 42-51 or 42,43,44")
        start = int(match.group(1))
        end = int(match.group(2)) if match.group(2) else start
        if end < start:
            raise argparse.ArgumentTypeError(f"seed range {part!r} runs backwards")
        seeds.extend(range(start, end + 1))
    return seeds


def parse_policies(text: str) -> list[str]:
    names = [p.strip() for p in text.split(",") if p.strip()]
    unknown = [n for n in names if n not in BUILTIN]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown policy {', '.join(unknown)} (known: {', '.join(BUILTIN)})"
        )
    if not names:
        raise argparse.ArgumentTypeError("no policy given")
    return names


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--trace",
        type=Path,
        help="pod CSV in the Alibaba openb format (default: built-in workload)",
    )
    parser.add_argument(
        "--nodes",
        type=Path,
        help="node CSV (default with --trace: openb_node_list_gpu_node.csv beside the trace)",
    )
    parser.add_argument(
        "--policy",
        type=parse_policies,
        default=["tessera"],
        help="comma-separated policies or profiles: " + ", ".join(BUILTIN) + " (default: tessera)",
    )
    parser.add_argument(
        "--seeds", type=parse_seeds, default=[42], help="seeds, e.g. 42-51 or 42,43 (default: 42)"
    )
    parser.add_argument(
        "--target", type=float, default=1.3, help="tune the workload to this x GPU capacity (1.3)"
    )
    parser.add_argument(
        "--mix",
        choices=("trace", "online"),
        default="trace",
        help="the typical task mix FGD and tessera score with: the whole trace's, known in advance "
        "(trace, the default, as the FGD artifact), or learned from the pods placed so far, as "
        "the placer service does (online)",
    )
    parser.add_argument(
        "--tenancy-file",
        type=Path,
        help="groups, permissions and quotas (JSON or TOML, as tessera placer --tenancy-file); "
        "a task's tenant is the trace's tenant column, else its qos class in lower case",
    )
    parser.add_argument(
        "--burst",
        type=int,
        default=1,
        help="tasks arriving at once, placed in the queue's order (1: the trace's order)",
    )
    parser.add_argument(
        "--pools",
        type=int,
        default=1,
        help="decide each task as one of N placer replicas with --pools N would: on its pool's "
        "nodes first, on every node when none fits (1: every node)",
    )
    parser.add_argument(
        "--bound",
        action="store_true",
        help="also print a lower bound on the unallocated GPU share at 100 %% arrived that no "
        "placement can beat (an LP over the seed's tasks, solved by HiGHS; needs scipy)",
    )
    parser.add_argument("--jobs", type=int, default=1, help="replays run in parallel processes (1)")
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object instead of a table"
    )
    parser.add_argument("--plot", type=Path, help="draw unallocated GPU vs arrived workload (PNG)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


@dataclass(frozen=True)
class Job:
    policy: str
    seed: int
    nodes: tuple[TraceNode, ...]
    original: tuple[TraceTask, ...]
    typical: tuple[TypicalTask, ...]
    target: float
    mix: Mix = "trace"
    tenancy: TenancyConfig | None = None
    burst: int = 1
    pools: int = 1


def run_job(job: Job, progress: Callable[[int], None] | None = None) -> ReplayResult:
    tasks = tuned_tasks(
        job.original, cluster_gpu_milli(job.nodes), seed=job.seed, target=job.target
    )
    return replay(
        job.nodes,
        tasks,
        job.policy,
        order=node_order(job.nodes, seed=job.seed),
        typical=job.typical,
        seed=job.seed,
        mix=job.mix,
        tenancy=job.tenancy,
        burst=job.burst,
        pools=job.pools,
        progress=progress,
    )


class Progress:
    """A one-line progress bar on a terminal stream (redrawn at most ten times a second)."""

    def __init__(self, stream: TextIO, total: int, enabled: bool) -> None:
        self.stream, self.total, self.enabled = stream, max(1, total), enabled
        self.done = 0
        self._drawn = 0.0
        self.started = time.monotonic()

    def advance(self, steps: int = 1, label: str = "") -> None:
        self.done += steps
        now = time.monotonic()
        if self.enabled and (now - self._drawn > 0.1 or self.done >= self.total):
            self._drawn = now
            share = min(1.0, self.done / self.total)
            bar = "#" * int(30 * share)
            self.stream.write(
                f"\r[{bar:<30}] {100 * share:5.1f}% {now - self.started:6.1f}s {label:<24}"
            )
            self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()


def load_inputs(args: argparse.Namespace) -> tuple[list[TraceNode], list[TraceTask], str]:
    if args.trace is None:
        if args.nodes is not None:
            raise TraceError("--nodes needs --trace")
        return synthetic_nodes(), synthetic_tasks(), "built-in synthetic workload"
    nodes_path = args.nodes or args.trace.parent / "openb_node_list_gpu_node.csv"
    return load_nodes(nodes_path), load_tasks(args.trace), str(args.trace)


def run(args: argparse.Namespace) -> int:
    err = sys.stderr
    try:
        nodes, original, source = load_inputs(args)
    except TraceError as error:
        print(f"tessera simulate: {error}", file=err)
        return EXIT_USAGE
    if args.jobs < 1:
        print("tessera simulate: --jobs must be at least 1", file=err)
        return EXIT_USAGE
    if not 0 < args.target <= 10:
        print("tessera simulate: --target must be in (0, 10]", file=err)
        return EXIT_USAGE
    if args.burst < 1:
        print("tessera simulate: --burst must be at least 1", file=err)
        return EXIT_USAGE
    if args.pools < 1:
        print("tessera simulate: --pools must be at least 1", file=err)
        return EXIT_USAGE
    tenancy = None
    if args.tenancy_file is not None:
        try:
            text = args.tenancy_file.read_bytes()
            tenancy = parse_tenancy(text, source=str(args.tenancy_file))
        except OSError as error:
            print(f"tessera simulate: cannot read {args.tenancy_file}: {error}", file=err)
            return EXIT_USAGE
        except ConfigFileError as error:
            print(f"tessera simulate: {error}", file=err)
            return EXIT_USAGE
    if args.bound and not _can_import("scipy"):
        print(
            "tessera simulate: --bound needs scipy (HiGHS), which is not installed "
            "(pip install 'tessera[bound]'); nothing was run",
            file=err,
        )
        return EXIT_USAGE
    if args.plot is not None and not _can_plot():
        print(
            "tessera simulate: --plot needs matplotlib, which is not installed "
            "(pip install 'tessera[plot]'); nothing was run",
            file=err,
        )
        return EXIT_USAGE
    typical = typical_tasks(original)
    try:
        for policy in args.policy:
            build_profile(policy, typical_tasks=typical)
    except ProfileError as error:
        print(f"tessera simulate: {error}", file=err)
        return EXIT_USAGE
    jobs = [
        Job(
            policy,
            seed,
            tuple(nodes),
            tuple(original),
            typical,
            args.target,
            args.mix,
            tenancy,
            args.burst,
            args.pools,
        )
        for policy in args.policy
        for seed in args.seeds
    ]
    show = not args.no_progress and err.isatty()
    results = run_jobs(jobs, args.jobs, show)
    summary = report.summarize(results)
    summary["trace"] = source
    summary["nodes"] = len(nodes)
    summary["gpus"] = sum(n.gpus for n in nodes)
    summary["target"] = args.target
    summary["mix"] = args.mix
    summary["burst"] = args.burst
    summary["pools"] = args.pools
    summary["tenancy_file"] = str(args.tenancy_file) if args.tenancy_file else ""
    if args.bound:
        summary["bound"] = bounds(nodes, original, args.seeds, args.target, args.burst)
    if args.json:
        print(json.dumps(summary, indent=None, sort_keys=False))
    else:
        seeds = _seed_text(args.seeds)
        print(
            f"{source}: {len(nodes)} nodes, {summary['gpus']} GPUs, seeds {seeds}, "
            f"{args.mix} task mix"
            + (f", bursts of {args.burst}" if args.burst > 1 else "")
            + (f", {args.pools} node pools" if args.pools > 1 else "")
            + (f", tenancy {args.tenancy_file}" if args.tenancy_file else "")
        )
        print(report.table(summary))
    if args.plot is not None:
        try:
            _plot(results, args.policy, args.plot, source)
        except OSError as error:
            print(f"tessera simulate: cannot write {args.plot}: {error}", file=err)
            return EXIT_USAGE
    return 0


def _seed_text(seeds: Sequence[int]) -> str:
    if len(seeds) > 1 and list(seeds) == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}-{seeds[-1]}"
    return ",".join(str(s) for s in seeds)


def run_jobs(jobs: Sequence[Job], workers: int, show: bool) -> list[ReplayResult]:
    if workers == 1 or len(jobs) == 1:
        estimate = sum(len(j.original) * 1.35 for j in jobs)
        bar = Progress(sys.stderr, int(estimate), show)
        results = []
        for job in jobs:
            results.append(run_job(job, _advance(bar, f"{job.policy} seed {job.seed}")))
        bar.close()
        return results
    bar = Progress(sys.stderr, len(jobs), show)
    context = multiprocessing.get_context("spawn")
    with context.Pool(min(workers, len(jobs))) as pool:
        results = []
        for result in pool.imap(run_job, jobs):
            results.append(result)
            bar.advance(1, f"{result.policy} seed {result.seed}")
    bar.close()
    return results


def _advance(bar: Progress, label: str) -> Callable[[int], None]:
    start = bar.done

    def advance(done: int) -> None:
        bar.advance(start + done - bar.done, label)

    return advance


def bounds(
    nodes: Sequence[TraceNode],
    original: Sequence[TraceTask],
    seeds: Sequence[int],
    target: float,
    burst: int,
) -> dict[str, Any]:
    """The placement bound at 100 % arrived for each seed's task list (``sim/bound.py``)."""
    values: list[float] = []
    seconds = 0.0
    for seed in seeds:
        tasks = tuned_tasks(original, cluster_gpu_milli(nodes), seed=seed, target=target)
        found = placement_bound.unallocated_bound(nodes, tasks, burst=burst)
        if found is None:
            raise ValueError(f"seed {seed}: the workload never reaches 100 % arrived")
        values.append(found.unallocated_pct)
        seconds += found.seconds
    return {
        "unallocated_pct_at_100": report.stat(values),
        "per_seed_unallocated_pct_at_100": [round(v, 4) for v in values],
        "seeds": list(seeds),
        "solve_s": round(seconds, 3),
    }


def _can_plot() -> bool:
    return _can_import("matplotlib")


def _can_import(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def _plot(results: Sequence[ReplayResult], policies: Sequence[str], path: Path, title: str) -> None:
    matplotlib: Any = importlib.import_module("matplotlib")
    matplotlib.use("Agg")
    plt: Any = importlib.import_module("matplotlib.pyplot")

    figure, axes = plt.subplots(figsize=(7, 4.5))
    for policy in policies:
        points = [(x, y) for x, y in report.curve(results, policy) if x >= 50]
        axes.plot([x for x, _ in points], [y for _, y in points], label=policy)
    axes.set_xlabel("arrived workload (% of GPU capacity)")
    axes.set_ylabel("unallocated GPU (%)")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


COMMAND = Command(
    name="simulate",
    summary="replay a pod trace through the placement core and compare policies",
    description=(__doc__ or "").replace("``", ""),
    configure=configure,
    run=run,
)
