"""Views rendered from the state: per-GPU accounting, problems, totals, fragmentation, Pending."""

from __future__ import annotations

import pytest

from services.dashboard.core.state import (
    Event,
    FactsChanged,
    InventoryChanged,
    PodRejected,
    RecordChanged,
    State,
    StatsChanged,
    reduce_all,
)
from services.dashboard.core.views import (
    ViewPolicy,
    cluster_view,
    natural_key,
    node_view,
    pending_view,
)
from shared import subjects
from shared.messages.assignments import AssignmentRecord
from tests.dashboard.builders import NOW, facts, gpu, inventory, record, rejection, share, stats

POLICY = ViewPolicy(inventory_stale_s=60, stats_stale_s=120)


def put(value: AssignmentRecord) -> RecordChanged:
    return RecordChanged(key=subjects.assignment_key(value.node, value.pod_uid), record=value)


def two_gpu_node(*events: Event) -> State:
    return reduce_all(
        State(),
        [
            InventoryChanged(
                node="n1",
                inventory=inventory(
                    "n1",
                    gpu("G0", 0, total=40960, used=12000, utilization=55),
                    gpu("G1", 1, total=40960, health="unhealthy", reason="XID 79"),
                ),
            ),
            FactsChanged(node="n1", facts=facts("n1")),
            *events,
        ],
    )


def test_slices_land_on_their_gpu_with_pod_namespace_memory_cores_and_state() -> None:
    state = two_gpu_node(
        put(record("n1", "a", share("G0", 0, memory=10240, cores=25), state="allocated")),
        put(
            record(
                "n1", "b", share("G0", 0, memory=20480, cores=50), state="bound", decided_at=NOW + 1
            )
        ),
        put(record("n1", "c", share("G0", 0, memory=4096, cores=10), state="released")),
    )
    view = node_view(state, "n1", now=NOW, policy=POLICY)
    g0, g1 = view.gpus
    assert [(s.pod_uid, s.namespace, s.memory_mib, s.cores, s.state) for s in g0.slices] == [
        ("a", "ml", 10240, 25, "allocated"),
        ("b", "ml", 20480, 50, "bound"),
    ]
    assert (g0.allocated_memory_mib, g0.free_memory_mib) == (30720, 10240)
    assert (g0.allocated_cores, g0.free_cores) == (75, 25)
    assert (g0.memory_used_mib, g0.utilization_pct) == (12000, 55)
    assert (g1.health, g1.health_reason, g1.free_memory_mib, g1.free_cores) == (
        "unhealthy",
        "XID 79",
        0,
        0,
    )
    assert view.problems == ("1 unhealthy GPU",)


def test_totals_count_free_only_on_healthy_gpus() -> None:
    state = two_gpu_node(
        put(record("n1", "a", share("G0", 0, memory=10240, cores=25))),
        put(record("n1", "b", share("G1", 1, memory=8192, cores=20), state="reserved")),
    )
    t = cluster_view(state, now=NOW, policy=POLICY).totals
    assert (t.nodes, t.nodes_ready, t.gpus, t.gpus_healthy, t.gpus_unhealthy) == (1, 1, 2, 1, 1)
    assert t.gpu_memory_total_mib == 81920
    assert t.gpu_memory_allocated_mib == 18432
    assert t.gpu_memory_free_mib == 40960 - 10240
    assert t.gpu_memory_unavailable_mib == 40960 - 8192
    assert (t.gpu_cores_total, t.gpu_cores_allocated, t.gpu_cores_free) == (200, 45, 75)
    assert t.gpu_cores_unavailable == 80
    assert (t.pods_allocated, t.pods_reserved, t.pods_bound) == (1, 1, 0)


def test_reserved_pods_are_the_placers_count_of_claims_with_no_record_yet() -> None:
    """A placed pod has no record before the binder writes it ``bound``: the freshest placer
    statistics count those, beside any record still in the ``reserved`` state."""
    state = two_gpu_node(
        put(record("n1", "a", share("G0", 0, memory=10240, cores=25), state="reserved")),
    )
    assert cluster_view(state, now=NOW, policy=POLICY).totals.pods_reserved == 1
    state = reduce_all(
        state,
        [
            StatsChanged(key="placer-0", stats=stats("placer-0", at=NOW - 20, reserved=9)),
            StatsChanged(key="placer-1", stats=stats("placer-1", at=NOW - 10, reserved=4)),
        ],
    )
    assert cluster_view(state, now=NOW, policy=POLICY).totals.pods_reserved == 1 + 4


def test_a_pod_without_gpus_is_not_counted_as_waiting_for_an_allocation() -> None:
    """A CPU-only pod Tessera placed stays ``bound`` for good (no device plugin allocates it):
    it is counted apart, never among the pods on GPUs."""
    state = two_gpu_node(
        put(record("n1", "a", share("G0", 0, memory=10240, cores=25), state="bound")),
        put(record("n1", "cpu-only", state="bound")),
        put(record("n1", "cpu-done", state="allocated")),
    )
    t = cluster_view(state, now=NOW, policy=POLICY).totals
    assert (t.pods_allocated, t.pods_bound, t.pods_reserved) == (0, 1, 0)
    assert t.pods_without_gpus == 2


def test_an_overcommitted_gpu_is_flagged() -> None:
    state = two_gpu_node(
        put(record("n1", "a", share("G0", 0, memory=30000, cores=60))),
        put(record("n1", "b", share("G0", 0, memory=30000, cores=60))),
    )
    view = cluster_view(state, now=NOW, policy=POLICY)
    assert view.nodes[0].gpus[0].overcommitted
    assert view.totals.gpus_overcommitted == 1
    assert "over-committed GPU 0" in view.nodes[0].problems


def test_slices_on_a_gpu_the_inventory_does_not_list_are_shown_apart() -> None:
    state = two_gpu_node(put(record("n1", "a", share("G-ghost", 7, memory=1024))))
    view = cluster_view(state, now=NOW, policy=POLICY)
    ghost = view.nodes[0].gpus[-1]
    assert (ghost.uuid, ghost.index, ghost.listed, ghost.health) == ("G-ghost", 7, False, "unknown")
    assert [s.pod_uid for s in ghost.slices] == ["a"]
    assert view.totals.gpus == 2
    assert view.totals.gpu_memory_allocated_mib == 0
    assert view.totals.stray_slices == 1


@pytest.mark.parametrize(
    ("events", "problems"),
    [
        ([InventoryChanged(node="n", inventory=inventory("n", gpu("G")))], ("no node facts yet",)),
        ([FactsChanged(node="n", facts=facts("n"))], ("no GPU inventory",)),
        (
            [
                FactsChanged(node="n", facts=facts("n", ready=False, schedulable=False)),
                InventoryChanged(
                    node="n", inventory=inventory("n", gpu("G"), observed_at=NOW - 75)
                ),
            ],
            ("not ready", "cordoned", "inventory older than 60 s"),
        ),
        (
            [put(record("n", "u", share("G")))],
            (
                "no node facts yet",
                "no GPU inventory",
                "slices on 1 GPU(s) missing from the inventory",
            ),
        ),
    ],
)
def test_node_problems_say_what_is_wrong(events: list[Event], problems: tuple[str, ...]) -> None:
    view = node_view(reduce_all(State(), events), "n", now=NOW, policy=POLICY)
    assert view.problems == problems
    assert view.inventory_stale == ("inventory older than 60 s" in problems)


def test_nodes_in_natural_order() -> None:
    names = ["node-10", "node-2", "node-1", "a"]
    state = reduce_all(State(), [FactsChanged(node=n, facts=facts(n)) for n in names])
    assert [n.name for n in cluster_view(state, now=NOW, policy=POLICY).nodes] == [
        "a",
        "node-1",
        "node-2",
        "node-10",
    ]
    assert natural_key("gpu-2") < natural_key("gpu-10")


def test_fragmentation_is_na_until_a_placer_publishes_then_freshest_and_aged() -> None:
    state = two_gpu_node()
    assert not cluster_view(state, now=NOW, policy=POLICY).fragmentation.available
    state = reduce_all(
        state,
        [
            StatsChanged(key="placer-0", stats=stats("placer-0", pct=3.0, at=NOW - 20)),
            StatsChanged(key="placer-1", stats=stats("placer-1", pct=4.0, at=NOW - 10)),
        ],
    )
    view = cluster_view(state, now=NOW, policy=POLICY)
    f = view.fragmentation
    assert (f.available, f.fragmentation_pct, f.placer_id, f.age_s, f.stale) == (
        True,
        4.0,
        "placer-1",
        10.0,
        False,
    )
    assert view.nodes[0].fragmented_milli == 160.0
    assert cluster_view(state, now=NOW + 200, policy=POLICY).fragmentation.stale


def test_pending_view_oldest_first_with_counted_reasons_and_limit() -> None:
    state = reduce_all(
        State(),
        [
            PodRejected(
                rejection=rejection("b", ("insufficient GPU memory", 3), decided_at=NOW + 5)
            ),
            PodRejected(
                rejection=rejection(
                    "a", ("insufficient GPU memory", 2), ("unhealthy GPU", 1), decided_at=NOW
                )
            ),
            PodRejected(rejection=rejection("c", ("GPU model excluded", 4), decided_at=NOW + 9)),
        ],
    )
    view = pending_view(state, now=NOW + 10)
    assert [p.pod_uid for p in view.pods] == ["a", "b", "c"]
    assert view.pods[0].waiting_s == 10
    assert [(r.reason, r.nodes) for r in view.pods[0].reasons] == [
        ("insufficient GPU memory", 2),
        ("unhealthy GPU", 1),
    ]
    assert [(r.reason, r.pods) for r in view.reasons] == [
        ("insufficient GPU memory", 2),
        ("GPU model excluded", 1),
        ("unhealthy GPU", 1),
    ]
    limited = pending_view(state, now=NOW, limit=1)
    assert (limited.count, len(limited.pods), len(limited.reasons)) == (3, 1, 3)
