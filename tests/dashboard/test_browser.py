"""The page in a real headless browser (Debian's chromium through Selenium) against the real
``tessera dashboard`` process fed from a real nats-server.

Screenshots are test artifacts: in the test's tmp dir, and in ``$TESSERA_ARTIFACTS`` when set.
Render times are printed (``-s`` shows them); speed is measured by ``benchmarks/dashboard.py``.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from shared import codec, subjects
from shared.messages.placement import PodInvalid
from shared.messages.pods import PodPending
from shared.messages.stats import TenantUsage
from shared.runtime.nats import NatsBus
from tests.dashboard.builders import (
    record,
    rejection,
    share,
    synthetic_cluster,
    write_cluster,
)
from tests.dashboard.process import (
    SLICES_IN_PAGE,
    chromium,
    dashboard_process,
    on_bus,
    require_browser,
    wait_in_page,
)
from tests.harness.kv import put_record
from tests.harness.nats import NatsServer


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    require_browser()
    with chromium() as driver:
        yield driver


def save_artifact(driver: Any, tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    assert driver.save_screenshot(str(path))
    assert path.stat().st_size > 10_000
    artifacts = os.environ.get("TESSERA_ARTIFACTS")
    if artifacts:
        Path(artifacts).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(artifacts) / name)
    return path


def expected_slices(records: list[Any]) -> list[list[Any]]:
    return sorted(
        [r.node, s.uuid, r.pod_uid, r.namespace, s.memory_mib, s.cores, r.state]
        for r in records
        if r.state != "released"
        for c in r.containers
        for s in c.gpus
    )


def test_the_page_shows_the_records_and_follows_changes_live(
    browser: Any, nats_server: NatsServer, tmp_path: Path
) -> None:
    cluster = synthetic_cluster(6, 4, pending=4, now=time.time())

    async def seed(bus: NatsBus) -> None:
        await write_cluster(bus, cluster)

    on_bus(nats_server.url, seed)
    with dashboard_process(nats_server.url, "--push-interval-s", "0.1") as dashboard:
        browser.get(dashboard.url)
        wait_in_page(browser, "window.tesseraDashboard && window.tesseraDashboard.ready")
        render_ms = browser.execute_script("return window.tesseraDashboard.perf.snapshotRenderMs")
        print(f"\n6 nodes x 4 GPUs: first render {render_ms:.1f} ms")

        nodes = browser.execute_script(
            "return Array.from(document.querySelectorAll('#nodes > .node'), e => e.dataset.node)"
        )
        assert nodes == [inv.node for inv in cluster.inventories]
        gpus = browser.execute_script(
            "return Array.from(document.querySelectorAll('#nodes .gpu'), e => e.dataset.gpuUuid)"
        )
        assert gpus == [g.uuid for inv in cluster.inventories for g in inv.gpus]
        assert sorted(browser.execute_script(SLICES_IN_PAGE)) == expected_slices(cluster.records)
        unhealthy = browser.execute_script(
            "const el = document.querySelector('.gpu.unhealthy');"
            "return [el.dataset.gpuUuid, el.querySelector('.reason').textContent]"
        )
        assert unhealthy == ["GPU-002-3", "unhealthy: XID 79: GPU has fallen off the bus"]
        totals = browser.find_element("id", "totals").text
        assert "Fragmentation" in totals and "%" in totals

        # Pending pods arrive live, with their counted reasons. Names are text, never markup.
        hostile = rejection(
            "hostile",
            ('<img src=x onerror="window.__owned=1">', 2),
            name='<b id="owned">x</b>',
            decided_at=time.time(),
        )

        async def reject(bus: NatsBus) -> None:
            for rejected in [*cluster.rejections, hostile]:
                await bus.js_publish(subjects.PLACEMENTS_REJECTED, codec.encode(rejected))

        browser.execute_script("window.__sameDocument = true")
        on_bus(nats_server.url, reject)
        wait_in_page(
            browser, "document.querySelectorAll('#pending tbody tr[data-pod-uid]').length == 5"
        )
        first_row = browser.find_element("css selector", "#pending tbody tr").text
        assert "llm-train-0" in first_row
        assert "5 nodes: insufficient GPU memory" in first_row
        assert '<b id="owned">x</b>' in browser.find_element("id", "pending").text
        assert browser.execute_script(
            "return document.getElementById('owned') === null && window.__owned === undefined"
        )

        # A new pod is placed (the Pending one, on a free GPU): its slice appears, its row leaves.
        free_gpu = next(
            g
            for inv in cluster.inventories
            for g in inv.gpus
            if g.health == "healthy"
            and not any(
                s.uuid == g.uuid for r in cluster.records for c in r.containers for s in c.gpus
            )
        )
        node = next(inv.node for inv in cluster.inventories if free_gpu in inv.gpus)
        placed = record(
            node,
            "pending-0",
            share(free_gpu.uuid, free_gpu.index, memory=12288, cores=40),
            state="bound",
            name="llm-train-0",
            namespace="research",
            decided_at=time.time(),
        )

        async def place(bus: NatsBus) -> None:
            await put_record(bus, placed)

        on_bus(nats_server.url, place)
        wait_in_page(
            browser,
            "document.querySelector('.slice[data-pod-uid=\"pending-0\"]') !== null",
            what="the new slice",
        )
        wait_in_page(
            browser, "document.querySelectorAll('#pending tbody tr[data-pod-uid]').length == 4"
        )
        assert sorted(browser.execute_script(SLICES_IN_PAGE)) == expected_slices(
            [*cluster.records, placed]
        )
        assert browser.execute_script("return window.__sameDocument === true")  # no reload
        perf = browser.execute_script("return window.tesseraDashboard.perf")
        assert perf["snapshots"] == 1
        assert perf["updates"] >= 2
        print(f"live update render {perf['lastRenderMs']:.1f} ms")

        # Click: the slice's pod, namespace, memory, cores and state.
        browser.find_element("css selector", '.slice[data-pod-uid="pending-0"]').click()
        details = browser.find_element("id", "details").text
        for text in ("research/llm-train-0", "12288 MiB", "40% of SMs", "bound", free_gpu.uuid):
            assert text in details
        save_artifact(browser, tmp_path, "dashboard-live.png")


def test_100_nodes_by_8_gpus_are_all_drawn(
    browser: Any, nats_server: NatsServer, tmp_path: Path
) -> None:
    cluster = synthetic_cluster(100, 8, pending=40, now=time.time())

    async def seed(bus: NatsBus) -> None:
        await write_cluster(bus, cluster)

    on_bus(nats_server.url, seed)
    with dashboard_process(nats_server.url) as dashboard:
        browser.get(dashboard.url)
        wait_in_page(browser, "window.tesseraDashboard && window.tesseraDashboard.ready")
        render_ms = browser.execute_script("return window.tesseraDashboard.perf.snapshotRenderMs")
        counts = browser.execute_script(
            "return [document.querySelectorAll('#nodes > .node').length,"
            " document.querySelectorAll('#nodes .gpu').length]"
        )
        assert counts == [100, 800]
        assert sorted(browser.execute_script(SLICES_IN_PAGE)) == expected_slices(cluster.records)
        print(
            f"\n100 nodes x 8 GPUs, {len(cluster.records)} slices: first render {render_ms:.0f} ms"
        )

        last = cluster.inventories[-1]
        moved = record(last.node, "late-1", share(last.gpus[0].uuid, 0, memory=1024, cores=5))

        async def place(bus: NatsBus) -> None:
            await put_record(bus, moved)

        on_bus(nats_server.url, place)
        wait_in_page(browser, "document.querySelector('.slice[data-pod-uid=\"late-1\"]') !== null")
        update_ms = browser.execute_script("return window.tesseraDashboard.perf.lastRenderMs")
        print(f"one-node update render {update_ms:.1f} ms")
        save_artifact(browser, tmp_path, "dashboard-100x8.png")


RUNNING_ROWS = (
    "return Array.from(document.querySelectorAll('#running tbody tr'), r => r.dataset.podUid)"
)


def test_tenants_placed_pods_utilization_and_every_pending_pod(
    browser: Any, nats_server: NatsServer, tmp_path: Path
) -> None:
    """The per-tenant table (usage against quotas), the placed pods (filtered and paged by the
    server), each GPU's utilisation over the last minutes, and Pending counting the pods no
    placer has decided yet and those the binder found invalid."""
    now = time.time()
    cluster = synthetic_cluster(4, 4, pending=2, now=now - 60)
    tenants = (
        TenantUsage(
            tenant="research", pods=9, gpus=9, gpu_memory_mib=90_000, core_milli=2500, quota_gpus=16
        ),
        TenantUsage(tenant="batch", pods=1, gpus=1, gpu_memory_mib=10240, core_milli=250),
    )
    cluster.stats[0] = msgspec.structs.replace(cluster.stats[0], tenants=tenants)
    later = [
        msgspec.structs.replace(
            inv,
            observed_at=now,
            gpus=tuple(msgspec.structs.replace(g, utilization_pct=90) for g in inv.gpus),
        )
        for inv in cluster.inventories
    ]

    async def seed(bus: NatsBus) -> None:
        await write_cluster(bus, cluster)

    async def more(bus: NatsBus) -> None:
        for rejected in cluster.rejections:  # the page listens from now on
            await bus.js_publish(subjects.PLACEMENTS_REJECTED, codec.encode(rejected))
        for inv in later:  # a second reading a minute on: every GPU now has a history
            await bus.kv_put(
                subjects.KV_INVENTORY, subjects.node_token(inv.node), codec.encode(inv)
            )
        queued = PodPending(
            uid="q-1", namespace="batch", name="waits", containers=(), created_at=now
        )
        await bus.js_publish(subjects.PODS_PENDING, codec.encode(queued))
        invalid = PodInvalid(
            pod_uid="bad-1", namespace="batch", name="typo", message="Tessera cannot place", at=now
        )
        await bus.js_publish(subjects.PLACEMENTS_INVALID, codec.encode(invalid))

    on_bus(nats_server.url, seed)
    with dashboard_process(nats_server.url, "--push-interval-s", "0.1") as dashboard:
        browser.get(dashboard.url)
        wait_in_page(browser, "window.tesseraDashboard && window.tesseraDashboard.ready")
        on_bus(nats_server.url, more)
        wait_in_page(
            browser,
            "document.getElementById('pending-count').textContent === '4'",
            what="2 rejected, 1 not decided yet, 1 invalid",
        )
        pending = browser.find_element("id", "pending").text
        assert "batch/waits queued" in pending and "not decided by a placer yet" in pending
        assert "batch/typo invalid" in pending and "Tessera cannot place" in pending

        rows = browser.execute_script(
            "return Array.from(document.querySelectorAll('#tenants tbody tr'),"
            " r => Array.from(r.cells, c => c.textContent))"
        )
        assert rows == [
            ["research", "9", "9 / 16", "88 GiB", "2.50 GPUs of SMs"],
            ["batch", "1", "1", "10 GiB", "0.25 GPUs of SMs"],
        ]

        wait_in_page(browser, "document.querySelectorAll('#nodes .gpu .spark').length === 16")
        live = [r for r in cluster.records if r.state != "released"]
        total = len(live)
        assert total > 20, "enough placed pods for two pages"
        wait_in_page(
            browser, f"document.getElementById('running-page').textContent === '1-20 of {total}'"
        )
        shown = browser.execute_script(RUNNING_ROWS)
        by_name = sorted(live, key=lambda r: (r.namespace, r.name, r.pod_uid))
        assert shown == [r.pod_uid for r in by_name[:20]]
        browser.find_element("id", "running-next").click()
        wait_in_page(
            browser, "document.getElementById('running-page').textContent.startsWith('21-')"
        )
        browser.find_element("id", "running-filter").send_keys("inference")
        expected = [r.pod_uid for r in by_name if r.namespace == "inference"]
        wait_in_page(
            browser,
            f"document.getElementById('running-count').textContent === '{len(expected)}'",
        )
        shown = browser.execute_script(RUNNING_ROWS)
        assert shown == expected[:20]
        save_artifact(browser, tmp_path, "dashboard-tenants-running.png")
