"""Pods created to Running through the whole system (``tessera up``'s LocalSystem).

Starts nats-server, the simulated cluster, one fake inventory and one device plugin process per
node, the binder and two placers; waits until everything is ready; creates ``--pods`` pods at once
(or ``--rate`` a second; one GPU share each: 4 GiB, 5 % of the SMs) and waits until every one is
Running. Prints the throughput (pods Running per second from the first create to the last
Running), p50/p99 per stage (created -> decided -> bound -> allocated -> Running), the independent
checks (mismatched containers, over-committed GPUs), and where the time goes: CPU seconds and
context switches per kind of process during the run, and the messages through NATS per Running
pod (in and out of the server, and per kind of client: nats-server's monitoring endpoints) beside
the binder's node-facts counts. With ``--idle-s``, first what the ready system costs while it
does nothing: CPU milliseconds per second per kind of process, and NATS messages per second.

``--api dra`` runs every node in DRA mode: each pod asks for the same slice through its own
ResourceClaim (from one ResourceClaimTemplate of class ``gpu.tessera.dev``), and the checks
compare each container's environment with its claim's allocation. ``--api both --pairs N`` runs
N pairs of systems, device-plugin mode and DRA mode alternated (the order swapped every pair), on
the same burst, and prints each run and the DRA / device-plugin ratios of each pair.

    .venv/bin/python benchmarks/e2e.py --nodes 100 --pods 1000 [--placers 2] [--pools 0]
        [--idle-s 20] [--no-burst-spread] [--rate 50] [--api device-plugin|dra|both --pairs 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tessera.devcluster.resources import RESOURCE_CLAIM_TEMPLATE
from tessera.up import dramix
from tessera.up import workload as w
from tessera.up.report import decided_slices
from tessera.up.spec import default_pools, in_dra_mode, plan_nodes
from tessera.up.system import LocalSystem, SystemOptions
from tests.harness.procstat import context_switches, cpu_seconds

CONTROL_PLANE = ("placer", "binder", "nats-server")


def by_kind(system: LocalSystem, measure: Callable[[int], float]) -> dict[str, float]:
    """``measure`` of every process, summed per kind of process."""
    used: dict[str, float] = {"tessera up (API double + kubelets)": measure(os.getpid())}
    for name, child in system.supervisor.children.items():
        if child.pid is None:
            continue
        kind = name.split("/")[0].rstrip("-0123456789")
        used[kind] = used.get(kind, 0.0) + measure(child.pid)
    return used


def cpu_by_kind(system: LocalSystem) -> dict[str, float]:
    return by_kind(system, cpu_seconds)


def metric_sum(system: LocalSystem, kind: str, metric: str) -> float:
    """``metric`` summed over the processes of ``kind`` (from their /metrics pages)."""
    total = 0.0
    for name in system.supervisor.children:
        port = system.supervisor.http_port(name) if name.startswith(kind) else None
        if port is None:
            continue
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as page:
            text = page.read().decode()
        total += sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(metric) and not line.startswith("#")
        )
    return total


def nats_traffic(system: LocalSystem) -> dict[str, float]:
    """Messages and bytes in and out of every NATS server (its /varz), and the messages each
    kind of client sent (``sent by ...``) and was sent (``to ...``; its /connz)."""
    total = {"in_msgs": 0.0, "out_msgs": 0.0, "in_bytes": 0.0, "out_bytes": 0.0}
    for name in system.nats_names():
        url = system.nats_monitoring_url(name)
        if url is None:
            continue
        with urllib.request.urlopen(f"{url}/varz", timeout=5) as page:
            varz = json.loads(page.read())
        for key in total:
            total[key] += float(varz[key])
        with urllib.request.urlopen(f"{url}/connz?limit=4096", timeout=5) as page:
            connections = json.loads(page.read())["connections"]
        for connection in connections:
            name = (connection.get("name") or "unnamed").removeprefix("tessera-")
            kind = name.split("-")[0].split(".")[0].split("/")[0]
            # Messages a client sends are the server's "in", those it receives its "out".
            for key, direction in (("in_msgs", "sent by"), ("out_msgs", "to")):
                label = f"{direction} {kind}"
                total[label] = total.get(label, 0.0) + float(connection[key])
    return total


def _read_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as page:
        return json.loads(page.read())


def nats_by_subscription(system: LocalSystem) -> dict[str, float]:
    """Where the messages out of NATS went: per kind of client and subscription (a JetStream
    consumer's stream and filter named for its deliver subject; replies to requests, a pull
    consumer's batches among them, as ``_INBOX``), and how many messages each stream stored."""
    counts: dict[str, float] = {}
    for name in system.nats_names():
        url = system.nats_monitoring_url(name)
        if url is None:
            continue
        jsz = _read_json(f"{url}/jsz?accounts=true&streams=true&consumers=true&config=true")
        consumers: dict[str, str] = {}
        for account in jsz.get("account_details") or []:
            for stream in account.get("stream_detail") or []:
                label = f"stored {stream['name']}"
                counts[label] = counts.get(label, 0.0) + float(stream["state"]["last_seq"])
                for consumer in stream.get("consumer_detail") or []:
                    config = consumer.get("config") or {}
                    filters = config.get("filter_subjects") or [config.get("filter_subject", ">")]
                    where = f"{stream['name']} {','.join(filters)}"
                    if config.get("deliver_subject"):
                        consumers[config["deliver_subject"]] = where
                    else:  # pulled: its batches are replies to the puller's requests
                        label = f"pulled {where}"
                        delivered = float(consumer["delivered"]["consumer_seq"])
                        counts[label] = counts.get(label, 0.0) + delivered
        for connection in _read_json(f"{url}/connz?limit=4096&subs=detail")["connections"]:
            kind = (connection.get("name") or "unnamed").removeprefix("tessera-")
            kind = kind.split("-")[0].split(".")[0].split("/")[0]
            for sub in connection.get("subscriptions_list_detail") or []:
                subject = sub["subject"]
                where = consumers.get(subject) or (
                    "_INBOX" if subject.startswith("_INBOX") else subject
                )
                label = f"to {kind}: {where}"
                counts[label] = counts.get(label, 0.0) + float(sub.get("msgs", 0))
    return counts


COUNTED = {
    "gate waits timed out (binder)": (
        "binder",
        'tessera_binder_gate_waits_total{outcome="timed_out"}',
    ),
    "gate waits passed (binder)": ("binder", 'tessera_binder_gate_waits_total{outcome="passed"}'),
    "node facts published (binder)": ("binder", "tessera_binder_node_facts_published_total"),
    "node facts held back (binder)": ("binder", "tessera_binder_node_facts_deferred_total"),
}


def packing(pods: list[dict[str, Any]], gpu_memory_mib: int) -> dict[str, float]:
    """Where the Running pods ended up: nodes and GPUs holding at least one, against the fewest
    GPUs of ``gpu_memory_mib`` their memory could fit on (what a burst's spreading costs in
    packing)."""
    nodes: set[str] = set()
    gpus: set[str] = set()
    memory = 0
    for pod in pods:
        if (pod.get("status") or {}).get("phase") != "Running":
            continue
        nodes.add((pod.get("spec") or {}).get("nodeName") or "")
        decided = decided_slices(pod)
        for slices in (decided[0] if decided else {}).values():
            for share in slices:
                gpus.add(share.uuid)
                memory += share.memory_mib
    return {
        "nodes_used": len(nodes),
        "gpus_used": len(gpus),
        "fewest_gpus_by_memory": -(-memory // gpu_memory_mib),
    }


async def idle_cost(system: LocalSystem, seconds: float) -> dict[str, dict[str, float]]:
    """What the ready system costs over ``seconds`` of doing nothing: CPU per kind of process
    and NATS messages, each per second."""
    await asyncio.sleep(2.0)  # the last start-up writes settle
    cpu_before, traffic_before = cpu_by_kind(system), nats_traffic(system)
    started = time.monotonic()
    await asyncio.sleep(seconds)
    took = time.monotonic() - started
    cpu, traffic = cpu_by_kind(system), nats_traffic(system)
    return {
        "idle_cpu_ms_per_s": {
            k: round(1000 * (cpu[k] - cpu_before.get(k, 0.0)) / took, 1) for k in cpu
        },
        "idle_nats_msgs_per_s": {
            k: round((traffic[k] - traffic_before.get(k, 0.0)) / took, 1)
            for k in traffic
            if k.endswith("msgs") or k.startswith(("sent by", "to "))
        },
    }


def burst(count: int, *, dra: bool) -> list[dict[str, Any]]:
    """The pods of the burst (one GPU share each: 4 GiB, 5 % of the SMs); with ``dra`` the
    template their claims are made from comes first."""
    if dra:
        return dramix.slice_burst(
            count, gpu_memory="4Gi", compute="5", cpu="100m", memory="128Mi", prefix="bench"
        )
    shape = w.container(gpu=1, memory_mib=4096, cores=5, cpu="100m", memory="128Mi")
    return [w.pod(f"bench-{i}", [shape]) for i in range(count)]


async def measure(args: argparse.Namespace, *, dra: bool) -> dict[str, Any]:
    run_dir = Path(tempfile.mkdtemp(prefix="tessera-e2e-bench-"))
    plans = plan_nodes(args.gpus, args.nodes)
    if dra:
        plans = [in_dra_mode(plan) for plan in plans]
    pools = args.pools or default_pools(args.placers, len(plans))
    options = SystemOptions(
        nodes=plans,
        run_dir=run_dir,
        placers=args.placers,
        binders=1,
        dashboard=False,
        webhook=False,
        nodes_per_process=args.nodes_per_process,
        ready_timeout_s=900.0,
        nats_monitoring=True,
        placer_args=(
            *(("--pools", str(pools)) if pools > 1 else ()),
            *(() if args.burst_spread else ("--no-burst-spread",)),
        ),
    )
    started = time.monotonic()
    async with LocalSystem(options) as system:
        ready_s = time.monotonic() - started
        idle = await idle_cost(system, args.idle_s) if args.idle_s > 0 else {}
        before = cpu_by_kind(system)
        switches_before = by_kind(system, context_switches)
        counted_before = {k: metric_sum(system, *where) for k, where in COUNTED.items()}
        requests_before = dict(system.cluster.api.requests)
        traffic_before = nats_traffic(system)
        subs_before = nats_by_subscription(system)
        pods = burst(args.pods, dra=dra)
        for template in pods[:1] if dra else ():  # before the clock starts
            system.cluster.api.create(RESOURCE_CLAIM_TEMPLATE, template, "default")
        t0 = time.monotonic()
        for i, pod in enumerate(pods[1:] if dra else pods):
            if args.rate > 0:  # paced: pod i is created i / rate seconds in
                await asyncio.sleep(max(0.0, t0 + i / args.rate - time.monotonic()))
            system.cluster.create_pod(pod)
        created_s = time.monotonic() - t0
        while True:
            pods = system.cluster.pods()
            running = sum(1 for p in pods if (p.get("status") or {}).get("phase") == "Running")
            failed = sum(1 for p in pods if (p.get("status") or {}).get("phase") == "Failed")
            if running + failed >= args.pods or time.monotonic() - t0 > args.timeout:
                break
            await asyncio.sleep(0.05)
        elapsed = time.monotonic() - t0
        after = cpu_by_kind(system)
        switches = by_kind(system, context_switches)
        counted = {
            k: metric_sum(system, *where) - counted_before[k] for k, where in COUNTED.items()
        }
        traffic = nats_traffic(system)
        per_pod = {
            f"nats {k} per pod": round(
                (traffic[k] - traffic_before.get(k, 0.0)) / max(running, 1), 1
            )
            for k in traffic
        }
        subs = nats_by_subscription(system)
        by_subscription = {
            k: round((n - subs_before.get(k, 0.0)) / max(running, 1), 2)
            for k, n in sorted(subs.items())
            if n - subs_before.get(k, 0.0) >= 0.05 * max(running, 1)
        }
        summary = system.summary()
        result = {
            "api": "dra" if dra else "device-plugin",
            "nodes": args.nodes,
            "gpus_per_node": args.gpus,
            "pods": args.pods,
            "rate": args.rate or "burst",
            "start_to_ready_s": round(ready_s, 1),
            **idle,
            "create_loop_s": round(created_s, 2),
            "created_to_all_running_s": round(elapsed, 2),
            "pods_running_per_s": round(running / elapsed, 1),
            "pods_by_phase": summary.pods_by_phase,
            "latency_ms": summary.latency_ms,
            "packing": packing(pods, max(g.memory_mib for plan in plans for g in plan.gpus)),
            "mismatched_containers": summary.mismatched_containers,
            "overcommitted_gpus": summary.overcommitted_gpus,
            "claims": summary.claims,
            "counted_during_run": counted | per_pod,
            # Consumers made during the run (a watch started again) count from 0, and
            # a pull consumer's batches are also among the puller's ``_INBOX`` replies.
            "nats_per_pod_by_subscription": by_subscription,
            # What the API server would serve, per pod: the binder's, the kubelets' and the
            # benchmark's own requests (it reads pods from the store, not over HTTP).
            "api_requests_per_pod": {
                f"{verb} {resource}": round(
                    (n - requests_before.get((verb, resource), 0)) / max(running, 1), 2
                )
                for (verb, resource), n in sorted(system.cluster.api.requests.items())
                if n > requests_before.get((verb, resource), 0)
            },
            "cpu_s_during_run": {k: round(after.get(k, 0) - before.get(k, 0), 1) for k in after},
            # Each costs CPU beyond the work on a machine with more processes than cores.
            "context_switches_per_pod": {
                k: round((switches[k] - switches_before.get(k, 0)) / max(running, 1), 1)
                for k in switches
            },
            # docs/design.md §7: placer + binder + nats-server, per pod that ran.
            "control_plane_cpu_ms_per_pod": round(
                1000
                * sum(after.get(k, 0) - before.get(k, 0) for k in CONTROL_PLANE)
                / max(running, 1),
                2,
            ),
        }
        return result


def ratios(dra: dict[str, Any], plugin: dict[str, Any]) -> dict[str, float]:
    """DRA mode against device-plugin mode, one pair: latency (lower is better) and pods/s."""
    found = {"pods_running_per_s": dra["pods_running_per_s"] / plugin["pods_running_per_s"]}
    for stage in ("created_to_running", "created_to_decided", "decided_to_bound"):
        for q in ("p50", "p99"):
            mine = dra["latency_ms"].get(stage, {}).get(q)
            theirs = plugin["latency_ms"].get(stage, {}).get(q)
            if mine is not None and theirs:
                found[f"{stage} {q}"] = mine / theirs
    return {k: round(v, 2) for k, v in found.items()}


def brief(result: dict[str, Any]) -> dict[str, Any]:
    """What a side-by-side run prints of each system."""
    running = result["latency_ms"].get("created_to_running", {})
    return {
        "api": result["api"],
        "pods_by_phase": result["pods_by_phase"],
        "created_to_running_p50_ms": running.get("p50"),
        "created_to_running_p99_ms": running.get("p99"),
        "pods_running_per_s": result["pods_running_per_s"],
        "mismatched_containers": result["mismatched_containers"],
        "overcommitted_gpus": result["overcommitted_gpus"],
        "claims": result["claims"],
        "control_plane_cpu_ms_per_pod": result["control_plane_cpu_ms_per_pod"],
        "latency_ms": result["latency_ms"],
    }


async def main(args: argparse.Namespace) -> None:
    if args.api != "both":
        print(json.dumps(await measure(args, dra=args.api == "dra"), indent=2))
        return
    runs: list[dict[str, Any]] = []
    pairs: list[dict[str, float]] = []
    for pair in range(args.pairs):
        order = (False, True) if pair % 2 == 0 else (True, False)
        done = {dra: await measure(args, dra=dra) for dra in order}
        runs.extend(brief(done[dra]) for dra in order)
        pairs.append(ratios(done[True], done[False]))
        print(json.dumps({"pair": pair + 1, "dra_over_device_plugin": pairs[-1]}), flush=True)
    print(json.dumps({"runs": runs, "dra_over_device_plugin": pairs}, indent=2))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--gpus", default="8xA100-80GB")
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--placers", type=int, default=2)
    parser.add_argument(
        "--pools",
        type=int,
        default=0,
        help="the placers' --pools (0, as tessera up: one per placer from 32 nodes each; 1: "
        "no node pools)",
    )
    parser.add_argument(
        "--burst-spread",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the placers' --burst-spread (--no-burst-spread: packed by the profile alone)",
    )
    parser.add_argument(
        "--idle-s",
        type=float,
        default=0.0,
        help="first measure the ready system this many seconds while it does nothing",
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=0.0,
        help="create the pods at this many a second (0: all at once, a burst); pods/s is "
        "then at most this, and the CPU per pod is what a steady arrival costs",
    )
    parser.add_argument(
        "--api",
        choices=("device-plugin", "dra", "both"),
        default="device-plugin",
        help="how the nodes offer their GPUs; both: --pairs runs of each, alternated",
    )
    parser.add_argument("--pairs", type=int, default=2, help="pairs of runs with --api both (2)")
    parser.add_argument(
        "--nodes-per-process",
        type=int,
        default=10,
        help="GPU nodes whose inventory and device plugin share a process (1: one each)",
    )
    asyncio.run(main(parser.parse_args()))
