"""Dashboard at scale: API latency, record-to-page latency and page render time.

    .venv/bin/python benchmarks/dashboard.py [--nodes 100] [--gpus 8] [--requests 200]
        [--updates 30] [--loads 5] [--push-interval-s 0.25] [--screenshot PATH]

A real ``nats-server`` holds a synthetic cluster (``tests/dashboard/builders.py``: mixed models,
GPUs filled with whole-GPU and shared slices in every hand-off state, one unhealthy GPU, Pending
pods, placer statistics). The real ``tessera dashboard`` process watches it; Debian's headless
chromium (Selenium) shows the page. Measured, in one run:

* the pure core in this process: folding every KV value into the state, rendering
  ``/api/v1/cluster`` from it;
* ``GET /api/v1/cluster`` and ``GET /api/v1/pods/pending`` over HTTP, sequential;
* page load: navigation start to the first snapshot drawn, and the snapshot's own render time
  (DOM built, style and layout done);
* record to page: a new assignment record put in KV until a MutationObserver in the page sees its
  slice in the DOM (KV watch, reducer, push interval, SSE, render), and that update's render time;
* the dashboard process's resident memory.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from services.dashboard.core.state import (  # noqa: E402
    Event,
    FactsChanged,
    InventoryChanged,
    RecordChanged,
    State,
    StatsChanged,
    reduce,
)
from services.dashboard.core.views import ViewPolicy, cluster_view  # noqa: E402
from shared import codec, subjects  # noqa: E402
from shared.runtime.nats import NatsBus  # noqa: E402
from tests.dashboard.builders import (  # noqa: E402
    Cluster,
    record,
    share,
    synthetic_cluster,
    write_cluster,
)
from tests.dashboard.process import (  # noqa: E402
    browser_missing,
    chromium,
    dashboard_process,
    on_bus,
    wait_in_page,
)
from tests.harness.kv import put_record  # noqa: E402
from tests.harness.nats import NatsServer  # noqa: E402

WATCH_SLICES = """
window.__seen = {};
new MutationObserver(() => {
  for (const el of document.querySelectorAll('.slice[data-pod-uid^="bench-"]')) {
    const uid = el.dataset.podUid;
    if (!(uid in window.__seen)) window.__seen[uid] = Date.now();
  }
}).observe(document.getElementById('nodes'), {childList: true, subtree: true});
"""


def quantiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50": statistics.median(ordered),
        "p90": ordered[int(0.9 * (len(ordered) - 1))],
        "p99": ordered[int(0.99 * (len(ordered) - 1))],
        "max": ordered[-1],
    }


def core_figures(cluster: Cluster, rounds: int = 5) -> dict[str, float]:
    events: list[Event] = [
        *(InventoryChanged(node=i.node, inventory=i) for i in cluster.inventories),
        *(FactsChanged(node=f.node, facts=f) for f in cluster.facts),
        *(
            RecordChanged(key=subjects.assignment_key(r.node, r.pod_uid), record=r)
            for r in cluster.records
        ),
        *(StatsChanged(key=subjects.stats_key(s.placer_id), stats=s) for s in cluster.stats),
    ]
    fold, render = [], []
    for _ in range(rounds):
        started = time.perf_counter()
        state = State()
        for event in events:
            state = reduce(state, event)
        fold.append(time.perf_counter() - started)
        started = time.perf_counter()
        cluster_view(state, now=time.time(), policy=ViewPolicy())
        render.append(time.perf_counter() - started)
    return {
        "events": len(events),
        "fold_ms": 1000 * statistics.median(fold),
        "events_per_s": len(events) / statistics.median(fold),
        "render_ms": 1000 * statistics.median(render),
    }


def http_latency(url: str, requests: int) -> tuple[dict[str, float], int]:
    times, size = [], 0
    for _ in range(requests):
        started = time.perf_counter()
        with urllib.request.urlopen(url, timeout=30) as response:
            body = response.read()
        times.append(1000 * (time.perf_counter() - started))
        size = len(body)
    return quantiles(times), size


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--pending", type=int, default=50)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--updates", type=int, default=30)
    parser.add_argument("--loads", type=int, default=5)
    parser.add_argument(
        "--push-interval-s",
        default="0.25",
        help="the dashboard's --push-interval-s (0.25: its default, what an operator runs)",
    )
    parser.add_argument("--screenshot", type=Path, help="save the page here at the end")
    args = parser.parse_args()
    why = browser_missing()
    if why:
        print(f"benchmarks/dashboard.py: {why}", file=sys.stderr)
        return 2

    cluster = synthetic_cluster(args.nodes, args.gpus, pending=args.pending, now=time.time())
    slices = sum(len(c.gpus) for r in cluster.records for c in r.containers)
    print(
        f"{args.nodes} nodes x {args.gpus} GPUs, {len(cluster.records)} records "
        f"({slices} slices), {len(cluster.rejections)} Pending pods; "
        f"{platform.python_implementation()} {platform.python_version()}"
    )
    core = core_figures(cluster)
    results: dict[str, Any] = {"core": core}

    with NatsServer() as server:
        # KV values first; rejections once the dashboard listens (it does not replay the stream).
        on_bus(server.url, lambda bus: write_cluster(bus, replace(cluster, rejections=[])))
        with dashboard_process(server.url, "--push-interval-s", args.push_interval_s) as dashboard:

            async def reject(bus: NatsBus) -> None:
                for rejected in cluster.rejections:
                    await bus.js_publish(subjects.PLACEMENTS_REJECTED, codec.encode(rejected))

            on_bus(server.url, reject)
            api, api_bytes = http_latency(dashboard.url + "api/v1/cluster", args.requests)
            pending, pending_bytes = http_latency(
                dashboard.url + "api/v1/pods/pending", args.requests
            )
            results["api"] = {"cluster": api, "cluster_bytes": api_bytes}
            results["pending"] = {"pending": pending, "pending_bytes": pending_bytes}

            with chromium() as browser:
                loads, renders = [], []
                for _ in range(args.loads):
                    browser.get(dashboard.url)
                    wait_in_page(
                        browser, "window.tesseraDashboard && window.tesseraDashboard.ready"
                    )
                    perf = browser.execute_script("return window.tesseraDashboard.perf")
                    loads.append(perf["firstSnapshotAtMs"])
                    renders.append(perf["snapshotRenderMs"])
                shown = browser.execute_script(
                    "return document.querySelectorAll('#nodes .bar.mem .slice').length"
                )
                assert shown == slices, (shown, slices)
                browser.execute_script(WATCH_SLICES)
                latencies, update_renders = [], []
                free = [
                    (inv.node, g)
                    for inv in cluster.inventories
                    for g in inv.gpus
                    if g.health == "healthy"
                ]
                for i in range(args.updates):
                    node, gpu = free[(i * 37) % len(free)]
                    uid = f"bench-{i}"
                    value = record(node, uid, share(gpu.uuid, gpu.index, memory=512, cores=1))
                    put_at = time.time() * 1000

                    async def put(bus: NatsBus, value: Any = value) -> None:
                        await put_record(bus, value)

                    on_bus(server.url, put)
                    seen = wait_in_page(browser, f"window.__seen['{uid}']")
                    latencies.append(seen - put_at)
                    update_renders.append(
                        browser.execute_script("return window.tesseraDashboard.perf.lastRenderMs")
                    )
                results["browser"] = {
                    "load_to_drawn_ms": statistics.median(loads),
                    "snapshot_render_ms": statistics.median(renders),
                    "record_to_page_ms": quantiles(latencies),
                    "update_render_ms": statistics.median(update_renders),
                }
                if args.screenshot:
                    browser.get(dashboard.url)
                    wait_in_page(
                        browser, "window.tesseraDashboard && window.tesseraDashboard.ready"
                    )
                    args.screenshot.parent.mkdir(parents=True, exist_ok=True)
                    browser.save_screenshot(str(args.screenshot))
                    print(f"screenshot: {args.screenshot}")
            results["rss_mib"] = rss_mib(dashboard.process.pid)

    print(json.dumps(results, indent=2))
    b, c = results["browser"], results["core"]
    a, p, r = results["api"]["cluster"], results["pending"]["pending"], b["record_to_page_ms"]
    cluster_kib = results["api"]["cluster_bytes"] / 1024
    pending_kib = results["pending"]["pending_bytes"] / 1024
    rows = [
        (
            f"core: fold {c['events']} KV values into the state",
            f"{c['fold_ms']:.1f} ms ({c['events_per_s']:,.0f}/s)",
        ),
        ("core: render `/api/v1/cluster`", f"{c['render_ms']:.1f} ms"),
        (
            f"`GET /api/v1/cluster` ({cluster_kib:.0f} KiB) p50 / p99",
            f"{a['p50']:.1f} / {a['p99']:.1f} ms",
        ),
        (
            f"`GET /api/v1/pods/pending` ({pending_kib:.0f} KiB) p50 / p99",
            f"{p['p50']:.1f} / {p['p99']:.1f} ms",
        ),
        (
            f"page load to first snapshot drawn (median of {args.loads})",
            f"{b['load_to_drawn_ms']:.0f} ms",
        ),
        ("snapshot render (DOM + style + layout)", f"{b['snapshot_render_ms']:.0f} ms"),
        (
            f"record put in KV to its slice in the page, p50 / p90 / max ({args.updates})",
            f"{r['p50']:.0f} / {r['p90']:.0f} / {r['max']:.0f} ms",
        ),
        ("one-node update render", f"{b['update_render_ms']:.1f} ms"),
        ("dashboard process RSS", f"{results['rss_mib']:.0f} MiB"),
    ]
    print("\n| what | figure |\n|---|---|")
    for what, figure in rows:
        print(f"| {what} | {figure} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
