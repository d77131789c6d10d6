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

import pytest

from shared import codec, subjects
from shared.runtime.bus import NatsBus
from tests.dashboard.builders import (
    put_record,
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
