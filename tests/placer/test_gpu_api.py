"""In a mixed cluster the placer keeps a device-plugin pod off DRA nodes
(``tessera.dev/gpu-api=dra``) with a counted reason, as its claims keep a DRA pod on them: the
core's ``GpuApi`` rule (``core/plugins/gpuapi.py``) through the placer's view, its decisions,
the extender's verdicts and the rejection the binder explains."""

from __future__ import annotations

import msgspec

from services.placer.core.model import Decision
from services.placer.core.plugins.gpuapi import REFUSAL
from services.placer.rules import decider, translate
from shared.messages.pods import PodPending
from shared.messages.resourceclaims import ClaimUse, DeviceRequest, PodResourceClaim
from tests.placer import wire
from tests.placer.test_translate import NOW, booking
from tests.placer.test_view import PROFILE, view_of

DRA_LABELS = {"tessera.dev/gpu-api": "dra"}


def claim_pending(uid: str) -> PodPending:
    claim = PodResourceClaim(
        name="gpu",
        claim=f"{uid}-gpu",
        uid=f"c-{uid}",
        template=True,
        requests=(
            DeviceRequest(
                name="gpu",
                device_class="gpu.tessera.dev",
                capacity={"memory": "4Gi", "compute": "25"},
            ),
        ),
        used_by=(ClaimUse(container="main"),),
    )
    return msgspec.structs.replace(wire.pending(uid, shares=0), claims=(claim,))


def test_the_placer_keeps_device_plugin_pods_off_dra_nodes_with_a_counted_reason() -> None:
    view = view_of("plugin", "dra", gpus=1)
    view.set_facts(wire.facts("dra", labels=DRA_LABELS, at=NOW))
    pod = translate.pod_request(wire.pending("dp", memory_mib=4096))
    for _ in range(3):
        placed = decider.decide(view, PROFILE, pod, now=NOW)
        assert isinstance(placed, Decision) and placed.node == "plugin"
    claimed = decider.decide(view, PROFILE, translate.pod_request(claim_pending("cp")), now=NOW)
    assert isinstance(claimed, Decision) and claimed.node == "dra"
    assert {v.node: v.reason for v in decider.verdicts(view, PROFILE, pod) if not v.fits} == {
        "dra": REFUSAL.reason
    }
    on_dra = decider.decide_on(view, PROFILE, pod, "dra", now=NOW)
    assert isinstance(on_dra, decider.Waiting)
    assert [(r.reason, r.nodes) for r in on_dra.rejection.reasons] == [(REFUSAL.reason, 1)]
    # The device-plugin node full: the pod waits, and the DRA node is counted apart.
    whole_gpu = booking("x", (0, 81920, 1000), whole=True)
    view.set_booking("plugin", "x", msgspec.structs.replace(whole_gpu, node="plugin"), 1)
    waiting = decider.decide(view, PROFILE, pod, now=NOW)
    assert isinstance(waiting, decider.Waiting)
    reasons = {r.reason: r.nodes for r in waiting.rejection.reasons}
    assert reasons[REFUSAL.reason] == 1 and sum(reasons.values()) == 2
    message = translate.rejection_message(
        wire.pending("dp"),
        waiting.rejection.reasons,
        nodes=2,
        unresolvable=False,
        decided_at=NOW,
        placer_id="placer-0",
    ).message
    assert f"1 {REFUSAL.reason}" in message
    view.set_facts(wire.facts("dra", at=NOW))  # the node went back to device-plugin mode
    placed = decider.decide(view, PROFILE, pod, now=NOW)
    assert isinstance(placed, Decision) and placed.node == "dra"
