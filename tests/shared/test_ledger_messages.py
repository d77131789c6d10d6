"""The placer's KV values (``shared/messages/ledger.py``) and the fields added for it."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from shared import codec, subjects
from shared.messages.assignments import AssignmentRecord
from shared.messages.ledger import BookedContainer, BookedSlice, Booking, NodeLedger, PodClaim
from shared.messages.nodes import NodeFacts
from shared.messages.pods import ContainerRequest, PodPending

BOOKING = Booking(
    pod_uid="uid-1",
    namespace="ml",
    name="train-0",
    node="gpu-1.example.com",
    commit="placer-0.0a1b2c3d4e5f",
    tenant="research",
    cpu_milli=4000,
    memory_mib=8192,
    kind="share",
    containers=(
        BookedContainer(
            container="trainer",
            gpus=(BookedSlice(index=0, uuid="GPU-aaaa", memory_mib=20480, core_milli=300),),
            resources={"tessera.dev/gpu": 1},
        ),
    ),
    decided_at=1_700_000_000.5,
    placer_id="placer-0",
)
EXAMPLES: list[Any] = [
    NodeLedger(node="gpu-1.example.com", bookings=(BOOKING,), updated_at=1_700_000_001.0),
    PodClaim(
        pod_uid="uid-1",
        state="placed",
        booking=BOOKING,
        request=PodPending(
            uid="uid-1", namespace="ml", name="train-0", containers=(ContainerRequest(name="c"),)
        ),
        updated_at=1_700_000_001.0,
    ),
    PodClaim(pod_uid="uid-2", state="deleted", updated_at=1.0, reason="pod deleted"),
]


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: type(m).__name__)
def test_ledger_values_round_trip_and_tolerate_unknown_fields(message: Any) -> None:
    data = codec.encode(message)
    assert codec.decode(data, type(message)) == message
    as_dict = msgspec.json.decode(data)
    as_dict["from_the_future"] = 1
    assert codec.decode(msgspec.json.encode(as_dict), type(message)) == message


def test_added_fields_default_for_older_producers() -> None:
    facts = codec.decode(
        b'{"node": "n1", "cpu_allocatable_milli": 1, "memory_allocatable_mib": 1}', NodeFacts
    )
    assert facts.extended_allocatable == {}
    record = codec.decode(
        b'{"pod_uid": "u", "namespace": "n", "name": "p", "node": "n1", "containers": [],'
        b' "state": "reserved", "decided_at": 1.0, "placer_id": "p"}',
        AssignmentRecord,
    )
    assert record.commit == ""


def test_booking_and_claim_keys() -> None:
    uid = "0b7c9e0e-1111-4e2b-8f43-5d1e2a3b4c5d"
    key = subjects.booking_key("gpu-1.example.com", uid)
    assert key == f"book.gpu-1_example_com.{uid}"
    assert subjects.booking_of_key(key) == ("gpu-1.example.com", uid)
    assert subjects.node_bookings("gpu-1.example.com") == "book.gpu-1_example_com.*"
    for not_a_booking in ("gpu-1", f"claim.{uid}", "book.n1", f"book..{uid}", f"pod.n1.{uid}"):
        with pytest.raises(ValueError, match="not a booking key"):
            subjects.booking_of_key(not_a_booking)
    assert subjects.claim_key(uid) == f"claim.{uid}"
    assert subjects.claim_uid(subjects.claim_key(uid)) == uid
    for empty in (subjects.claim_key, lambda uid: subjects.booking_key("n1", uid)):
        with pytest.raises(ValueError, match="pod uid"):
            empty("")
    # Claims share the ledger's bucket (one batch books and claims); no key is both kinds.
    assert subjects.KV_CLAIMS == subjects.KV_LEDGER and subjects.KV_BUCKETS[subjects.KV_CLAIMS] == 5
    # A booking's key is three tokens ("book.*.*"), a claim's two ("claim.*"), an earlier
    # version's whole-node entry one ("*").
    assert (subjects.BOOKING_KEYS, subjects.CLAIM_KEYS) == ("book.*.*", "claim.*")
    assert subjects.LEGACY_LEDGER_KEYS == "*"
    assert subjects.claim_key(uid).split(".") == ["claim", uid]
