"""The dashboard in a real headless browser against the whole running system (issue 15).

The page must show exactly the slices the assignment records hold, and a pod placed while the
page is open must appear on it without a reload. Selenium blocks, so its calls run in a thread:
the simulated cluster (API double and kubelets) shares this test's event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from shared import codec, subjects
from shared.messages.assignments import AssignmentRecord
from tessera.up import workload as w
from tessera.up.system import LocalSystem
from tests.dashboard.process import SLICES_IN_PAGE, chromium, require_browser, wait_in_page
from tests.dashboard.test_browser import expected_slices, save_artifact
from tests.e2e.helpers import by_name, clear, phase, settle
from tests.e2e.test_features import submit

pytestmark = pytest.mark.asyncio(loop_scope="package")
T = TypeVar("T")
NS = "dashboard"


async def live_records(system: LocalSystem) -> list[AssignmentRecord]:
    assert system.bus is not None
    records = []
    for key in await system.bus.kv_keys(subjects.KV_ASSIGNMENTS):
        entry = await system.bus.kv_get(subjects.KV_ASSIGNMENTS, key)
        if entry is not None:
            records.append(codec.decode(entry.value, AssignmentRecord))
    return [r for r in records if r.state != "released"]


async def in_thread(call: Callable[..., T], *args: Any) -> T:
    return await asyncio.to_thread(call, *args)


async def test_the_page_shows_the_live_cluster_and_a_new_pod_without_a_reload(
    system: LocalSystem, tmp_path: Path
) -> None:
    require_browser()
    url = system.endpoints()["dashboard_url"]
    assert url, "tessera up's system runs the dashboard"
    submit(
        system,
        NS,
        [
            w.pod("shared", [w.container(gpu=1, memory_mib=8192, cores=30)]),
            w.pod("whole", [w.container(gpu=1)]),
            w.pod("pair", [w.container(gpu=2, memory_mib=4096)]),
        ],
    )
    assert all(phase(p) == "Running" for p in await settle(system, NS, 3))
    with chromium() as browser:
        await in_thread(browser.get, url)
        await in_thread(wait_in_page, browser, "window.tesseraDashboard.ready")

        async def page_matches_records() -> list[Any]:
            expected = expected_slices(await live_records(system))
            for _ in range(100):
                shown = sorted(await in_thread(browser.execute_script, SLICES_IN_PAGE))
                if shown == expected:
                    return shown
                await asyncio.sleep(0.2)
            raise AssertionError(f"page shows {shown}, records say {expected}")

        shown = await page_matches_records()
        assert {row[2] for row in shown} >= {
            p["metadata"]["uid"] for p in system.cluster.pods(NS)
        }, "every pod of the test is on the page"

        await in_thread(browser.execute_script, "window.__sameDocument = true")
        started = time.monotonic()
        submit(system, NS, [w.pod("late", [w.container(gpu=1, memory_mib=2048, cores=10)])])
        late = by_name(await settle(system, NS, 4))["late"]
        uid = late["metadata"]["uid"]
        await in_thread(
            wait_in_page, browser, f"document.querySelector('.slice[data-pod-uid=\"{uid}\"]')"
        )
        print(f"\npod created to its slice on the page: {time.monotonic() - started:.2f} s")
        await page_matches_records()
        assert await in_thread(browser.execute_script, "return window.__sameDocument === true")
        perf = await in_thread(browser.execute_script, "return window.tesseraDashboard.perf")
        assert perf["snapshots"] == 1, "updates came live, not by reloading"
        await in_thread(save_artifact, browser, tmp_path, "dashboard-tessera-up.png")
    await clear(system, NS)
