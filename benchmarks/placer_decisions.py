"""The placer's decision path without its shell: what one pod costs the pure core and rules.

    .venv/bin/python benchmarks/placer_decisions.py [--nodes 1000] [--gpus 8] [--pods 5500]

A :class:`~services.placer.rules.state.ClusterView` of ``--nodes`` nodes of ``--gpus`` GPUs (the
inventory and node facts ``placer_service.py`` writes), then ``--pods`` of its pods one by one,
each as the service handles it minus the I/O: decided (``decider.decide`` with the service's
profile), booked tentatively, the node's committed state derived (what a commit checks its
booking on), then the booking committed into the ledger; ``--hand-off`` pods later (a quarter
of a second at 250 pods a second) its record is written ``allocated``, as the binder and the
device plugin would, which takes it off its node's queue. Each booking's claim is taken into
the view as the ledger watch takes it, so the task mix is learned, and every five seconds of
the pods' time (4 ms apart: 250 a second) the profile is compiled again with it when
``mix.compile_due`` says so, as the service's upkeep does (its memos go with the old profile).
Prints CPU microseconds per pod (the process's CPU time, so that other processes on the machine
weigh less) and a digest of every decision (node and GPU slices): equal digests mean equal
decisions.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from placer_service import facts, inventory, node_name, pod  # noqa: E402

from services.placer.core.framework import Profile  # noqa: E402
from services.placer.core.model import Decision  # noqa: E402
from services.placer.core.profiles import build_profile  # noqa: E402
from services.placer.rules import decider, mix, translate  # noqa: E402
from services.placer.rules.state import ClusterView  # noqa: E402
from services.placer.shell.upkeep import service_profile  # noqa: E402
from shared import subjects  # noqa: E402
from shared.commits import record_of  # noqa: E402
from shared.messages.assignments import settled  # noqa: E402
from shared.messages.ledger import Booking, PodClaim  # noqa: E402

NOW = 1_000_000.0
MIX_CHECK_S = 5.0
"""As the service's ``mix_check_s``."""


class Compiler:
    """The profile compiled again with the learned mix, as ``shell/upkeep.py`` does it."""

    def __init__(self, view: ClusterView) -> None:
        self.view = view
        self.typical = view.mix.typical()
        self.hosts = view.host_kinds()
        self.profile = self._build()
        self.compiled = (0, NOW)
        self.compiles = 1

    def _build(self) -> Profile:
        return build_profile(
            service_profile("tessera"), typical_tasks=self.typical, hosts=self.hosts
        )

    def check(self, decisions: int, now: float) -> None:
        typical, hosts = self.view.mix.typical(), self.view.host_kinds()
        decided, at = self.compiled
        moved = typical != self.typical or hosts != self.hosts
        if not mix.compile_due(
            moved=moved,
            decisions=decisions - decided,
            judgements=self.view.index.memo_size,
            elapsed_s=now - at,
        ):
            return
        old, self.typical, self.hosts = self.profile, typical, hosts
        self.profile = self._build()
        self.compiled = (decisions, now)
        self.compiles += 1
        index = self.view.index
        for stale in (old, *old.node_policies.values()):
            index.memos.pop(stale, None)
        if not index.memos:
            index.memo_size = 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000, help="nodes in the view")
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per node")
    parser.add_argument("--pods", type=int, default=5500, help="pods decided, one by one")
    parser.add_argument(
        "--hand-off",
        type=int,
        default=60,
        help="pods after its decision that a pod's record is written allocated",
    )
    parser.add_argument("--seed", type=int, default=1, help="seed of the pods drawn")
    args = parser.parse_args()
    view = ClusterView(inventory_stale_s=1e9, task_mix_window=1000)
    for i in range(args.nodes):
        name = node_name(i)
        view.set_inventory(inventory(name, args.gpus, NOW), now=NOW)
        view.set_facts(facts(name, NOW))
    view.finish_load(NOW)
    compiler = Compiler(view)
    checked = NOW
    rng = random.Random(args.seed)
    pods = [pod(n, rng) for n in range(args.pods)]
    digest = hashlib.sha256()
    placed = 0
    booked: list[Booking] = []
    started = time.process_time()
    for n, pending in enumerate(pods):
        now = NOW + n * 0.004
        if now - checked >= MIX_CHECK_S:
            compiler.check(n, now)
            checked = now
        if n >= args.hand_off and n - args.hand_off < len(booked):
            done = booked[n - args.hand_off]
            record = settled(record_of(done, bound_at=now), now=now)
            view.set_record(subjects.assignment_key(done.node, done.pod_uid), record, n + 1)
        decision = decider.decide(view, compiler.profile, translate.pod_request(pending), now=now)
        if not isinstance(decision, Decision):
            digest.update(f"{pending.uid} waits\n".encode())
            continue
        reservation = decision.reservation
        booking = translate.booking_of(
            reservation, pending, tenant="bench", commit=f"c{n}", decided_at=now, placer_id="p"
        )
        view.add_tentative(booking)
        view.committed_state(booking.node)
        view.set_booking(booking.node, booking.pod_uid, booking, n + 1)
        claim = PodClaim(pod_uid=booking.pod_uid, state="placed", booking=booking, updated_at=now)
        view.set_claim(booking.pod_uid, claim, n + 1)
        placed += 1
        booked.append(booking)
        slices = [
            (g.index, g.memory_mib, g.core_milli) for c in reservation.containers for g in c.gpus
        ]
        digest.update(f"{pending.uid} {reservation.node} {slices}\n".encode())
    cpu = time.process_time() - started
    print(
        f"{args.nodes} nodes x {args.gpus} GPUs, {args.pods} pods ({placed} placed): "
        f"{cpu / args.pods * 1e6:.0f} us CPU per pod; profile compiled {compiler.compiles} times; "
        f"decisions {digest.hexdigest()[:16]}"
    )


if __name__ == "__main__":
    main()
