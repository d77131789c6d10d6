"""GPU capacity that claims allocated by another allocator hold (``NodeFacts.claimed``) counts
as used in the placer's view, once: never booked twice, and not counted again for a claim a
booking of Tessera's holds."""

from __future__ import annotations

import msgspec

from services.placer.core.model import Decision
from services.placer.rules import decider, translate
from shared.messages.ledger import BookedContainer, BookedSlice
from shared.messages.nodes import ClaimedGpu
from tests.placer import wire
from tests.placer.test_translate import NOW, booking
from tests.placer.test_view import PROFILE, view_of

DRA = {"tessera.dev/gpu-api": "dra"}


def test_claims_of_another_allocator_are_used_capacity_counted_once() -> None:
    claimed = (
        ClaimedGpu(claim="ml/kube", index=0, memory_mib=8192, core_milli=250),
        ClaimedGpu(claim="ml/whole", index=1, exclusive=True),
        ClaimedGpu(claim="ml/ours", index=2, memory_mib=4096, core_milli=100),
    )
    facts = msgspec.structs.replace(wire.facts("n", labels=DRA), claimed=claimed)
    ours = msgspec.structs.replace(
        booking("p", (2, 4096, 100)),
        namespace="ml",
        containers=(
            BookedContainer(
                container="resourceclaims/ours/gpu",
                gpus=(BookedSlice(index=2, uuid="G2", memory_mib=4096, core_milli=100),),
            ),
        ),
    )
    assert translate.foreign_claims(facts, [ours]) == list(claimed[:2])
    state = translate.node_state("n", wire.inventory("n", 3), facts, [ours], placeable=True)
    gpus = {g.index: g for g in state.gpus}
    assert (gpus[0].memory_reserved_mib, gpus[0].core_milli_reserved) == (8192, 250)
    assert gpus[0].holders == ("resourceclaims/ml/kube",)
    assert gpus[1].exclusive
    assert (gpus[2].memory_reserved_mib, gpus[2].holders) == (4096, ("p",)), "counted once"


def test_the_placer_never_books_a_gpu_another_allocator_holds() -> None:
    view = view_of("n", gpus=1)
    whole = translate.pod_request(wire.pending("a", memory_mib=None, cores=None))
    assert isinstance(decider.decide(view, PROFILE, whole, now=NOW), Decision)
    taken = ClaimedGpu(claim="ml/kube", index=0, memory_mib=4096, core_milli=250)
    view.set_facts(msgspec.structs.replace(wire.facts("n", at=NOW), claimed=(taken,)))
    waiting = decider.decide(view, PROFILE, whole, now=NOW)
    assert isinstance(waiting, decider.Waiting), "a whole GPU with a claim's slice on it"
    share = translate.pod_request(wire.pending("b", memory_mib=wire.GPU_MIB - 4096, cores=75))
    placed = decider.decide(view, PROFILE, share, now=NOW)
    assert isinstance(placed, Decision), "what the claim leaves is free"
    too_much = translate.pod_request(wire.pending("c", memory_mib=wire.GPU_MIB - 4095, cores=10))
    assert isinstance(decider.decide(view, PROFILE, too_much, now=NOW), decider.Waiting)
    view.set_facts(wire.facts("n", at=NOW))  # deallocated
    assert isinstance(decider.decide(view, PROFILE, whole, now=NOW), Decision)
