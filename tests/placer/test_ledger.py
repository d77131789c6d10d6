"""The ledger: idempotent reserve/release, and refusal of anything that would over-commit."""

from __future__ import annotations

import pytest

from services.placer.core.index import ClusterIndex
from services.placer.core.ledger import Ledger, book, unbook
from services.placer.core.model import ContainerPlacement, GpuSlice, Reservation
from tests.placer.builders import node


def reservation(
    uid: str = "p1",
    *,
    index: int = 0,
    mib: int = 4_000,
    cores: int = 250,
    cpu: int = 1_000,
    exclusive: bool = False,
) -> Reservation:
    return Reservation(
        pod_uid=uid,
        node="n",
        cpu_milli=cpu,
        memory_mib=1_024,
        containers=(
            ContainerPlacement(
                container="main",
                gpus=(
                    GpuSlice(
                        index=index, uuid="u", memory_mib=mib, core_milli=cores, exclusive=exclusive
                    ),
                ),
            ),
        ),
        kind="share",
    )


@pytest.mark.parametrize(
    ("state", "booking", "problem"),
    [
        pytest.param(
            node("n").gpu(used=800).build(),
            reservation(mib=4_000),
            "GPU 0: 4000 MiB asked, 3200 free",
            id="memory",
        ),
        pytest.param(
            node("n").gpu(used=0, cores_used=900).build(),
            reservation(cores=250),
            "GPU 0: cores over-committed",
            id="cores",
        ),
        pytest.param(
            node("n").gpu(foreign_mib=13_000).build(),
            reservation(mib=4_000),
            "GPU 0: 4000 MiB asked, 3000 free",
            id="foreign-memory",
        ),
        pytest.param(
            node("n").gpu(healthy=False).build(),
            reservation(),
            "GPU 0 is unhealthy",
            id="unhealthy",
        ),
        pytest.param(
            node("n").gpu(exclusive=True).build(),
            reservation(),
            "GPU 0 is held exclusively",
            id="exclusive",
        ),
        pytest.param(
            node("n").gpu(used=10).build(),
            reservation(exclusive=True, cores=1000, mib=0),
            "GPU 0 is not idle",
            id="whole-on-used",
        ),
        pytest.param(
            node("n").gpu(slots=1, slots_used=1).build(),
            reservation(),
            "GPU 0: no logical device left",
            id="slots",
        ),
        pytest.param(
            node("n").cpu(2_000, used=1_500).gpus(1).build(),
            reservation(),
            "insufficient CPU",
            id="cpu",
        ),
        pytest.param(
            node("n").gpus(1).build(), reservation(index=3), "no GPU with index 3", id="no-such-gpu"
        ),
    ],
)
def test_book_refuses_over_commit(state: object, booking: Reservation, problem: str) -> None:
    assert book(state, booking) == problem  # type: ignore[arg-type]


def test_book_then_unbook_restores_the_node() -> None:
    state = node("n").gpus(2).build()
    booked = book(state, reservation())
    assert not isinstance(booked, str)
    assert booked.gpus[0].memory_reserved_mib == 4_000
    assert booked.gpus[0].holders == ("p1",)
    assert booked.gpu_task_kinds == (("share", 1),)
    assert unbook(booked, reservation()) == state


def test_reserve_and_release_are_idempotent() -> None:
    ledger = Ledger()
    state = node("n").gpus(1).build()
    once = ledger.reserve(state, reservation())
    assert not isinstance(once, str)
    assert ledger.reserve(once, reservation()) is once  # redelivered: no double booking
    released = ledger.release("p1", once)
    assert released == state
    assert ledger.release("p1", released) is released  # second release: nothing to give back
    assert "p1" not in ledger


def test_index_reserve_release_round_trip() -> None:
    cluster = ClusterIndex([node("n").gpus(2).build()])
    before = cluster.node("n")
    assert cluster.reserve(reservation()) is None
    assert cluster.reserve(reservation()) is None
    assert cluster.node("n").gpus[0].memory_reserved_mib == 4_000
    assert cluster.release("p1")
    assert not cluster.release("p1")
    assert cluster.node("n") == before
    assert cluster.reserve(reservation(mib=20_000)) == "GPU 0: 20000 MiB asked, 16000 free"
