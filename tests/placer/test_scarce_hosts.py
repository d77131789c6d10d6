"""The fed measure's opt-in scarce-host weighting (``fed_fgd.rarity``, argument ``scarcity``)."""

from __future__ import annotations

import msgspec
import pytest

from services.placer.core.fragmentation import HostKind, TypicalTask, host_kinds
from services.placer.core.framework import Profile
from services.placer.core.model import GpuState, NodeState
from services.placer.core.plugins.fed_fgd import FedFragmentation, rarity
from services.placer.core.profiles import (
    DEFAULT_TYPICAL_TASKS,
    ProfileError,
    ProfileSpec,
    ScoreSpec,
    build_profile,
)
from services.placer.rules.state import ClusterView
from shared.runtime.nats import NatsBus
from tests.placer import wire
from tests.placer.conftest import PlacerFactory, until
from tests.placer.test_translate import NOW

# The trace's two 8-GPU kinds: 64 G2 GPUs (96 cores, 384 GiB) and 16 G3 GPUs (128 cores, 768 GiB).
G2 = HostKind(cpu_milli=96_000, memory_mib=393_216, gpus=8, models=("G2",), count=8)
G3 = HostKind(cpu_milli=128_000, memory_mib=786_432, gpus=8, models=("G3",), count=2)
ANY_ONE = TypicalTask(cpu_milli=8_000, gpu_count=1, gpu_milli=1_000, weight=1)
G3_ONLY = TypicalTask(cpu_milli=120_000, gpu_count=8, gpu_milli=1_000, memory_mib=737_280, weight=1)
G3_MODEL = TypicalTask(cpu_milli=1_000, gpu_count=1, gpu_milli=500, models=("G3",), weight=1)
ONE_G2 = TypicalTask(cpu_milli=90_000, gpu_count=8, gpu_milli=1_000, weight=1)
NOWHERE = TypicalTask(cpu_milli=200_000, gpu_count=8, gpu_milli=1_000, weight=1)
CPU_ONLY = TypicalTask(cpu_milli=4_000, gpu_count=0, gpu_milli=0, weight=1)


@pytest.mark.parametrize(
    ("task", "exponent", "expected"),
    [
        (ANY_ONE, 1.0, 1.0),  # every GPU node fits it
        (ONE_G2, 1.0, 1.0),  # 64 of 80 GPUs fit it: 1.25 x, not scarce enough to count
        (G3_ONLY, 1.0, 5.0),  # 80 GPUs in all, 16 on the only nodes that fit it
        (G3_ONLY, 2.0, 25.0),
        (G3_ONLY, 0.0, 1.0),
        (G3_MODEL, 1.0, 5.0),  # the model, not the size, picks the hosts
        (NOWHERE, 1.0, 1.0),  # fits nowhere: left as it is
        (CPU_ONLY, 1.0, 1.0),  # no GPU: no host to be scarce
        (msgspec.structs.replace(G3_ONLY, assumed=True), 1.0, 1.0),  # no pod asked for it
    ],
)
def test_rarity(task: TypicalTask, exponent: float, expected: float) -> None:
    assert rarity((task,), (G2, G3), exponent) == pytest.approx((expected,))


def test_host_kinds_groups_gpu_nodes_by_capacity() -> None:
    def gpu_node(name: str, cpu: int, model: str, gpus: int) -> NodeState:
        return NodeState(
            name=name,
            cpu_milli_total=cpu,
            memory_mib_total=1_000,
            gpus=tuple(
                GpuState(index=i, uuid=f"{name}-{i}", model=model, memory_total_mib=16_000)
                for i in range(gpus)
            ),
        )

    nodes = [
        gpu_node("a", 8_000, "T4", 2),
        gpu_node("b", 8_000, "T4", 2),
        gpu_node("c", 16_000, "T4", 2),
        NodeState(name="cpu", cpu_milli_total=64_000, memory_mib_total=1_000),
    ]
    assert host_kinds(nodes) == (
        HostKind(cpu_milli=8_000, memory_mib=1_000, gpus=2, models=("T4",), count=2),
        HostKind(cpu_milli=16_000, memory_mib=1_000, gpus=2, models=("T4",), count=1),
    )


def test_scarcity_weighs_a_scarce_task_more_only_where_it_fits() -> None:
    mix = (ANY_ONE, G3_ONLY)
    plain = FedFragmentation(mix, scarcity=0)
    scarce = FedFragmentation(mix, hosts=(G2, G3), scarcity=1.0)
    g3_models = frozenset({"G3"})
    # An empty G3 node: nothing is fragmented either way.
    idle = (1_000,) * 8
    assert scarce.node(g3_models, 128_000, 786_432, idle) == plain.node(
        g3_models, 128_000, 786_432, idle
    )
    # One GPU taken: the G3-only task cannot run any more; its fragment (7,000 milli) weighs
    # 5 x more, the whole-GPU task's (0) not at all.
    taken = (0,) + (1_000,) * 7
    before = plain.node(g3_models, 120_000, 700_000, taken)
    after = scarce.node(g3_models, 120_000, 700_000, taken)
    assert before == pytest.approx(7_000 / 2)
    assert after == pytest.approx(5 * 7_000 / 2)


def test_no_change_without_hosts_or_at_exponent_zero() -> None:
    mix = (ANY_ONE, G3_ONLY)
    state = (frozenset({"G3"}), 120_000, 700_000, (0,) + (1_000,) * 7)
    values = {
        FedFragmentation(mix, scarcity=0).node(*state),
        FedFragmentation(mix, hosts=(G2, G3), scarcity=0).node(*state),
        FedFragmentation(mix, scarcity=2.0).node(*state),
    }
    assert len(values) == 1


@pytest.mark.parametrize("bad", [-1, "1", True])
def test_bad_scarcity_is_a_profile_error(bad: object) -> None:
    spec = ProfileSpec(
        name="t",
        scores=(ScoreSpec(plugin="fgd-fed", args={"scarcity": bad}),),
        gpu_choice="fgd-fed",
    )
    with pytest.raises(ProfileError, match="scarcity"):
        build_profile(spec, hosts=(G2, G3))


def test_profile_takes_scarcity_with_hosts() -> None:
    spec = ProfileSpec(
        name="t", scores=(ScoreSpec(plugin="fgd-fed", args={"scarcity": 1}),), gpu_choice="fgd-fed"
    )
    profile = build_profile(spec, typical_tasks=(ANY_ONE, G3_ONLY), hosts=(G2, G3))
    ((score, _),) = profile.scores
    assert score.model.scarcity == 1  # type: ignore[attr-defined]
    assert score.model.hosts == (G2, G3)  # type: ignore[attr-defined]


# --- the placer service: the cluster's node kinds, as its view counts them ---------------------


def _view(pools: int, *nodes: tuple[str, int]) -> ClusterView:
    """A loaded view holding ``(name, GPUs)`` nodes (the same CPU and memory), and a node
    without GPUs; with ``pools``, the replica holding only pool 0."""
    view = ClusterView(inventory_stale_s=30, task_mix_window=100, pools=pools)
    for name, gpus in nodes:
        view.set_inventory(wire.inventory(name, gpus, at=NOW), now=NOW)
        view.set_facts(wire.facts(name, at=NOW))
    view.set_facts(wire.facts("cpu-only", at=NOW))
    view.set_inventory(wire.inventory("cpu-only", 0, at=NOW), now=NOW)
    view.finish_load(NOW)
    view.set_owned(frozenset({0}))
    return view


@pytest.mark.parametrize("pools", [1, 3])
def test_the_placer_view_counts_node_kinds_as_the_simulator_does(pools: int) -> None:
    view = _view(pools, ("a", 4), ("b", 4), ("c", 4), ("big", 8))
    kinds = view.host_kinds()
    # Every pool's nodes, grouped as the simulator groups its cluster's nodes.
    assert kinds == host_kinds(view.everywhere())
    assert [(k.gpus, k.count) for k in kinds] == [(4, 3), (8, 1)]
    # A node joins, another leaves: the kinds follow, whatever pool either is in. Until its
    # facts come, the new node's CPU and memory are unknown: it is not a kind yet.
    view.set_inventory(wire.inventory("big2", 8, at=NOW), now=NOW)
    assert view.host_kinds() == kinds
    view.set_facts(wire.facts("big2", at=NOW))
    view.drop_inventory("a")
    assert [(k.gpus, k.count) for k in view.host_kinds()] == [(4, 2), (8, 2)]
    assert view.host_kinds() == host_kinds(view.everywhere())


def fed_model(profile: Profile | None) -> FedFragmentation:
    """The fed measure ``profile`` scores nodes with."""
    assert profile is not None
    ((score, _),) = profile.scores
    model = score.model  # type: ignore[attr-defined]
    assert isinstance(model, FedFragmentation)
    return model


def profile_weights(profile: Profile | None) -> list[float]:
    """Each typical task's weight in ``profile``'s fed measure over its weight without hosts."""
    model = fed_model(profile)
    plain = FedFragmentation(model.tasks)
    return [
        weighed.weight / alone.weight
        for weighed, alone in zip(model.weighted_tasks, plain.weighted_tasks, strict=True)
    ]


async def test_the_placer_compiles_its_profile_with_the_clusters_node_kinds(
    bus: NatsBus, start_placer: PlacerFactory
) -> None:
    for name in ("a", "b", "c"):
        await wire.put_node(bus, name, 4)
    await wire.put_node(bus, "big", 8)
    async with start_placer(tuning={"mix_check_s": 0.02}) as placer:
        service = placer.service
        assert service is not None

        def fed_hosts() -> list[tuple[int, int]]:
            return [(kind.gpus, kind.count) for kind in fed_model(service.profile).hosts]

        # Only "big" holds the prior mix's 8-GPU task, but no pod asked for one: a guess, not
        # weighed more.
        assert fed_hosts() == [(4, 3), (8, 1)]
        assert profile_weights(service.profile) == [1.0] * len(DEFAULT_TYPICAL_TASKS)
        assert service.upkeep.hosts_compiled == service.view.host_kinds()
        # A pod of 8 GPUs placed: 8 of the 20 GPUs hold the task it stands for, scarce and
        # weighed 2.5 x as in the simulator; the prior's guess and every other task as before.
        await wire.publish_pod(bus, wire.pending("eight", shares=8, memory_mib=None, cores=None))
        await until(lambda: len(fed_model(service.profile).tasks) > 7, what="the pod learned")
        seen = [not t.assumed for t in fed_model(service.profile).tasks]
        assert seen.count(True) == 1
        assert profile_weights(service.profile) == pytest.approx([2.5 if s else 1.0 for s in seen])
        builds = placer.metric("tessera_placer_profile_builds_total")
        await wire.put_node(bus, "big2", 8)
        await until(lambda: fed_hosts() == [(4, 3), (8, 2)], what="the new node kind compiled")
        assert placer.metric("tessera_placer_profile_builds_total") == builds + 1


async def test_nodes_known_after_the_placer_is_ready_are_in_its_first_decision(
    bus: NatsBus, start_placer: PlacerFactory
) -> None:
    # The replica turns ready before the nodes' inventories come (as in ``tessera up``); no
    # mix check runs meanwhile, so only the decision itself can have compiled the kinds in.
    async with start_placer(tuning={"mix_check_s": 3600.0}) as placer:
        service = placer.service
        assert service is not None
        assert service.upkeep.hosts_compiled == ()
        for name in ("a", "b", "c"):
            await wire.put_node(bus, name, 4)
        await wire.put_node(bus, "big", 8)
        await until(lambda: len(service.view.host_kinds()) == 2, what="the nodes in the view")
        assert service.upkeep.hosts_compiled == ()
        await wire.publish_pod(bus, wire.pending("u1", memory_mib=4096, cores=25))
        await until(lambda: "u1" in service.view.claims, what="u1 placed")
        assert [(kind.gpus, kind.count) for kind in fed_model(service.profile).hosts] == [
            (4, 3),
            (8, 1),
        ]
        assert placer.metric("tessera_placer_profile_builds_total") == 2
