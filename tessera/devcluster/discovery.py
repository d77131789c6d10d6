"""What real ``kubectl`` needs beyond the REST endpoints: discovery, version, server-side tables.

- Discovery (``/api``, ``/api/v1``, ``/apis``, ``/apis/<group>/<version>``) in the legacy
  (unaggregated) format, which clients fall back to when the answer is not the aggregated
  ``apidiscovery.k8s.io`` type; built from :data:`~tessera.devcluster.resources.RESOURCES`, with
  kubectl's short names (``po``, ``no``, ``ns``, ``ev``) and verbs.
- ``/version``.
- Server-side printing: a list or get asked for ``as=Table`` (what ``kubectl get`` asks for)
  answers a ``meta.k8s.io/v1`` Table with the columns the real API server prints for pods
  (``-o wide`` shows the priority-1 columns: IP, node, ...), nodes, resource claims (their state:
  ``pending``, ``allocated,reserved``, ``deleted``...) and resource slices (node, driver, pool),
  and Name/Age for the rest (``pkg/printers/internalversion/printers.go``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, Final

from tessera.devcluster.resources import RESOURCES, Obj, ResourceType

SERVER_VERSION: Final = {
    "major": "1",
    "minor": "37",
    "gitVersion": "v1.37.0-tessera-sim",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2025-01-01T00:00:00Z",
    "goVersion": "go1.22.0",
    "compiler": "gc",
    "platform": "linux/amd64",
}
SHORT_NAMES: Final = {"pods": ["po"], "nodes": ["no"], "namespaces": ["ns"], "events": ["ev"]}
CATEGORIES: Final = {"pods": ["all"]}
VERBS: Final = ["create", "delete", "get", "list", "patch", "update", "watch"]
SUBRESOURCE_VERBS: Final = {
    "status": ["get", "patch", "update"],
    "binding": ["create"],
    "log": ["get"],
}


def _groups() -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for resource in RESOURCES:
        if resource.group:
            versions = groups.setdefault(resource.group, [])
            if resource.version not in versions:
                versions.append(resource.version)
    return groups


def _resource_list(group: str, version: str) -> Obj | None:
    chosen = [r for r in RESOURCES if (r.group, r.version) == (group, version)]
    if not chosen:
        return None
    entries: list[Obj] = []
    for resource in chosen:
        entry: Obj = {
            "name": resource.plural,
            "singularName": resource.kind.lower(),
            "namespaced": resource.namespaced,
            "kind": resource.kind,
            "verbs": VERBS,
        }
        if resource.plural in SHORT_NAMES and not group:
            entry["shortNames"] = SHORT_NAMES[resource.plural]
        if resource.plural in CATEGORIES:
            entry["categories"] = CATEGORIES[resource.plural]
        entries.append(entry)
        for sub in sorted(resource.subresources):
            entries.append(
                {
                    "name": f"{resource.plural}/{sub}",
                    "singularName": "",
                    "namespaced": resource.namespaced,
                    "kind": "Binding" if sub == "binding" else resource.kind,
                    "verbs": SUBRESOURCE_VERBS.get(sub, ["get"]),
                }
            )
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/{version}" if group else version,
        "resources": entries,
    }


def discovery(path: str, server_address: str) -> Obj | None:
    """The discovery or version document at ``path``, or None when ``path`` is not one."""
    parts = [p for p in path.split("/") if p]
    if parts == ["version"]:
        return dict(SERVER_VERSION)
    if parts == ["api"]:
        return {
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [
                {"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}
            ],
        }
    if parts == ["api", "v1"]:
        return _resource_list("", "v1")
    if parts == ["apis"]:
        return {
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [
                {
                    "name": group,
                    "versions": [{"groupVersion": f"{group}/{v}", "version": v} for v in versions],
                    "preferredVersion": {
                        "groupVersion": f"{group}/{versions[0]}",
                        "version": versions[0],
                    },
                }
                for group, versions in sorted(_groups().items())
            ],
        }
    if len(parts) == 2 and parts[0] == "apis" and parts[1] in _groups():
        versions = _groups()[parts[1]]
        return {
            "kind": "APIGroup",
            "apiVersion": "v1",
            "name": parts[1],
            "versions": [{"groupVersion": f"{parts[1]}/{v}", "version": v} for v in versions],
            "preferredVersion": {
                "groupVersion": f"{parts[1]}/{versions[0]}",
                "version": versions[0],
            },
        }
    if len(parts) == 3 and parts[0] == "apis":
        return _resource_list(parts[1], parts[2])
    if parts[:2] == ["openapi", "v3"]:
        return _openapi_v3(parts[2:])
    return None


def _group_versions() -> list[tuple[str, str]]:
    seen: list[tuple[str, str]] = []
    for resource in RESOURCES:
        if (resource.group, resource.version) not in seen:
            seen.append((resource.group, resource.version))
    return seen


def _gv_path(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


def _openapi_v3(rest: list[str]) -> Obj | None:
    """OpenAPI v3 as far as kubectl reads it to learn that the server validates fields itself
    (``fieldValidation`` on each kind's PATCH): then ``kubectl create -f`` sends
    ``fieldValidation=Strict`` instead of downloading schemas to validate client-side."""
    if not rest:
        return {
            "paths": {
                _gv_path(g, v): {"serverRelativeURL": f"/openapi/v3/{_gv_path(g, v)}?hash=sim"}
                for g, v in _group_versions()
            }
        }
    wanted = "/".join(rest)
    for group, version in _group_versions():
        if _gv_path(group, version) != wanted:
            continue
        paths: Obj = {}
        for resource in RESOURCES:
            if (resource.group, resource.version) != (group, version):
                continue
            scope = "/namespaces/{namespace}" if resource.namespaced else ""
            gvk = {"group": group, "version": version, "kind": resource.kind}
            paths[f"/{wanted}{scope}/{resource.plural}/{{name}}"] = {
                "patch": {
                    "operationId": f"patch{resource.kind}",
                    "x-kubernetes-action": "patch",
                    "x-kubernetes-group-version-kind": gvk,
                    "parameters": [
                        {"name": name, "in": "query", "schema": {"type": "string"}}
                        for name in ("dryRun", "fieldManager", "fieldValidation", "force")
                    ],
                    "responses": {"200": {"description": "OK"}},
                }
            }
        return {
            "openapi": "3.0.0",
            "info": {"title": "Kubernetes (Tessera API test double)", "version": "v1.37.0"},
            "paths": paths,
            "components": {"schemas": {}},
        }
    return None


# --- server-side printing --------------------------------------------------------------------


def wants_table(accept: str) -> bool:
    """Whether the Accept header asks for a ``meta.k8s.io`` Table (as kubectl get does)."""
    return any("as=Table" in part and "g=meta.k8s.io" in part for part in accept.split(","))


def human_age(created: str, now: float) -> str:
    """``creationTimestamp`` as kubectl prints ages (``12s``, ``5m``, ``3h``, ``2d``)."""
    try:
        at = datetime.strptime(created, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except (TypeError, ValueError):
        return "<unknown>"
    seconds = max(0, int(now - at))
    if seconds < 120:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 10:
        return f"{minutes}m{seconds % 60}s" if seconds % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 48:
        return f"{hours}h"
    return f"{hours // 24}d"


Column = tuple[str, str, int, str]
"""(name, type, priority, description)."""

_NAME: Final[Column] = ("Name", "string", 0, "Name must be unique within a namespace.")
_AGE: Final[Column] = ("Age", "string", 0, "CreationTimestamp of the object.")


def _pod_status(pod: Obj) -> str:
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    reason = status.get("reason") or status.get("phase") or "Pending"
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting")
        if waiting and waiting.get("reason"):
            reason = waiting["reason"]
    if meta.get("deletionTimestamp"):
        reason = "Terminating"
    return str(reason)


def _pod_row(pod: Obj, now: float) -> list[Any]:
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    containers = spec.get("containers") or []
    statuses = status.get("containerStatuses") or []
    ready = sum(1 for c in statuses if c.get("ready"))
    restarts = sum(int(c.get("restartCount") or 0) for c in statuses)
    gates = spec.get("readinessGates") or []
    return [
        pod["metadata"]["name"],
        f"{ready}/{len(containers)}",
        _pod_status(pod),
        restarts,
        human_age(pod["metadata"].get("creationTimestamp", ""), now),
        status.get("podIP") or "<none>",
        spec.get("nodeName") or "<none>",
        status.get("nominatedNodeName") or "<none>",
        f"{len(gates)}" if gates else "<none>",
    ]


_POD_COLUMNS: Final[Sequence[Column]] = (
    _NAME,
    ("Ready", "string", 0, "The aggregate readiness state of this pod for accepting traffic."),
    ("Status", "string", 0, "The aggregate status of the containers in this pod."),
    (
        "Restarts",
        "string",
        0,
        "The number of times the containers in this pod have been restarted.",
    ),
    _AGE,
    ("IP", "string", 1, "IP address allocated to the pod."),
    ("Node", "string", 1, "Name of the node this pod is bound to."),
    ("Nominated Node", "string", 1, "Name of the node this pod is nominated to."),
    ("Readiness Gates", "string", 1, "Pod readiness gates."),
)


def _node_row(node: Obj, now: float) -> list[Any]:
    meta, spec, status = (
        node.get("metadata") or {},
        node.get("spec") or {},
        node.get("status") or {},
    )
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    state = "Ready" if ready and ready.get("status") == "True" else "NotReady"
    if spec.get("unschedulable"):
        state += ",SchedulingDisabled"
    roles = sorted(
        key.split("/", 1)[1]
        for key in (meta.get("labels") or {})
        if key.startswith("node-role.kubernetes.io/")
    )
    addresses = {a.get("type"): a.get("address") for a in status.get("addresses") or []}
    info = status.get("nodeInfo") or {}
    return [
        meta.get("name", ""),
        state,
        ",".join(roles) or "<none>",
        human_age(meta.get("creationTimestamp", ""), now),
        info.get("kubeletVersion", ""),
        addresses.get("InternalIP") or "<none>",
        addresses.get("ExternalIP") or "<none>",
        info.get("osImage", ""),
        info.get("kernelVersion", ""),
        info.get("containerRuntimeVersion", ""),
    ]


_NODE_COLUMNS: Final[Sequence[Column]] = (
    _NAME,
    ("Status", "string", 0, "The status of the node"),
    ("Roles", "string", 0, "The roles of the node"),
    _AGE,
    ("Version", "string", 0, "Kubelet Version reported by the node."),
    ("Internal-IP", "string", 1, "List of internal IPs."),
    ("External-IP", "string", 1, "List of external IPs."),
    ("OS-Image", "string", 1, "OS image reported by the node."),
    ("Kernel-Version", "string", 1, "Kernel version reported by the node."),
    ("Container-Runtime", "string", 1, "Container runtime and version."),
)


def _claim_state(claim: Obj) -> str:
    """``resourceClaimState``: deleted, pending, allocated, reserved, comma-joined."""
    meta, status = claim.get("metadata") or {}, claim.get("status") or {}
    states = ["deleted"] if meta.get("deletionTimestamp") else []
    if status.get("allocation") is None:
        if not meta.get("deletionTimestamp"):
            states.append("pending")
    else:
        states.append("allocated")
        if status.get("reservedFor"):
            states.append("reserved")
    return ",".join(states)


def _claim_row(claim: Obj, now: float) -> list[Any]:
    meta = claim.get("metadata") or {}
    return [
        meta.get("name", ""),
        _claim_state(claim),
        human_age(meta.get("creationTimestamp", ""), now),
    ]


_CLAIM_COLUMNS: Final[Sequence[Column]] = (
    _NAME,
    ("State", "string", 0, "A summary of the current state (allocated, pending, reserved, etc.)."),
    _AGE,
)


def _slice_row(resource_slice: Obj, now: float) -> list[Any]:
    meta, spec = resource_slice.get("metadata") or {}, resource_slice.get("spec") or {}
    return [
        meta.get("name", ""),
        spec.get("nodeName") or "",
        spec.get("driver") or "",
        (spec.get("pool") or {}).get("name") or "",
        human_age(meta.get("creationTimestamp", ""), now),
    ]


_SLICE_COLUMNS: Final[Sequence[Column]] = (
    _NAME,
    ("Node", "string", 0, "NodeName identifies the node which provides the resources."),
    ("Driver", "string", 0, "Driver identifies the DRA driver providing the capacity."),
    ("Pool", "string", 0, "Name is used to identify the pool."),
    _AGE,
)


def _generic_row(obj: Obj, now: float) -> list[Any]:
    meta = obj.get("metadata") or {}
    return [meta.get("name", ""), human_age(meta.get("creationTimestamp", ""), now)]


PRINTERS: Final[dict[str, tuple[Sequence[Column], Callable[[Obj, float], list[Any]]]]] = {
    "pods": (_POD_COLUMNS, _pod_row),
    "nodes": (_NODE_COLUMNS, _node_row),
    "resourceclaims": (_CLAIM_COLUMNS, _claim_row),
    "resourceslices": (_SLICE_COLUMNS, _slice_row),
}


def table(
    resource: ResourceType,
    objects: Sequence[Obj],
    *,
    now: float,
    resource_version: str,
    include_object: str = "Metadata",
    continue_token: str = "",
) -> Obj:
    """A ``meta.k8s.io/v1`` Table of ``objects`` (already in their API view)."""
    columns, row = PRINTERS.get(resource.plural, ((_NAME, _AGE), _generic_row))
    rows = []
    for obj in objects:
        entry: Obj = {"cells": row(obj, now)}
        if include_object == "Object":
            entry["object"] = {"kind": resource.kind, "apiVersion": resource.api_version, **obj}
        elif include_object != "None":
            entry["object"] = {
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": obj.get("metadata") or {},
            }
        rows.append(entry)
    metadata: Obj = {"resourceVersion": resource_version}
    if continue_token:
        metadata["continue"] = continue_token
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": metadata,
        "columnDefinitions": [
            {
                "name": name,
                "type": kind,
                "format": "name" if name == "Name" else "",
                "description": description,
                "priority": priority,
            }
            for name, kind, priority, description in columns
        ],
        "rows": rows,
    }
