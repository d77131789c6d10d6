"""Tenants' quota charges (``tessera-tenants``): the pure rules in ``commit.py``, the view's
usage, and the key names, table-driven."""

from __future__ import annotations

import msgspec
import pytest

from services.placer.core.groups import TenancyConfig, TenantQuota
from services.placer.core.quota import Usage
from services.placer.rules import charges, commit, repairs
from services.placer.rules.repairs import RecordFacts
from services.placer.rules.state import ClusterView
from shared import subjects
from shared.messages.ledger import Booking, PodClaim, TenantCharge, TenantLedger
from tests.placer.test_translate import NOW, booking

QUOTA = TenantQuota(tenant="ml", gpus=2, gpu_memory_mib=20_000)
MEMORY_ONLY = TenantQuota(tenant="ml", gpu_memory_mib=20_000)


def pod(uid: str, *pieces: tuple[int, int, int]) -> Booking:
    return booking(uid, *(pieces or ((0, 8192, 300),)))


def charge(uid: str, *pieces: tuple[int, int, int], at: float = NOW) -> TenantCharge:
    return charges.charge_of(pod(uid, *pieces), now=at)


def ledger(*charges: TenantCharge) -> TenantLedger:
    return TenantLedger(tenant="ml", charges=charges, updated_at=NOW)


def test_a_charge_counts_the_shares_and_memory_its_booking_holds() -> None:
    two = charge("a", (0, 8192, 300), (1, 4096, 300))
    assert (two.gpus, two.gpu_memory_mib, two.commit, two.node) == (2, 12288, "c-a", "n1")
    assert charges.charged(ledger(two, charge("b"))) == Usage(gpus=3, gpu_memory_mib=20480)
    assert charges.charged(None) == Usage()


@pytest.mark.parametrize(
    ("held", "asked", "written", "refused"),
    [
        pytest.param((), ["a"], ["a"], {}, id="room"),
        pytest.param((), ["a", "b"], ["a", "b"], {}, id="together-both-fit"),
        pytest.param(("a",), ["b", "c"], ["a", "b"], {"c-c": "GPU quota"}, id="second-over"),
        pytest.param(("a", "b"), ["c"], None, {"c-c": "GPU quota"}, id="full"),
        pytest.param(("a",), ["a"], None, {}, id="retry-of-a-listed-commit"),
    ],
)
def test_charges_fit_the_quota_one_after_the_other_on_the_entry_as_read(
    held: tuple[str, ...], asked: list[str], written: list[str] | None, refused: dict[str, str]
) -> None:
    entry = ledger(*(charge(uid) for uid in held)) if held else None
    result, why = charges.charge_all(
        entry, "ml", QUOTA, [charge(uid) for uid in asked], now=NOW + 1
    )
    if written is None:
        assert result is None
    else:
        assert result is not None
        assert [c.pod_uid for c in result.charges] == written
        assert result.updated_at == NOW + 1
    assert set(why) == set(refused)
    for key, fragment in refused.items():
        assert fragment in why[key]


def test_a_memory_quota_refuses_what_the_share_count_allows() -> None:
    big = charge("big", (0, 16_000, 500))
    result, why = charges.charge_all(ledger(charge("a")), "ml", QUOTA, [big], now=NOW)
    assert result is None
    left = "remaining 11808 MiB"
    assert why == {
        big.commit: f"tenant ml: GPU memory quota exceeded (requested 16000 MiB, {left})"
    }


def test_an_entry_holds_a_bounded_number_of_charges() -> None:
    full = ledger(*(charge(f"p{i}", (0, 1, 1)) for i in range(charges.MAX_TENANT_CHARGES)))
    huge = TenantQuota(tenant="ml", gpus=10**9)
    result, why = charges.charge_all(full, "ml", huge, [charge("one-more")], now=NOW)
    assert result is None
    assert why == {
        "c-one-more": "tenant ml: 2000 placements are charged against its quota, the most one "
        "usage entry holds"
    }


def test_no_quota_charges_everything() -> None:
    many = [charge(f"p{i}") for i in range(5)]
    result, why = charges.charge_all(None, "ml", None, many, now=NOW)
    assert result is not None and len(result.charges) == 5 and why == {}


def test_adopting_and_giving_back_charges_are_idempotent() -> None:
    entry = ledger(charge("a"), charge("b"))
    over = charge("c", (0, 30_000, 100))
    adopted = charges.with_charge(entry, "ml", over, now=NOW)  # whatever the quota
    assert adopted is not None and [c.pod_uid for c in adopted.charges] == ["a", "b", "c"]
    assert charges.with_charge(adopted, "ml", over, now=NOW) is None
    left = charges.without_charge(entry, "c-a", now=NOW)
    assert left is not None and [c.pod_uid for c in left.charges] == ["b"]
    assert charges.without_charge(left, "c-a", now=NOW) is None
    assert charges.without_charge(None, "c-a", now=NOW) is None


def test_the_fence_of_a_charge_is_a_released_record_of_its_commit_holding_nothing() -> None:
    fence = charges.fence_of(charge("a"), "ml")
    record = commit.released_record(None, fence, now=NOW + 3)
    key = subjects.assignment_key(fence.node, fence.pod_uid)
    assert (key, record.state, record.commit, record.containers) == ("n1.a", "released", "c-a", ())


# --- reconciliation of charges ---------------------------------------------------------------

A = pod("a")
CORES = pod("a", (0, 0, 300))  # a share of the SMs only: no GPU memory


def test_only_what_a_quota_limits_is_charged() -> None:
    gpus_only = TenantQuota(tenant="ml", gpus=4)
    assert charges.counts_against(gpus_only, charge("a", (0, 0, 300)))
    assert not charges.counts_against(MEMORY_ONLY, charge("a", (0, 0, 300)))
    assert charges.counts_against(MEMORY_ONLY, charge("a"))
    assert not charges.counts_against(TenantQuota(tenant="ml"), charge("a"))


def live(state: str = "reserved", commit_id: str = "c-a") -> RecordFacts:
    return RecordFacts(
        key="n1.a",
        node="n1",
        pod_uid="a",
        state=state,  # type: ignore[arg-type]
        commit=commit_id,
        decided_at=NOW,
    )


def placed(held: Booking = A) -> PodClaim:
    return PodClaim(pod_uid="a", state="placed", booking=held, updated_at=NOW)


@pytest.mark.parametrize(
    ("charges", "quotas", "ledgers", "claims", "records", "expected"),
    [
        pytest.param(
            [charge("a")], {"ml": QUOTA}, {"n1": (A,)}, {}, [], [], id="charged-and-booked"
        ),
        pytest.param([charge("a")], {"ml": QUOTA}, {}, {}, [live()], [], id="charged-and-recorded"),
        pytest.param([charge("a")], {"ml": QUOTA}, {}, {"a": placed()}, [], [], id="claimed"),
        pytest.param([charge("a")], {"ml": QUOTA}, {}, {}, [], ["drop-charge"], id="never-booked"),
        pytest.param(
            [charge("a")], {"ml": QUOTA}, {}, {}, [live("released")], ["drop-charge"], id="released"
        ),
        pytest.param(
            [], {"ml": QUOTA}, {"n1": (A,)}, {}, [live()], ["adopt-charge"], id="uncharged"
        ),
        pytest.param([], {"ml": QUOTA}, {"n1": (A,)}, {}, [], [], id="uncharged-but-not-recorded"),
        pytest.param([], {}, {"n1": (A,)}, {}, [live()], [], id="tenant-without-quota"),
        pytest.param(
            [], {"ml": MEMORY_ONLY}, {"n1": (CORES,)}, {}, [live()], [], id="nothing-it-limits"
        ),
        pytest.param(
            [],
            {"ml": QUOTA},
            {"n1": (booking("a", cpu=500),)},
            {},
            [live()],
            [],
            id="no-gpu-no-charge",
        ),
    ],
)
def test_reconciliation_derives_the_charges_from_bookings_records_and_claims(
    charges: list[TenantCharge],
    quotas: dict[str, TenantQuota],
    ledgers: dict[str, tuple[Booking, ...]],
    claims: dict[str, PodClaim],
    records: list[RecordFacts],
    expected: list[str],
) -> None:
    tenants = {"ml": ledger(*charges)} if charges else {}
    planned = repairs.plan_charge_repairs(
        tenants, quotas, ledgers, claims, records, now=NOW + 100, grace_s=10
    )
    assert [r.kind for r in planned] == expected
    for repair in planned:
        assert repair.tenant == "ml" and repair.pod_uid == "a"
        assert (repair.charge is not None) == (repair.kind == "drop-charge")


def test_reconciliation_leaves_charges_and_bookings_that_may_be_in_flight() -> None:
    recent = charge("a", at=NOW + 95)
    young = msgspec.structs.replace(A, decided_at=NOW + 95)
    assert (
        repairs.plan_charge_repairs(
            {"ml": ledger(recent)}, {"ml": QUOTA}, {}, {}, [], now=NOW + 100, grace_s=10
        )
        == []
    )
    assert (
        repairs.plan_charge_repairs(
            {}, {"ml": QUOTA}, {"n1": (young,)}, {}, [live()], now=NOW + 100, grace_s=10
        )
        == []
    )


# --- the view --------------------------------------------------------------------------------


def test_the_view_counts_charges_of_pods_it_has_not_seen_booked_and_frees_what_is_given_back() -> (
    None
):
    view = ClusterView(
        inventory_stale_s=30, task_mix_window=10, tenancy=TenancyConfig(quotas=(QUOTA,))
    )
    view.finish_load(NOW)
    assert view.set_tenant_ledger(ledger(charge("a"), charge("b", (0, 1000, 100))), 5)
    assert view.tenancy.used("ml") == Usage(gpus=2, gpu_memory_mib=9192)
    assert not view.set_tenant_ledger(ledger(), 4)  # older: ignored
    freed = view.freed
    assert view.set_tenant_ledger(ledger(charge("a")), 6)
    assert view.freed == freed + 1
    assert view.tenancy.used("ml") == Usage(gpus=1, gpu_memory_mib=8192)
    assert view.tenants.ledger("ml")[1] == 6
    assert view.set_tenant_ledger(ledger(charge("a"), charge("c")), 7)
    assert view.freed == freed + 1  # more charged: nothing freed


@pytest.mark.parametrize(
    ("tenant", "key"),
    [
        ("team-a", "team-a"),
        ("Team.A", "_5465616d2e41"),
        ("a..b", "_612e2e62"),
        ("under_score", "_756e6465725f73636f7265"),
    ],
)
def test_tenant_keys_are_single_kv_keys_no_namespace_can_collide_with(
    tenant: str, key: str
) -> None:
    assert subjects.tenant_key(tenant) == key
    with pytest.raises(ValueError, match="empty"):
        subjects.tenant_key("")
