"""``tessera up``: the whole system on one machine, a workload through it, and its summary.

Starts nats-server, the simulated cluster (the Kubernetes API test double and a simulated kubelet
per node), one real ``tessera inventory --backend fake`` and one ``tessera deviceplugin`` per GPU
node, the binder(s), two placers, the dashboard and the admission webhook
(:class:`~tessera.up.system.LocalSystem`);
submits the workload; shows progress (one updating line on a terminal, plain lines otherwise, on
stderr); and when every pod is settled (Running, Failed with the kubelet's reason, or Pending with
the placer's reasons, and nothing moved for a moment) prints the summary on stdout (``--json``:
one JSON object). Then it stops everything, or with ``--keep`` prints how to reach NATS, the API
(a kubeconfig for kubectl), each service's HTTP port and the dashboard, and runs until Ctrl-C.

Exit codes: 0 done; 1 a container was mismatched, a GPU over-committed, or (``--exit-when-done``)
the time limit passed before every pod settled; 2 a usage error; 3 the system did not start.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final, TextIO

from shared.dra.claims import NOT_CREATED
from shared.runtime.command import Command
from shared.runtime.tasks import cancel_and_wait, finish
from tessera.devcluster.resources import RESOURCE_CLAIM, RESOURCE_CLAIM_TEMPLATE, ApiError
from tessera.up import dramix, drareport, workload
from tessera.up import spec as specs
from tessera.up.processes import StartError
from tessera.up.report import STAGES, Summary
from tessera.up.system import LocalSystem, Say, SystemOptions

EXIT_OK: Final = 0
EXIT_PROBLEM: Final = 1
EXIT_USAGE: Final = 2
EXIT_START: Final = 3
DEFAULT_TRACE: Final = "../shared/data/alibaba-gpu-v2023/csv/openb_pod_list_default.csv"
QUIET_S: Final = 2.0
"""A run is settled once every pod is and nothing moved for this long."""


def configure(parser: argparse.ArgumentParser) -> None:
    cluster = parser.add_argument_group("cluster")
    cluster.add_argument(
        "--nodes",
        type=int,
        default=None,
        help=f"number of simulated nodes (default {specs.DEFAULT_NODES}, or one per named --gpus "
        "entry)",
    )
    cluster.add_argument(
        "--gpus",
        default=None,
        help="node entries dealt to the nodes in turn, comma-separated: COUNTxMODEL[-MEMORY] "
        "('8xA100-80GB', '4xT4'), several models joined with '+', 'cpu' for a node without "
        "GPUs, options after ':' (mode=memory-units, isolation=mps|hami-core, cpu=32, "
        "memory=256Gi); NAME=ENTRY names each node instead "
        f"(default {specs.DEFAULT_GPUS}; with --trace and neither --nodes nor --gpus: nodes "
        "sampled from the trace's node list until they hold the sample's GPU demand)",
    )
    cluster.add_argument("--placers", type=int, default=2, help="placer replicas (2)")
    cluster.add_argument(
        "--pools",
        type=int,
        default=0,
        help="the placers' --pools: node pools shared out among them, each replica deciding on "
        f"its own pools' nodes first (0, the default: one per placer once each pool gets "
        f"{specs.POOL_MIN_NODES} nodes, else none; 1: none)",
    )
    cluster.add_argument(
        "--binders", type=int, default=1, help="binder replicas, leader election on (1)"
    )
    cluster.add_argument("--tenancy-file", default="", help="the placers' --tenancy-file")
    cluster.add_argument(
        "--profile", default="", help="the placers' --profile (default: their default)"
    )
    cluster.add_argument("--no-dashboard", action="store_true", help="do not start the dashboard")
    cluster.add_argument(
        "--dra",
        action="store_true",
        help="every GPU node in DRA mode (as api=dra in --gpus): ResourceSlices, claims, the "
        "DRA node plugin",
    )
    cluster.add_argument(
        "--no-webhook",
        action="store_true",
        help="do not start the admission webhook (pods created with kubectl are then not "
        "defaulted or checked at create time)",
    )
    cluster.add_argument(
        "--nats-servers",
        type=int,
        choices=(1, 3),
        default=1,
        help="1, or 3 for a JetStream cluster with three replicas of every stream and bucket (1)",
    )
    load = parser.add_argument_group("workload (default: the built-in mix)")
    source = load.add_mutually_exclusive_group()
    source.add_argument(
        "--workload",
        type=Path,
        help="manifests, YAML or JSON: pods, and the ResourceClaims and ResourceClaimTemplates "
        "they name (created first)",
    )
    source.add_argument(
        "--trace",
        nargs="?",
        const=DEFAULT_TRACE,
        help=f"sample --pods tasks of an Alibaba openb pod CSV (default file {DEFAULT_TRACE})",
    )
    load.add_argument(
        "--pods",
        type=int,
        default=40,
        help="pods of the built-in mix (with --dra: asking through claims, a template per shape) "
        "or the trace sample (40)",
    )
    load.add_argument("--seed", type=int, default=42, help="trace sample seed (42)")
    run = parser.add_argument_group("run")
    run.add_argument(
        "--exit-when-done",
        action="store_true",
        help="for scripts and CI: exit as soon as every pod is settled, non-zero when the time "
        "limit passes first or the summary finds a problem",
    )
    run.add_argument(
        "--json", action="store_true", help="print the summary as one JSON object on stdout"
    )
    run.add_argument(
        "--keep",
        action="store_true",
        help="after the summary leave everything running, print how to reach it, stop on Ctrl-C",
    )
    run.add_argument(
        "--timeout", type=float, default=300.0, help="seconds for the pods to settle (300)"
    )
    run.add_argument(
        "--run-dir", type=Path, help="where logs, the kubeconfig and NATS's store go (a temp dir)"
    )
    run.add_argument("--log-level", default="info", help="services' log level (info)")
    run.add_argument(
        "--no-nats-permissions",
        action="store_true",
        help="let every process connect to NATS anonymously with every right, instead of one "
        "identity per service and per node with subject permissions (the default)",
    )


def nodes_and_pods(args: argparse.Namespace) -> tuple[list[specs.NodePlan], list[dict[str, Any]]]:
    """The nodes to simulate and what to submit (pods, and with DRA their claims and
    templates), from the command line."""
    if args.trace is not None:
        if getattr(args, "dra", False):
            raise workload.WorkloadError(
                "--trace asks for GPUs as device-plugin resources; with --dra use the built-in "
                "mix or --workload"
            )
        path = Path(args.trace)
        sample = workload.trace_sample(path, args.pods, seed=args.seed)
        if args.nodes is None and args.gpus is None:
            nodes = workload.trace_nodes(path, sample, seed=args.seed)
        else:
            nodes = specs.plan_nodes(args.gpus or specs.DEFAULT_GPUS, args.nodes)
        return nodes, workload.trace_pods(sample)
    nodes = specs.plan_nodes(args.gpus or specs.DEFAULT_GPUS, args.nodes)
    dra = getattr(args, "dra", False)
    if dra:
        nodes = [specs.in_dra_mode(n) for n in nodes]
    if args.workload is not None:
        return nodes, workload.from_file(args.workload)
    return nodes, dramix.builtin_dra(args.pods) if dra else workload.builtin(args.pods)


class Progress:
    """Pods Pending / bound / Running / Failed while the run goes on, on stderr."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.last = ""
        self.last_at = 0.0

    def say(self, text: str) -> None:
        self.clear()
        print(text, file=self.stream, flush=True)

    def show(self, elapsed: float, counts: dict[str, int]) -> None:
        line = (
            f"{elapsed:6.1f} s  pods {sum(counts.values())}: {counts['pending']} pending, "
            f"{counts['bound']} bound, {counts['running']} running, {counts['failed']} failed"
        )
        if self.tty:
            self.stream.write("\r" + line.ljust(len(self.last)))
            self.stream.flush()
            self.last = line
        elif line != self.last and time.monotonic() - self.last_at >= 1.0:
            print(line, file=self.stream, flush=True)
            self.last, self.last_at = line, time.monotonic()

    def clear(self) -> None:
        if self.tty and self.last:
            self.stream.write("\r" + " " * len(self.last) + "\r")
            self.stream.flush()
            self.last = ""


def pod_state(pod: dict[str, Any]) -> tuple[str, bool]:
    """(pending | bound | running | failed, settled): a Pending pod is settled once it is
    explained, and not by a claim yet to be made."""
    status = pod.get("status") or {}
    phase = status.get("phase")
    if phase == "Running":
        return "running", True
    if phase in ("Failed", "Succeeded"):
        return "failed", True
    if (pod.get("spec") or {}).get("nodeName"):
        return "bound", False
    messages = [
        str(c["message"])
        for c in status.get("conditions") or []
        if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("message")
    ]
    # Waiting for the claim controller, or for the binder to read the claims it made.
    waiting = not drareport.claims_created(pod) or any(NOT_CREATED in m for m in messages)
    return "pending", bool(messages) and not waiting


async def wait_settled(
    system: LocalSystem,
    *,
    timeout: float,
    progress: Progress | None,
    stop: asyncio.Event,
) -> bool:
    """Until every pod is settled and nothing moved for :data:`QUIET_S`; False on time out."""
    started = time.monotonic()
    deadline = started + timeout
    fingerprint: tuple[Any, ...] = ()
    quiet_since = time.monotonic()
    while not stop.is_set():
        pods = system.cluster.pods()
        counts = {"pending": 0, "bound": 0, "running": 0, "failed": 0}
        settled = True
        states = []
        for pod in pods:
            state, done = pod_state(pod)
            counts[state] += 1
            settled = settled and done
            states.append((pod["metadata"]["uid"], pod["metadata"]["resourceVersion"]))
        if progress is not None:
            progress.show(time.monotonic() - started, counts)
        current = tuple(states)
        if current != fingerprint:
            fingerprint, quiet_since = current, time.monotonic()
        elif settled and time.monotonic() - quiet_since >= QUIET_S:
            return True
        if time.monotonic() > deadline:
            return False
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(0.25):
                await stop.wait()
    return False


def submit(system: LocalSystem, objects: list[dict[str, Any]], *, say: Say) -> int:
    """Create ``objects`` through the API, a pod's claims and templates before it; how many
    objects the API refused (each said)."""
    refused = 0
    for obj in workload.in_create_order(objects):
        kind = obj.get("kind", "Pod")
        try:
            if kind == "Pod":
                system.cluster.create_pod(obj)
            else:
                resource = RESOURCE_CLAIM if kind == "ResourceClaim" else RESOURCE_CLAIM_TEMPLATE
                system.cluster.api.create(resource, obj)
        except ApiError as error:
            refused += 1
            say(f"the API refused a {kind}: {error.message}")
    return refused


def render(summary: Summary, out: TextIO) -> None:
    """The summary for people."""
    phases = ", ".join(f"{phase} {count}" for phase, count in summary.pods_by_phase.items())
    share = summary.gpu_share_allocated
    print(f"\nSummary: {summary.pods} pods in {summary.wall_s:.1f} s", file=out)
    print(f"  pods by phase:         {phases or 'none'}", file=out)
    if share.get("gpus"):
        print(
            f"  GPU share allocated:   {share['memory_pct']:.1f} % of GPU memory, "
            f"{share['cores_pct']:.1f} % of SMs; {share['gpus_in_use']:.0f} of "
            f"{share['gpus']:.0f} GPUs in use",
            file=out,
        )
    print("  latency (ms)                 p50      p99      max     pods", file=out)
    for stage in STAGES:
        row = summary.latency_ms.get(stage)
        label = stage.replace("_to_", " -> ").replace("_", " ")
        if row:
            print(
                f"    {label:<24}{row['p50']:>8.1f} {row['p99']:>8.1f} {row['max']:>8.1f} "
                f"{row['n']:>8.0f}",
                file=out,
            )
    print(f"  mismatched containers: {summary.mismatched_containers}", file=out)
    for line in summary.mismatches[:10]:
        print(f"    {line}", file=out)
    if summary.claims:
        claims = summary.claims
        print(
            f"  ResourceClaims:        {claims['total']}: {claims['allocated']} allocated "
            f"({claims['reserved']} reserved), {claims['pending']} pending",
            file=out,
        )
    print(f"  over-committed GPUs:   {summary.overcommitted_gpus}", file=out)
    for line in summary.overcommits[:10]:
        print(f"    {line}", file=out)
    for entry in summary.pending[:10]:
        print(f"  Pending {entry['pod']}: {entry['reason'] or '(no reason yet)'}", file=out)
    for entry in summary.failed[:10]:
        print(f"  Failed {entry['pod']}: {entry['reason']}: {entry['message']}", file=out)
    if not summary.settled:
        print("  NOT SETTLED: the time limit passed before every pod was settled", file=out)


def render_endpoints(endpoints: dict[str, Any], out: TextIO) -> None:
    print("\nEverything keeps running (Ctrl-C stops it all):", file=out)
    print(f"  NATS:        {endpoints['nats_url']}", file=out)
    if endpoints["nats_user"]:
        print(
            f"               as {endpoints['nats_user']}, password in "
            f"{endpoints['nats_password_file']}",
            file=out,
        )
    print(f"  API:         {endpoints['api_url']}", file=out)
    print(f"  kubectl:     KUBECONFIG={endpoints['kubeconfig']} kubectl get pods -o wide", file=out)
    if endpoints["dashboard_url"]:
        print(f"  dashboard:   {endpoints['dashboard_url']}", file=out)
    if endpoints["webhook_url"]:
        print(f"  webhook:     {endpoints['webhook_url']} (mutate, validate)", file=out)
    print("  HTTP ports (/healthz, /readyz, /metrics):", file=out)
    for name, port in sorted(endpoints["http_ports"].items()):
        print(f"    {name:<28} http://127.0.0.1:{port}/", file=out)
    print(f"  logs:        {endpoints['logs']}", file=out)


async def run_up(args: argparse.Namespace) -> int:
    try:
        plans, pods = nodes_and_pods(args)
    except (specs.SpecError, workload.WorkloadError) as error:
        print(f"tessera up: {error}", file=sys.stderr)
        return EXIT_USAGE
    if args.placers < 1 or args.binders < 1 or args.pools < 0:
        print(
            "tessera up: --placers and --binders must be at least 1, --pools at least 0",
            file=sys.stderr,
        )
        return EXIT_USAGE
    pools = args.pools or specs.default_pools(args.placers, len(plans))
    run_dir: Path = args.run_dir
    tenancy_file: str = args.tenancy_file
    progress = Progress(sys.stderr)
    _log_to(run_dir / "logs" / "cluster.log", args.log_level)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(signum, stop.set)
    system = LocalSystem(
        SystemOptions(
            nodes=plans,
            run_dir=run_dir,
            placers=args.placers,
            binders=args.binders,
            nats_servers=args.nats_servers,
            dashboard=not args.no_dashboard,
            webhook=not args.no_webhook,
            tenancy_file=tenancy_file,
            placer_args=(
                *(("--profile", args.profile) if args.profile else ()),
                *(("--pools", str(pools)) if pools > 1 else ()),
            ),
            log_level=args.log_level,
            nats_permissions=not args.no_nats_permissions,
        ),
        say=progress.say,
    )
    for plan in plans:
        progress.say(f"  {plan.name}: {plan.describe()}")
    try:
        starting = asyncio.create_task(system.start())
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait({starting, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():
            await cancel_and_wait(starting)
            progress.say("interrupted; stopping everything")
            return 130
        stopped.cancel()
        try:
            starting.result()
        except StartError as error:
            progress.say(f"tessera up: the system did not start: {error}")
            return EXIT_START
        endpoints = system.endpoints()
        if endpoints["dashboard_url"]:
            progress.say(f"dashboard {endpoints['dashboard_url']}")
        progress.say(f"kubectl: KUBECONFIG={system.kubeconfig} kubectl get pods -o wide")
        rejected = submit(system, pods, say=progress.say)
        submitted = sum(1 for obj in pods if obj.get("kind", "Pod") == "Pod")
        progress.say(f"submitted {submitted - rejected} pods")
        settled = await wait_settled(system, timeout=args.timeout, progress=progress, stop=stop)
        progress.clear()
        summary = system.summary()
        summary.settled = settled
        if args.json:
            out = summary.to_json()
            out["run_dir"] = str(run_dir)
            out["api_refused"] = rejected
            if args.keep:
                out["endpoints"] = system.endpoints()
            print(json.dumps(out, indent=None if not sys.stdout.isatty() else 2), flush=True)
        else:
            render(summary, sys.stdout)
            print(f"  logs: {system.supervisor.logs}", flush=True)
        problem = summary.mismatched_containers or summary.overcommitted_gpus
        if args.keep and not stop.is_set():
            render_endpoints(system.endpoints(), sys.stderr if args.json else sys.stdout)
            await stop.wait()
        if stop.is_set() and not args.keep:
            return 130
        if problem or (args.exit_when_done and not settled):
            return EXIT_PROBLEM
        return EXIT_OK
    finally:
        progress.say("stopping every process")
        await finish(system.stop())
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.remove_signal_handler(signum)


def _log_to(path: Path, level: str) -> None:
    """The in-process cluster's log lines (kubelets, API double) go to a file, not the terminal."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for existing in list(root.handlers):
        root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel(level.upper())


def run(args: argparse.Namespace) -> int:
    args.run_dir = (args.run_dir or Path(tempfile.mkdtemp(prefix="tessera-up-"))).absolute()
    args.run_dir.mkdir(parents=True, exist_ok=True)
    args.tenancy_file = str(Path(args.tenancy_file).absolute()) if args.tenancy_file else ""
    return asyncio.run(run_up(args))


COMMAND = Command(
    name="up",
    summary="run the whole system on this machine against a simulated cluster",
    description="Start nats-server, a simulated Kubernetes cluster (API and kubelets), a fake "
    "inventory and a device plugin per GPU node, the binder, two placers, the dashboard and the "
    "admission webhook (registered with the API: kubectl's creates go through it) as real "
    "processes; submit a workload; show its progress and print a summary (pods by phase, "
    "GPU share allocated, latency per stage, containers whose GPU environment does not match "
    "their decided slices, over-committed GPUs). Service logs go to files in the run "
    "directory. Exit codes: 0 done, 1 a problem found (or not settled with --exit-when-done), "
    "2 usage error, 3 the system did not start.",
    configure=configure,
    run=run,
)
