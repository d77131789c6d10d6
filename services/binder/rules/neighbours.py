"""Pure: the pods on each node that Tessera did not place, as other pods' constraints see them.

Pod affinity, anti-affinity and topology spread count every pod on a node, Tessera's or not. The
placer knows its own pods from their bookings; the others reach it in the node's facts
(``NodeFacts.pods``): their namespace, labels and pod (anti-)affinity, kept here per node from the
pod informer's changes. A pod counts once it is bound and until it terminates (kube-scheduler
leaves terminating pods out of spreading).
"""

from __future__ import annotations

from collections.abc import Mapping

from shared.kubeobjects import Pod
from shared.messages.constraints import ExistingPod
from shared.scheduling import constraints_of


def existing_pod(pod: Pod, namespaces: Mapping[str, Mapping[str, str]]) -> ExistingPod:
    """``pod`` as the placer counts it: its terms as ``shared.scheduling`` reads them (a term
    it cannot read is left out: the API server accepted the pod, so kube-scheduler would read
    it, but Tessera does not implement it and has refused such pods of its own)."""
    affinity = anti_affinity = None
    if pod.spec.affinity is not None:
        constraints, _ = constraints_of(pod, namespaces)
        if constraints is not None:
            affinity, anti_affinity = constraints.pod_affinity, constraints.pod_anti_affinity
    meta = pod.metadata
    return ExistingPod(
        uid=meta.uid,
        namespace=meta.namespace,
        labels=dict(meta.labels or {}),
        affinity=affinity,
        anti_affinity=anti_affinity,
    )


class NodePods:
    """The counted pods of each node, by informer key."""

    def __init__(self) -> None:
        self._where: dict[str, tuple[str, ExistingPod]] = {}
        self._on: dict[str, dict[str, ExistingPod]] = {}

    def put(self, key: str, node: str | None, pod: ExistingPod | None) -> set[str]:
        """Pod ``key`` is now ``pod`` on ``node`` (None: it counts nowhere); the nodes whose
        pods changed."""
        changed: set[str] = set()
        before = self._where.pop(key, None)
        if before is not None:
            on = self._on[before[0]]
            del on[key]
            if not on:
                del self._on[before[0]]
        if node is not None and pod is not None:
            self._where[key] = (node, pod)
            self._on.setdefault(node, {})[key] = pod
        if before != ((node, pod) if node is not None and pod is not None else None):
            if before is not None:
                changed.add(before[0])
            if node is not None and pod is not None:
                changed.add(node)
        return changed

    def on(self, node: str) -> tuple[ExistingPod, ...]:
        """The counted pods of ``node``, in a stable order (by uid)."""
        pods = self._on.get(node)
        if not pods:
            return ()
        return tuple(sorted(pods.values(), key=lambda p: p.uid))
