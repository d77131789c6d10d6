"""In a mixed cluster a device-plugin pod is kept off DRA nodes (``tessera.dev/gpu-api=dra``),
with a counted reason, as a claim pod is kept on them: pure rules, then the placer's view."""

from __future__ import annotations

import msgspec

from services.placer.core.model import ContainerRequest, Decision, PodRequest
from services.placer.rules import decider, keptout, translate
from shared.dra.devices import DEVICE_CLASS
from shared.messages.pods import PodPending
from shared.messages.resourceclaims import ClaimUse, DeviceRequest, PodResourceClaim
from tests.placer import wire
from tests.placer.test_translate import NOW, booking
from tests.placer.test_view import PROFILE, view_of

DRA_LABELS = {"tessera.dev/gpu-api": "dra"}


def plugin_pod(*, shares: int = 1, memory_mib: int | None = 4096) -> PodRequest:
    return PodRequest(
        uid="p",
        namespace="ml",
        name="p",
        containers=(ContainerRequest(name="main", shares=shares, share_memory_mib=memory_mib),),
    )


def claim_pending(uid: str) -> PodPending:
    claim = PodResourceClaim(
        name="gpu",
        claim=f"{uid}-gpu",
        uid=f"c-{uid}",
        template=True,
        requests=(
            DeviceRequest(
                name="gpu", device_class=DEVICE_CLASS, capacity={"memory": "4Gi", "compute": "25"}
            ),
        ),
        used_by=(ClaimUse(container="main"),),
    )
    return msgspec.structs.replace(wire.pending(uid, shares=0), claims=(claim,))


def test_a_device_plugin_pod_is_kept_off_dra_nodes_and_a_claim_pod_is_not() -> None:
    claim_ask = PodRequest(
        uid="c",
        namespace="ml",
        name="c",
        containers=(ContainerRequest(name="resourceclaims/c-gpu/gpu", shares=1),),
    )
    cpu_only = plugin_pod(shares=0)
    assert keptout.needs_device_plugin(plugin_pod())
    assert not keptout.needs_device_plugin(claim_ask) and not keptout.needs_device_plugin(cpu_only)
    nodes = {"dra": ("d1", "d2"), "memory_units": ("u1", "d2")}
    assert keptout.kept_out(plugin_pod(), **nodes) == {
        "d1": keptout.DRA_ONLY,
        "d2": keptout.DRA_ONLY,
    }
    assert keptout.kept_out(plugin_pod(memory_mib=None), **nodes) == {
        "d1": keptout.DRA_ONLY,
        "d2": keptout.DRA_ONLY,
        "u1": translate.MEMORY_UNITS_ONLY,
    }
    assert keptout.kept_out(claim_ask, **nodes) == {} and keptout.kept_out(cpu_only, **nodes) == {}
    assert keptout.offers_dra(wire.facts("d1", labels=DRA_LABELS))
    assert not keptout.offers_dra(wire.facts("n1")) and not keptout.offers_dra(None)


def test_the_placer_keeps_device_plugin_pods_off_dra_nodes_with_a_counted_reason() -> None:
    view = view_of("plugin", "dra", gpus=1)
    view.set_facts(wire.facts("dra", labels=DRA_LABELS, at=NOW))
    assert view.dra_nodes == {"dra"}
    pod = translate.pod_request(wire.pending("dp", memory_mib=4096))
    for _ in range(3):
        placed = decider.decide(view, PROFILE, pod, now=NOW)
        assert isinstance(placed, Decision) and placed.node == "plugin"
    claimed = decider.decide(view, PROFILE, translate.pod_request(claim_pending("cp")), now=NOW)
    assert isinstance(claimed, Decision) and claimed.node == "dra"
    assert {v.node: v.reason for v in decider.verdicts(view, PROFILE, pod) if not v.fits} == {
        "dra": keptout.DRA_ONLY
    }
    on_dra = decider.decide_on(view, PROFILE, pod, "dra", now=NOW)
    assert isinstance(on_dra, decider.Waiting) and on_dra.rejection.unresolvable
    assert [(r.reason, r.nodes) for r in on_dra.rejection.reasons] == [(keptout.DRA_ONLY, 1)]
    # The device-plugin node full: the pod waits, and the DRA node is counted apart.
    whole_gpu = booking("x", (0, 81920, 1000), whole=True)
    view.set_booking("plugin", "x", msgspec.structs.replace(whole_gpu, node="plugin"), 1)
    waiting = decider.decide(view, PROFILE, pod, now=NOW)
    assert isinstance(waiting, decider.Waiting)
    reasons = {r.reason: r.nodes for r in waiting.rejection.reasons}
    assert reasons[keptout.DRA_ONLY] == 1 and sum(reasons.values()) == 2
    message = translate.rejection_message(
        wire.pending("dp"),
        waiting.rejection.reasons,
        nodes=2,
        unresolvable=False,
        decided_at=NOW,
        placer_id="placer-0",
    ).message
    assert "1 DRA mode (ask through a gpu.tessera.dev ResourceClaim to run there)" in message
    view.set_facts(wire.facts("dra", at=NOW))  # the node went back to device-plugin mode
    assert view.dra_nodes == set()
