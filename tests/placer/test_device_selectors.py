"""A DRA claim's CEL selectors on attributes other than the model, judged on each GPU: which
selectors are judged by model alone (the shape memo's path), what each attribute of a GPU
admits, the reason a node gets when no GPU meets one (or one cannot be evaluated), and the
placer choosing only GPUs that meet them."""

from __future__ import annotations

import msgspec
import pytest

from services.placer.core.cycle import decide
from services.placer.core.devicesel import admitted, unmet, verdict
from services.placer.core.facts import pod_facts
from services.placer.core.index import ClusterIndex
from services.placer.core.model import Decision, GpuState, NodeState, PodRequest, Rejection
from services.placer.core.plugins.deviceselectors import DeviceSelectorRule
from services.placer.core.profiles import build_profile
from services.placer.rules import decider, translate
from shared.dra.cel import SelectorProblem, reads, reads_model_only
from shared.dra.claims import ClaimPlan, plan_claims
from shared.dra.devices import DEVICE_CLASS, MemoryPolicy
from shared.messages.resourceclaims import DeviceRequest, PodResourceClaim
from tests.placer import wire
from tests.placer.builders import node
from tests.placer.test_gpu_api import DRA_LABELS, claim_pending
from tests.placer.test_translate import NOW
from tests.placer.test_view import PROFILE, view_of

T = 'device.attributes["gpu.tessera.dev"]'
K = 'device.attributes["resource.kubernetes.io"]'
C = 'device.capacity["gpu.tessera.dev"]'


@pytest.mark.parametrize(
    ("expression", "model_only"),
    [
        (f'{T}.model == "A100"', True),
        (f"has({T}.model)", True),
        (f'{T}["model"].startsWith("A")', True),
        (f"{T}['model'].lowerAscii() == 'a100'", True),
        ('device.driver == "gpu.tessera.dev"', True),
        ("true", True),
        (f"{T}.index == 0", False),
        (f'{T}.uuid == "GPU-1"', False),
        (f"{T}.memoryMiB >= 40000", False),
        (f'{C}.memory.compareTo(quantity("40Gi")) >= 0', False),
        (f"{K}.numaNode == 0", False),
        (f'{T}.model == "A100" || {K}.pcieRoot == "pci0000:00"', False),
        (f'{T}.exists(k, k == "model")', False),  # the whole map: every attribute read
        ("size(device.attributes) > 0", False),
        ('device.attributes["gpu.tessera." + "dev"].model == "A100"', False),
        (f"{T}.model ==", False),  # does not compile: judged (and refused) GPU by GPU
    ],
)
def test_only_selectors_reading_nothing_but_the_model_are_judged_by_model(
    expression: str, model_only: bool
) -> None:
    assert reads_model_only(expression) is model_only


def gpu(**changes: object) -> GpuState:
    base = GpuState(
        index=1,
        uuid="GPU-b",
        model="A100-80GB",
        memory_total_mib=81920,
        numa_node=1,
        pci_bus_id="00000000:3B:00.0",
        pcie_root="pci0000:3a",
    )
    return msgspec.structs.replace(base, **changes)


@pytest.mark.parametrize(
    ("selector", "met"),
    [
        (f'{T}.uuid == "GPU-b"', True),
        (f'{T}.uuid == "GPU-a"', False),
        (f"{T}.index == 1", True),
        (f"{T}.index == 0", False),
        (f"{T}.memoryMiB >= 40000", True),
        (f"{T}.memoryMiB >= 90000", False),
        (f'{T}.model == "A100-80GB" && {T}.index in [0, 1]', True),
        (f"{K}.numaNode == 1", True),
        (f"{K}.numaNode == 0", False),
        (f'{K}.pciBusID == "0000:3b:00.0"', True),
        (f'{K}.pcieRoot == "pci0000:3a"', True),
        (f'{K}.pcieRoot == "pci0000:00"', False),
        (f'{C}.memory.compareTo(quantity("40Gi")) >= 0', True),
        (f'{C}.memory.compareTo(quantity("81Gi")) > 0', False),
        (f'{C}.compute == quantity("100")', True),
        (f"has({K}.numaNode) && {K}.numaNode == 1", True),
    ],
)
def test_each_attribute_of_a_gpu_is_judged_as_kubernetes_judges_it(
    selector: str, met: bool
) -> None:
    found = verdict((selector,), gpu())
    assert found is None if met else found == selector


@pytest.mark.parametrize(
    ("selector", "changes", "problem"),
    [
        # An attribute the GPU does not have (its NUMA node is not known): an error, as in
        # Kubernetes, unless the selector tests for it with has().
        (f"{K}.numaNode == 0", {"numa_node": -1}, "no such member in mapping: 'numaNode'"),
        (f"{T}.index / 0 == 1", {}, "cannot evaluate"),
        (f"{T}.index", {}, "evaluates to int, not bool"),
        (f"cel.bind(x, {T}.index, x == 1)", {}, "does not implement"),
    ],
)
def test_a_selector_that_errors_or_cannot_be_evaluated_is_the_reason(
    selector: str, changes: dict[str, object], problem: str
) -> None:
    found = verdict((selector,), gpu(**changes))
    assert isinstance(found, SelectorProblem) and problem in str(found)
    reason = unmet((selector,), [gpu(**changes)], 1)
    assert reason is not None and problem in reason and selector in reason


def test_a_gpu_stops_at_the_first_selector_it_does_not_meet_as_kubernetes_does() -> None:
    # The second would fail to evaluate, but the first is already false: no error.
    selectors = (f"{T}.index == 0", f"{K}.numaNode == 0")
    assert verdict(selectors, gpu(numa_node=-1)) == selectors[0]
    assert verdict(selectors, gpu(index=0, numa_node=-1)) == SelectorProblem(
        expression=selectors[1], problem="cannot evaluate: no such member in mapping: 'numaNode'"
    )


def test_the_reason_names_the_selector_no_gpu_met() -> None:
    gpus = [gpu(index=i, uuid=f"GPU-{i}", numa_node=i // 2) for i in range(4)]
    index_7 = (f"{T}.index == 7",)
    assert unmet(index_7, gpus, 1) == f"no GPU meets selector {index_7[0]!r}"
    numa_1 = (f"{K}.numaNode == 1",)
    assert admitted(numa_1, gpus) == [False, False, True, True]
    assert unmet(numa_1, gpus, 2) is None
    assert unmet(numa_1, gpus, 3) == (
        f"2 GPUs of 4 meet the selectors, 3 needed (not met: {numa_1[0]!r} on 2 GPUs)"
    )
    both = (f"{K}.numaNode == 1", f"{T}.index < 2")
    assert unmet(both, gpus, 1) == (
        f"no GPU meets every selector (not met: {both[0]!r} on 2 GPUs, {both[1]!r} on 2 GPUs)"
    )


# -- the placer ------------------------------------------------------------------------------


def claim_pod(*selectors: str, count: int = 1, memory: str | None = "8Gi") -> PodRequest:
    capacity = {"memory": memory} if memory else {}
    request = DeviceRequest(
        name="r", device_class=DEVICE_CLASS, count=count, capacity=capacity, selectors=selectors
    )
    plan = plan_claims(
        (PodResourceClaim(name="gpu", claim="p-gpu", uid="u", requests=(request,)),),
        policy=MemoryPolicy(),
    )
    assert isinstance(plan, ClaimPlan), plan
    return PodRequest(
        uid="p",
        namespace="ns",
        name="p",
        containers=translate.claim_containers(plan),
        gpu_selectors=tuple(sorted({s for ask in plan.asks for s in ask.selectors})),
    )


def cluster() -> ClusterIndex:
    def built(name: str, mib: int, numa: tuple[int, ...]) -> NodeState:
        builder = node(name)
        for n in numa:
            builder.gpu(mib=mib, numa=n)
        return builder.build()

    return ClusterIndex([built("small", 40_000, (0, 0, 1, 1)), built("big", 81_920, (0, 1))])


def chosen(pod: PodRequest) -> tuple[str, list[int]] | str:
    outcome = decide(pod, cluster(), build_profile("binpack"), now=0)
    if isinstance(outcome, Rejection):
        return outcome.message
    assert isinstance(outcome, Decision)
    return outcome.node, [g.index for c in outcome.reservation.containers for g in c.gpus]


def pending_with(*selectors: str) -> PodRequest:
    """The placer's request for :func:`claim_pending`'s pod, its claim's request with
    ``selectors`` (the path a pod's claims take from the binder to the decision)."""
    pending = claim_pending("cp")
    claim = pending.claims[0]
    request = msgspec.structs.replace(claim.requests[0], selectors=selectors)
    return translate.pod_request(
        msgspec.structs.replace(
            pending, claims=(msgspec.structs.replace(claim, requests=(request,)),)
        )
    )


def test_the_placer_chooses_only_gpus_that_meet_per_gpu_selectors() -> None:
    assert chosen(claim_pod(f"{T}.memoryMiB >= 80000")) == ("big", [0])
    assert chosen(claim_pod(f"{T}.index == 3")) == ("small", [3])
    assert chosen(claim_pod(f"{T}.index == 1", f"{K}.numaNode == 1")) == ("big", [1])
    assert chosen(claim_pod(f'{C}.memory.compareTo(quantity("50Gi")) >= 0', count=2)) == (
        "big",
        [0, 1],
    )
    on_numa_1 = chosen(claim_pod(f"{K}.numaNode == 1", count=2, memory=None))
    assert on_numa_1 == ("small", [2, 3])


def test_a_pod_no_gpu_meets_waits_with_the_selector_named() -> None:
    assert chosen(claim_pod(f"{T}.index == 7")) == (
        f"2 nodes: no GPU meets selector '{T}.index == 7'"
    )
    message = chosen(claim_pod(f"{K}.numaNode == 1", count=3))
    assert message == (
        f"1 node: 1 GPU of 2 meets the selectors, 3 needed (not met: '{K}.numaNode == 1' on "
        f"1 GPU); 1 node: 2 GPUs of 4 meet the selectors, 3 needed (not met: "
        f"'{K}.numaNode == 1' on 2 GPUs)"
    )
    root = f'{K}.pcieRoot == "x"'
    assert chosen(claim_pod(root)) == (
        f"2 nodes: selector {root!r}: cannot evaluate: no such member in mapping: 'pcieRoot'"
    )


def test_capacity_on_the_gpus_that_meet_them_is_a_capacity_reason() -> None:
    index = ClusterIndex([node("n").gpu(used=900).gpu().build()])
    pod = claim_pod(f"{T}.index == 0", memory="4Gi")  # GPU 1 has room, GPU 0 not
    outcome = decide(pod, index, build_profile("binpack"), now=0)
    assert isinstance(outcome, Rejection) and not outcome.unresolvable
    assert (
        outcome.message
        == "1 node: insufficient GPU memory or cores on the GPUs that meet the selectors"
    )


def test_model_selectors_keep_the_shape_path() -> None:
    pod = claim_pod(f'{T}.model == "A100"')
    assert pod.device_selectors == () and pod.allows_model("A100")
    assert not pod.allows_model("H100")
    mixed = claim_pod(f'{T}.model == "A100"', f"{T}.index == 0")
    assert mixed.device_selectors == (f"{T}.index == 0",) and mixed.allows_model("A100")


def test_the_placer_reads_each_gpus_attributes_from_its_inventory() -> None:
    """Through the placer's view: the inventory's PCIe roots and NUMA nodes reach the selectors,
    the decision takes the GPU that meets them, and the verdicts explain the other node."""
    view = view_of(gpus=0)
    for name, roots in (("n1", ("pci0000:00", "pci0000:00")), ("n2", ("pci0000:00", "pci0000:80"))):
        listed = wire.inventory(name, 2, at=NOW)
        gpus = tuple(
            msgspec.structs.replace(g, pcie_root=root, numa_node=i)
            for i, (g, root) in enumerate(zip(listed.gpus, roots, strict=True))
        )
        view.set_inventory(msgspec.structs.replace(listed, gpus=gpus), now=NOW)
        view.set_facts(wire.facts(name, labels=DRA_LABELS, at=NOW))
    view.finish_load(NOW)
    selector = f'{K}.pcieRoot == "pci0000:80" && {K}.numaNode == 1'
    pod = pending_with(selector)
    placed = decider.decide(view, PROFILE, pod, now=NOW)
    assert isinstance(placed, Decision) and placed.node == "n2"
    assert [g.index for c in placed.reservation.containers for g in c.gpus] == [1]
    verdicts = {v.node: (v.fits, v.reason) for v in decider.verdicts(view, PROFILE, pod)}
    assert verdicts == {"n1": (False, f"no GPU meets selector {selector!r}"), "n2": (True, "")}


def test_a_model_selector_that_errors_is_the_reason() -> None:
    """One that does not keeps the shape path: the rule has nothing to do for it."""
    bad = f'{T}.model.matches("(")'
    message = chosen(claim_pod(bad))
    assert isinstance(message, str) and message.startswith(f"2 nodes: selector {bad!r}: "), message
    assert DeviceSelectorRule().check(pod_facts(claim_pod(bad)), cluster()) is not None
    fine = claim_pod(f'{T}.model.matches("A1")')
    assert DeviceSelectorRule().check(pod_facts(fine), cluster()) is None
    assert isinstance(chosen(fine), tuple)


def test_what_a_selector_reads_decides_it_so_gpus_alike_there_share_one_evaluation() -> None:
    numa = f"{K}.numaNode == 1 && {C}.memory.isGreaterThan(quantity('1Gi'))"
    assert reads(numa) == frozenset(
        {
            ("device", "attributes", "resource.kubernetes.io", "numaNode"),
            ("device", "capacity", "gpu.tessera.dev", "memory"),
        }
    )
    assert reads(f'{T}.exists(k, k == "index")') is None  # the whole map
    assert reads(f"{T}[{T}.model].size() > 0") is None  # an index that is not a plain string
    # Many GPUs, two NUMA nodes: the verdicts agree with a full evaluation on each.
    gpus = [gpu(index=i % 8, uuid=f"GPU-{i}", numa_node=i % 2) for i in range(64)]
    assert admitted((numa,), gpus) == [i % 2 == 1 for i in range(64)]


def test_a_model_selector_no_gpu_model_meets_is_named_in_the_pending_reason() -> None:
    view = view_of("a", "b", gpus=2)  # A100s
    for name in ("a", "b"):
        view.set_facts(wire.facts(name, labels=DRA_LABELS, at=NOW))
    wanted = f'{T}.model.startsWith("B200")'
    waiting = decider.decide(view, PROFILE, pending_with(wanted), now=NOW)
    assert isinstance(waiting, decider.Waiting)
    assert [(r.reason, r.nodes) for r in waiting.rejection.reasons] == [
        (
            f"too few GPUs of an allowed model or group (no GPU model here meets selector "
            f"{wanted!r})",
            2,
        )
    ]
    placed = decider.decide(view, PROFILE, pending_with(f'{T}.model.startsWith("A1")'), now=NOW)
    assert isinstance(placed, Decision)
