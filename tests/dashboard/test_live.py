"""The live view pushes a snapshot, then only what changed; slow pages are cut loose."""

from __future__ import annotations

import json
from typing import Any

from prometheus_client import CollectorRegistry

from services.dashboard.core.state import (
    FactsChanged,
    InventoryChanged,
    PodGone,
    PodRejected,
    RecordChanged,
)
from services.dashboard.core.views import ViewPolicy
from services.dashboard.live import BUCKETS, CLIENT_QUEUE, LiveMetrics, LiveView, Page
from shared import subjects
from tests.dashboard.builders import NOW, deleted, facts, gpu, inventory, record, rejection, share
from tests.harness.clock import FakeClock


def live_view(clock: FakeClock, registry: CollectorRegistry | None = None) -> LiveView:
    return LiveView(
        clock=clock,
        policy=ViewPolicy(inventory_stale_s=60),
        push_interval_s=0.1,
        pending_limit=100,
        metrics=LiveMetrics.create(registry or CollectorRegistry()),
        connected=lambda: True,
    )


def drain(page: Page) -> list[tuple[str, Any]]:
    events = []
    while not page.queue.empty():
        chunk = page.queue.get_nowait()
        if chunk is None:
            events.append(("closed", None))
            continue
        head, data = chunk.decode().strip().split("\n")
        events.append((head.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return events


def synced(live: LiveView) -> None:
    for bucket in BUCKETS:
        live.mark_synced(bucket)


def with_two_nodes(live: LiveView) -> None:
    for node in ("n1", "n2"):
        live.apply(InventoryChanged(node=node, inventory=inventory(node, gpu(f"G-{node}"))))
        live.apply(FactsChanged(node=node, facts=facts(node)))


def test_a_page_waits_with_a_status_then_gets_one_snapshot() -> None:
    clock = FakeClock(start=NOW)
    live = live_view(clock)
    page = live.connect_page()
    with_two_nodes(live)
    live.push()
    statuses = drain(page)
    assert {kind for kind, _ in statuses} == {"status"}
    status = statuses[-1][1]
    assert status["synced"] is False
    assert status["message"].startswith("loading")
    synced(live)
    live.push()
    [(kind, snapshot)] = drain(page)
    assert kind == "snapshot"
    assert [n["name"] for n in snapshot["cluster"]["nodes"]] == ["n1", "n2"]
    assert snapshot["pending"]["count"] == 0
    live.push()
    assert drain(page) == []  # nothing changed: nothing sent


def test_updates_carry_only_the_changed_nodes_and_pending_when_it_changed() -> None:
    clock = FakeClock(start=NOW)
    live = live_view(clock)
    with_two_nodes(live)
    synced(live)
    live.push()
    page = live.connect_page()
    assert [kind for kind, _ in drain(page)] == ["snapshot"]

    key = subjects.assignment_key("n1", "u1")
    live.apply(RecordChanged(key=key, record=record("n1", "u1", share("G-n1", memory=2048))))
    live.push()
    [(kind, update)] = drain(page)
    assert kind == "update"
    assert [n["name"] for n in update["nodes"]] == ["n1"]
    assert update["nodes"][0]["gpus"][0]["slices"][0]["pod_uid"] == "u1"
    assert update["totals"]["gpu_memory_allocated_mib"] == 2048
    assert update["pending"] is None
    assert update["order"] is None

    live.apply(PodRejected(rejection=rejection("p")))
    live.push()
    [(_, update)] = drain(page)
    assert update["nodes"] == []
    assert [p["pod_uid"] for p in update["pending"]["pods"]] == ["p"]

    live.apply(PodGone(deleted=deleted("p")))
    live.apply(InventoryChanged(node="n2", inventory=None))
    live.apply(FactsChanged(node="n2", facts=None))
    live.push()
    [(_, update)] = drain(page)
    assert update["removed"] == ["n2"]
    assert update["order"] == ["n1"]
    assert update["pending"]["count"] == 0


def test_a_node_going_stale_is_pushed_without_any_event() -> None:
    clock = FakeClock(start=NOW)
    live = live_view(clock)
    with_two_nodes(live)
    synced(live)
    live.push()
    page = live.connect_page()
    drain(page)
    clock._now += 61  # time alone makes both inventories stale
    live.push()
    [(_, update)] = drain(page)
    assert sorted(n["name"] for n in update["nodes"]) == ["n1", "n2"]
    assert all(n["inventory_stale"] for n in update["nodes"])


def test_a_page_that_falls_behind_is_disconnected_and_counted() -> None:
    clock = FakeClock(start=NOW)
    registry = CollectorRegistry()
    live = live_view(clock, registry)
    with_two_nodes(live)
    synced(live)
    live.push()
    slow = live.connect_page()
    for i in range(CLIENT_QUEUE + 2):
        key = subjects.assignment_key("n1", f"u{i}")
        live.apply(RecordChanged(key=key, record=record("n1", f"u{i}", share("G-n1"))))
        live.push()
    events = drain(slow)
    assert events[-1] == ("closed", None)
    assert registry.get_sample_value("tessera_dashboard_pages_dropped_total") == 1
    assert registry.get_sample_value("tessera_dashboard_pages") == 0
    # A fresh connection starts over from a complete snapshot.
    again = live.connect_page()
    [(kind, snapshot)] = drain(again)
    assert kind == "snapshot"
    assert len(snapshot["cluster"]["nodes"][0]["gpus"][0]["slices"]) == CLIENT_QUEUE + 2


def test_losing_nats_is_pushed_so_the_page_can_say_so() -> None:
    clock = FakeClock(start=NOW)
    live = live_view(clock)
    up = [True]
    live.connected = lambda: up[0]
    with_two_nodes(live)
    synced(live)
    page = live.connect_page()
    live.push()
    drain(page)
    up[0] = False
    live.push()
    [(kind, update)] = drain(page)
    assert (kind, update["connected"], update["nodes"]) == ("update", False, [])
    live.push()
    assert drain(page) == []
