"""Events the simulated components write about an object, as ``events.k8s.io/v1`` Events (which
the core v1 view shows to ``kubectl describe``): the kubelet's and the claim controller's."""

from __future__ import annotations

import contextlib

from tessera.devcluster.objects import ApiObjects
from tessera.devcluster.resources import EVENT, ApiError, Obj, micro_timestamp


def record_event(
    api: ApiObjects,
    regarding: Obj,
    *,
    kind: str,
    reason: str,
    note: str,
    controller: str,
    instance: str,
    action: str,
    type_: str = "Warning",
) -> None:
    """Write one Event about ``regarding`` (an object of ``kind``); a refused write is dropped,
    as a recorder drops what it cannot write."""
    meta = regarding.get("metadata") or {}
    namespace = meta.get("namespace") or "default"
    with contextlib.suppress(ApiError):
        api.create(
            EVENT,
            {
                "metadata": {
                    "generateName": f"{meta.get('name', 'event')}.",
                    "namespace": namespace,
                },
                "eventTime": micro_timestamp(api.clock()),
                "reportingController": controller,
                "reportingInstance": instance,
                "action": action,
                "reason": reason,
                "type": type_,
                "note": note[:1024],
                "regarding": {
                    "apiVersion": regarding.get("apiVersion", "v1"),
                    "kind": kind,
                    "namespace": meta.get("namespace", ""),
                    "name": meta.get("name", ""),
                    "uid": meta.get("uid", ""),
                },
            },
            namespace,
        )
