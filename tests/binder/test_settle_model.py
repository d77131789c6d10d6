"""The binder's settling and withdrawing of surplus records (``plan.surplus``) under every
interleaving hypothesis finds: a state machine over one node's pods of one shape.

The kubelet admits pods in any order, and the device plugin serves each admission from the oldest
``bound`` record of the shape, whoever's it is. While the plugin is down the kubelet rejects the
pods it admits. Pods end at any moment. The binder settles an admitted pod's ``bound`` record
(``plan.served_elsewhere``) and withdraws an ended pod's (``plan.withdrawable``), each in two
steps with any number of other steps between them, as the service does: it takes where the pods
are, then reads the records and writes by compare-and-set. A placer releases an ended pod's
record once the binder has published ``PodDeleted``: once that record is no longer ``bound``.

After every step: the ``bound`` records are at least as many as the pods waiting for an
Allocate, so no waiting pod is ever refused for want of a record, nor served one of other
slices the gate would have let in. In the end, once nobody waits, no record is left ``bound``:
the gate is open again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from services.binder.rules.plan import Admission, served_elsewhere, withdrawable
from shared.messages.assignments import AssignmentRecord, settled
from tests.binder.builders import record, slices

SHAPE = slices("main", (0, 8192, 10))


@dataclass
class Settling:
    """A settle or withdrawal the binder began: the pod, and where every pod was when it
    looked."""

    pod: str
    admission: dict[str, Admission]


@dataclass
class Node:
    pods: dict[str, Admission] = field(default_factory=dict)
    records: dict[str, AssignmentRecord] = field(default_factory=dict)
    """Pod -> its record; a released record is gone."""
    order: list[str] = field(default_factory=list)
    """Pods in the order their records were bound (the plugin serves the oldest first)."""

    def bound(self) -> list[str]:
        return [p for p in self.order if p in self.records and self.records[p].state == "bound"]

    def waiting(self) -> list[str]:
        return [p for p, where in self.pods.items() if where == "waiting"]


class SettleMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.node = Node()
        self.plugin_up = True
        self.next_pod = 0
        self.settling: list[Settling] = []
        self.refused = 0

    # --- the cluster ---------------------------------------------------------------------------

    @rule()
    def bind_a_pod(self) -> None:
        pod = f"p{self.next_pod}"
        self.next_pod += 1
        self.node.pods[pod] = "waiting"
        self.node.records[pod] = record(pod, pod, SHAPE, state="bound", bound_at=self.next_pod)
        self.node.order.append(pod)

    @precondition(lambda self: bool(self.node.waiting()))
    @rule(pick=st.integers(0, 1000))
    def kubelet_admits(self, pick: int) -> None:
        waiting = self.node.waiting()
        pod = waiting[pick % len(waiting)]
        if not self.plugin_up:  # the kubelet fails the pod itself
            self.node.pods[pod] = "ended"
            return
        bound = self.node.bound()
        if not bound:
            self.refused += 1
            self.node.pods[pod] = "ended"
            return
        served = bound[0]
        self.node.records[served] = settled(self.node.records[served], now=1.0)
        self.node.pods[pod] = "admitted"

    @rule()
    def plugin_goes_down_or_up(self) -> None:
        self.plugin_up = not self.plugin_up

    @precondition(lambda self: any(w != "ended" for w in self.node.pods.values()))
    @rule(pick=st.integers(0, 1000))
    def pod_ends(self, pick: int) -> None:
        live = [p for p, where in self.node.pods.items() if where != "ended"]
        self.node.pods[live[pick % len(live)]] = "ended"

    @rule(pick=st.integers(0, 1000))
    def placer_releases(self, pick: int) -> None:
        """``PodDeleted`` handled: whatever record the ended pod had is released. The binder
        publishes it once the pod's record is not ``bound`` (allocated, or withdrawn)."""
        ended = [
            p
            for p, where in self.node.pods.items()
            if where == "ended" and self.node.records.get(p, SETTLED).state != "bound"
        ]
        if ended:
            self.node.records.pop(ended[pick % len(ended)], None)

    # --- the binder's settling and withdrawing, each in two steps ------------------------------

    @rule(pick=st.integers(0, 1000), ended=st.booleans())
    def binder_looks_at_the_pods(self, pick: int, ended: bool) -> None:
        """Begin to settle an admitted pod's ``bound`` record, or to withdraw an ended one's."""
        candidates = [
            p
            for p, where in self.node.pods.items()
            if where == ("ended" if ended else "admitted")
            and self.node.records.get(p, SETTLED).state == "bound"
        ]
        if candidates:
            pod = candidates[pick % len(candidates)]
            self.settling.append(Settling(pod=pod, admission=dict(self.node.pods)))

    @precondition(lambda self: bool(self.settling))
    @rule(pick=st.integers(0, 1000))
    def binder_reads_the_records_and_acts(self, pick: int) -> None:
        attempt = self.settling.pop(pick % len(self.settling))
        self._act(attempt)

    def _act(self, attempt: Settling) -> None:
        own = self.node.records.get(attempt.pod)
        others = [r for p, r in self.node.records.items() if p != attempt.pod]
        if own is None:
            return
        if attempt.admission[attempt.pod] == "ended":
            if withdrawable(own, others, attempt.admission):
                del self.node.records[attempt.pod]
        elif served_elsewhere(own, others, attempt.admission):
            self.node.records[attempt.pod] = settled(own, now=2.0)

    # --- what must hold ------------------------------------------------------------------------

    @invariant()
    def no_waiting_pod_lacks_a_record(self) -> None:
        assert len(self.node.bound()) >= len(self.node.waiting()), self.node
        assert self.refused == 0

    def teardown(self) -> None:
        """Everyone admitted or ended, the binder done: no record left ``bound``, so the gate is
        open again."""
        self.plugin_up = True
        while self.node.waiting():
            self.kubelet_admits(0)
        for pod in list(self.node.pods):
            if self.node.records.get(pod, SETTLED).state == "bound":
                self._act(Settling(pod=pod, admission=dict(self.node.pods)))
        left = [p for p in self.node.pods if self.node.records.get(p, SETTLED).state == "bound"]
        assert not left, (left, self.node)
        assert self.refused == 0


SETTLED = msgspec.structs.replace(record("x", "x", SHAPE), state="allocated", allocated_at=1.0)
"""Stands for a record that is gone (released): nothing bound."""

SettleMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
TestSettle = SettleMachine.TestCase


def test_an_admitted_pod_that_ends_keeps_its_record_for_the_pod_whose_record_it_took() -> None:
    """p1 is admitted first, from p0's record (the oldest), and ends before p0 is admitted. Its
    own record is ``bound``, but p0 needs it: withdrawing it, as the binder did for every
    ``bound`` record of a pod that ended, left p0's Allocate nothing to take (the search of the
    machine above, with its invariant on live pods' records only, found this case)."""
    machine = SettleMachine()
    machine.bind_a_pod()
    machine.bind_a_pod()
    machine.kubelet_admits(pick=1)
    assert machine.node.pods == {"p0": "waiting", "p1": "admitted"}
    machine.pod_ends(pick=1)
    machine.binder_looks_at_the_pods(pick=0, ended=True)
    machine.binder_reads_the_records_and_acts(pick=0)
    machine.no_waiting_pod_lacks_a_record()
    machine.kubelet_admits(pick=0)
    assert machine.node.pods == {"p0": "admitted", "p1": "ended"}
    machine.teardown()
