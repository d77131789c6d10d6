"""Reconciliation on becoming leader: finish what a previous leader left half done.

Every placed claim is looked at again (:meth:`~services.binder.binding.PlacementBinder.reconcile`:
a previous leader may have stopped anywhere between a record's write and its Binding), every
allocated record's pod marked (:meth:`~services.binder.reporting.Reporter.reconcile`), and each
pod whose assignment record is left but whose pod is gone (:func:`~services.binder.rules.plan.
repair`) is handed to the pod workers to end, as one the informer saw go: they withdraw its record
when its GPUs were never allocated and publish ``PodDeleted``, trying again until it is done.
Ended there, and only there, a pod is ended once: the informer may report it gone at the same
moment, and two ends at once each published ``PodDeleted``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from services.binder.rules.plan import repair
from services.binder.sync import PodRef
from shared.kubeobjects import Pod
from shared.runtime.records import RecordMirror

log = logging.getLogger(__name__)


def reconcile(
    *,
    records: RecordMirror,
    pod_of: Callable[[str], Pod | None],
    end_pod: Callable[[str, PodRef], None],
) -> None:
    """Hand each pod gone whose record is left to ``end_pod`` (the pod workers)."""
    ended = 0
    for view in records.views():
        record = view.record
        if repair(record, pod_of(record.pod_uid)) == "deleted":
            end_pod(record.pod_uid, PodRef(record.namespace, record.name, record.node))
            ended += 1
    if ended:
        log.info("reconciling assignment records", extra={"actions": ended})
