"""The resource types the API test double serves, and what the real API server does with each.

A :class:`ResourceType` says where a type lives (group, version, plural, namespaced), which fields
its field selectors support, and its strategy: defaults filled on create, validation on create and
update, and which part of the object the main resource and each subresource may change (``status``
changes through the main resource are dropped, spec changes through ``/status`` are dropped, as the
API server's registry strategies do). Adding a type is adding an entry to :data:`RESOURCES`.

Events are stored once, as ``events.k8s.io/v1``; the core ``v1`` Event view is converted on the
way in and out, so ``kubectl describe`` (core events) sees what a controller wrote with
events.k8s.io, as on a real cluster.
"""

from __future__ import annotations

import base64
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from shared.quantity import QuantityError, canonical, parse_quantity
from tessera.devcluster import dra
from tessera.devcluster.jsoncopy import clone

Obj = dict[str, Any]

_DNS_SUBDOMAIN: Final = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
_DNS_LABEL: Final = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_QUALIFIED_NAME: Final = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)


class ApiError(Exception):
    """An API failure, answered as a ``metav1.Status`` with the same code and reason."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        *,
        kind: str = "",
        name: str = "",
        causes: tuple[Obj, ...] = (),
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.kind = kind
        self.name = name
        self.causes = causes
        """``details.causes``: one ``StatusCause`` (reason, message, field) per field error."""

    def status(self) -> Obj:
        details: Obj = {}
        if self.name:
            details["name"] = self.name
        if self.kind:
            details["kind"] = self.kind
        if self.causes:
            details["causes"] = list(self.causes)
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "details": details,
            "code": self.code,
        }


def not_found(plural: str, name: str, group: str = "") -> ApiError:
    qualified = f"{plural}.{group}" if group else plural
    return ApiError(404, "NotFound", f'{qualified} "{name}" not found', kind=plural, name=name)


def conflict(plural: str, name: str, group: str = "", message: str = "") -> ApiError:
    qualified = f"{plural}.{group}" if group else plural
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {qualified} "{name}": '
        + (
            message
            or "the object has been modified; please apply your changes to the latest "
            "version and try again"
        ),
        kind=plural,
        name=name,
    )


_CAUSE_TYPES: Final = (
    ("Invalid value", "FieldValueInvalid"),
    ("Required value", "FieldValueRequired"),
    ("Duplicate value", "FieldValueDuplicate"),
    ("Unsupported value", "FieldValueNotSupported"),
    ("Forbidden", "FieldValueForbidden"),
    ("Too long", "FieldValueTooLong"),
    ("Too many", "FieldValueTooMany"),
    ("Not found", "FieldValueNotFound"),
)
"""``field.ErrorType`` as written in an error -> the ``CauseType`` of its ``StatusCause``."""


def field_cause(error: str) -> Obj:
    """A ``StatusCause`` of one field error written ``"field: Type: detail"``, as the API server
    builds it from a ``field.Error``: the field, and the message without it."""
    field, _, body = error.partition(": ")
    if not body:
        field, body = "", error
    reason = next((cause for kind, cause in _CAUSE_TYPES if body.startswith(kind)), "")
    return {"reason": reason or "FieldValueInvalid", "message": body, "field": field}


def invalid(kind: str, name: str, causes: list[str]) -> ApiError:
    """422 Invalid, with each field error as a cause (kubectl prints them from the causes)."""
    return ApiError(
        422,
        "Invalid",
        f'{kind} "{name}" is invalid: {", ".join(causes)}',
        kind=kind,
        name=name,
        causes=tuple(field_cause(cause) for cause in causes),
    )


def timestamp(at: float) -> str:
    """RFC 3339 with seconds, as ``metav1.Time`` serialises."""
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_timestamp(at: float) -> str:
    """RFC 3339 with microseconds, as ``metav1.MicroTime`` serialises."""
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# --- pods ------------------------------------------------------------------------------------


def _pod_fields(pod: Obj) -> dict[str, str]:
    meta, spec, status = pod.get("metadata", {}), pod.get("spec", {}), pod.get("status", {})
    return {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "spec.nodeName": spec.get("nodeName", "") or "",
        "spec.restartPolicy": spec.get("restartPolicy", "") or "",
        "spec.schedulerName": spec.get("schedulerName", "") or "",
        "spec.serviceAccountName": spec.get("serviceAccountName", "") or "",
        "spec.hostNetwork": "true" if spec.get("hostNetwork") else "false",
        "status.phase": status.get("phase", "") or "",
        "status.podIP": status.get("podIP", "") or "",
        "status.nominatedNodeName": status.get("nominatedNodeName", "") or "",
    }


_EXTENDED_PREFIXES: Final = ("kubernetes.io/", "requests.")


def _is_extended(resource: str) -> bool:
    return "/" in resource and not resource.startswith(_EXTENDED_PREFIXES)


def _validate_resources(container: Obj, path: str) -> list[str]:
    errors: list[str] = []
    resources = container.get("resources") or {}
    for section in ("limits", "requests"):
        for name, value in (resources.get(section) or {}).items():
            where = f"{path}.resources.{section}[{name}]"
            try:
                number = parse_quantity(value)
            except QuantityError:
                errors.append(f"{where}: Invalid value: {value!r}: must be a quantity")
                continue
            if number < 0:
                errors.append(
                    f"{where}: Invalid value: {value!r}: must be greater than or equal to 0"
                )
            if _is_extended(name) and number.denominator != 1:
                errors.append(f"{where}: Invalid value: {value!r}: must be an integer")
    limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
    for name, value in requests.items():
        if name in limits:
            try:
                request, limit = parse_quantity(value), parse_quantity(limits[name])
            except QuantityError:
                continue
            if _is_extended(name) and request != limit:
                errors.append(
                    f"{path}.resources.requests[{name}]: Invalid value: {value!r}: must be equal "
                    f"to {name} limit of {limits[name]}"
                )
            elif request > limit:
                errors.append(
                    f"{path}.resources.requests: Invalid value: {value!r}: must be less than or "
                    f"equal to {name} limit of {limits[name]}"
                )
        elif _is_extended(name):
            errors.append(
                f"{path}.resources.limits: Required value: Limit must be set for non "
                f"overcommitable resources"
            )
    return errors


def _validate_pod(pod: Obj) -> list[str]:
    errors: list[str] = []
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return ["spec: Required value"]
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        errors.append("spec.containers: Required value")
        containers = []
    names: set[str] = set()
    for kind in ("containers", "initContainers"):
        for i, container in enumerate(spec.get(kind) or []):
            path = f"spec.{kind}[{i}]"
            if not isinstance(container, dict):
                errors.append(f"{path}: Invalid value: must be an object")
                continue
            name = container.get("name", "")
            if not name or not _DNS_LABEL.match(name):
                errors.append(f"{path}.name: Invalid value: {name!r}: must be a DNS-1123 label")
            elif name in names:
                errors.append(f"{path}.name: Duplicate value: {name!r}")
            names.add(name)
            if not container.get("image"):
                errors.append(f"{path}.image: Required value")
            errors.extend(_validate_resources(container, path))
    return errors + dra.validate_pod_claims(spec)


def _default_pod(pod: Obj, now: float) -> None:
    spec = pod.setdefault("spec", {})
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("priority", 0)
    for kind in ("containers", "initContainers"):
        for container in spec.get(kind) or []:
            resources = container.setdefault("resources", {})
            limits = resources.get("limits") or {}
            requests = resources.setdefault("requests", {}) if limits else resources.get("requests")
            for name, value in limits.items():
                if requests is not None:
                    requests.setdefault(name, value)  # the API server defaults requests to limits
            container.setdefault("terminationMessagePath", "/dev/termination-log")
            container.setdefault("terminationMessagePolicy", "File")
            container.setdefault("imagePullPolicy", "IfNotPresent")
    _canonical_quantities(spec)
    status = pod.setdefault("status", {})
    status.setdefault("phase", "Pending")
    status.setdefault("qosClass", _qos_class(spec))


def _canonical_quantities(spec: Obj) -> None:
    """Write every container's resource quantities as the API server stores them (``1`` and
    ``"1"`` are both ``"1"``, ``"1024Mi"`` is ``"1Gi"``): it decodes them into Quantities, so a
    client sending the same value in another form changes nothing (a second ``kubectl apply``
    sends ``1`` where the pod holds ``"1"``). A value that is not a quantity stays as written, for
    validation to refuse."""
    for kind in ("containers", "initContainers"):
        for container in spec.get(kind) or []:
            if not isinstance(container, dict):
                continue
            resources = container.get("resources") or {}
            for section in ("limits", "requests"):
                quantities = resources.get(section)
                if isinstance(quantities, dict) and quantities:
                    resources[section] = {k: _canonical(v) for k, v in quantities.items()}


def _canonical(value: Any) -> Any:
    try:
        return canonical(value)
    except QuantityError:
        return value if isinstance(value, str) else str(value)


def _qos_class(spec: Obj) -> str:
    requests: list[Obj] = []
    limits: list[Obj] = []
    for container in spec.get("containers") or []:
        resources = container.get("resources") or {}
        requests.append(resources.get("requests") or {})
        limits.append(resources.get("limits") or {})
    if not any(r.get(k) for r in requests + limits for k in ("cpu", "memory")):
        return "BestEffort"
    guaranteed = all(
        lim.get(k) and req.get(k, lim.get(k)) == lim.get(k)
        for req, lim in zip(requests, limits, strict=True)
        for k in ("cpu", "memory")
    )
    return "Guaranteed" if guaranteed else "Burstable"


_POD_MUTABLE_SPEC: Final = (
    "`spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,"
    "`spec.tolerations` (only additions to existing tolerations),"
    "`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)"
    ",`spec.schedulingGates` (only removals)"
)


def _comparable_pod_spec(spec: Obj) -> Obj:
    spec = clone(spec)
    for kind in ("containers", "initContainers"):
        for container in spec.get(kind) or []:
            container.pop("image", None)
    for key in (
        "activeDeadlineSeconds",
        "tolerations",
        "terminationGracePeriodSeconds",
        "schedulingGates",
    ):
        spec.pop(key, None)
    return spec


def _gates_added(old: Obj, new: Obj) -> bool:
    """Whether ``new`` names a scheduling gate ``old`` did not (gates may only be removed)."""
    before = {g.get("name") for g in old.get("schedulingGates") or []}
    return any(g.get("name") not in before for g in new.get("schedulingGates") or [])


def _update_pod(old: Obj, new: Obj, subresource: str) -> list[str]:
    if subresource == "status":
        new["spec"] = clone(old.get("spec", {}))
        _keep(new, old, "metadata", "deletionTimestamp")
        _keep(new, old, "metadata", "ownerReferences")
        return dra.validate_pod_claim_statuses(new)
    new["status"] = clone(old.get("status", {}))
    _canonical_quantities(new.setdefault("spec", {}))
    if _comparable_pod_spec(old.get("spec", {})) != _comparable_pod_spec(
        new.get("spec", {})
    ) or _gates_added(old.get("spec", {}), new.get("spec", {})):
        return [
            f"spec: Forbidden: pod updates may not change fields other than {_POD_MUTABLE_SPEC}"
        ]
    return []


def _keep(new: Obj, old: Obj, section: str, key: str) -> None:
    target = new.setdefault(section, {})
    if key in old.get(section, {}):
        target[key] = clone(old[section][key])
    else:
        target.pop(key, None)


# --- nodes -----------------------------------------------------------------------------------


def _node_fields(node: Obj) -> dict[str, str]:
    return {
        "metadata.name": node.get("metadata", {}).get("name", ""),
        "spec.unschedulable": "true" if node.get("spec", {}).get("unschedulable") else "false",
    }


def _update_node(old: Obj, new: Obj, subresource: str) -> list[str]:
    if subresource == "status":
        new["spec"] = clone(old.get("spec", {}))
    else:
        new["status"] = clone(old.get("status", {}))
    return []


# --- events ----------------------------------------------------------------------------------


def _event_fields(event: Obj) -> dict[str, str]:
    regarding = event.get("regarding") or {}
    source = event.get("deprecatedSource") or {}
    fields = {
        "metadata.name": event.get("metadata", {}).get("name", ""),
        "metadata.namespace": event.get("metadata", {}).get("namespace", ""),
        "reason": event.get("reason", "") or "",
        "type": event.get("type", "") or "",
        "reportingComponent": event.get("reportingController", "") or "",
        "source": source.get("component", "") or "",
    }
    for key in ("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath"):
        value = regarding.get(key, "") or ""
        fields[f"involvedObject.{key}"] = value
        fields[f"regarding.{key}"] = value
    return fields


def _validate_event(event: Obj) -> list[str]:
    """events.k8s.io/v1 ValidateEventCreate."""
    errors = []
    controller = event.get("reportingController") or ""
    if not controller:
        errors.append("reportingController: Required value")
    elif not _QUALIFIED_NAME.match(controller) or len(controller) > 316:
        errors.append(
            f"reportingController: Invalid value: {controller!r}: must be a qualified name"
        )
    instance = event.get("reportingInstance") or ""
    if not instance:
        errors.append("reportingInstance: Required value")
    elif len(instance) > 128:
        errors.append("reportingInstance: Too long: may not be longer than 128")
    for key in ("action", "reason"):
        value = event.get(key) or ""
        if not value:
            errors.append(f"{key}: Required value")
        elif len(value) > 128:
            errors.append(f"{key}: Too long: may not be longer than 128")
    if len((event.get("note") or "").encode()) > 1024:
        errors.append("note: Too long: may not be longer than 1024")
    if not event.get("eventTime"):
        errors.append("eventTime: Required value")
    if event.get("type") not in ("Normal", "Warning"):
        errors.append(
            f'type: Unsupported value: {event.get("type")!r}: supported values: "Normal", "Warning"'
        )
    series = event.get("series")
    if series is not None:
        if not isinstance(series.get("count"), int) or series["count"] < 2:
            errors.append("series.count: Invalid value: should be at least 2")
        if not series.get("lastObservedTime"):
            errors.append("series.lastObservedTime: Required value")
    return errors


_CORE_TO_EVENTS: Final = {
    "involvedObject": "regarding",
    "message": "note",
    "source": "deprecatedSource",
    "firstTimestamp": "deprecatedFirstTimestamp",
    "lastTimestamp": "deprecatedLastTimestamp",
    "count": "deprecatedCount",
    "reportingComponent": "reportingController",
}
_EVENTS_TO_CORE: Final = {v: k for k, v in _CORE_TO_EVENTS.items()}


def event_to_core(event: Obj) -> Obj:
    """An events.k8s.io/v1 Event as the core v1 API shows it."""
    core = {_EVENTS_TO_CORE.get(k, k): v for k, v in event.items() if v is not None}
    core["apiVersion"], core["kind"] = "v1", "Event"
    series = event.get("series")
    if series:  # core v1 reports the series count and last time in count/lastTimestamp as well
        core["count"] = series.get("count", core.get("count"))
    return core


def event_from_core(event: Obj) -> Obj:
    """A core v1 Event as stored (events.k8s.io/v1)."""
    stored = {_CORE_TO_EVENTS.get(k, k): v for k, v in event.items() if v is not None}
    stored["apiVersion"], stored["kind"] = "events.k8s.io/v1", "Event"
    return stored


def _validate_core_event(event: Obj) -> list[str]:
    errors = []
    if not (event.get("regarding") or {}).get("name") and not (event.get("regarding") or {}).get(
        "kind"
    ):
        errors.append("involvedObject: Required value")
    if event.get("type") not in (None, "Normal", "Warning"):
        errors.append(f"type: Unsupported value: {event.get('type')!r}")
    return errors


# --- leases and namespaces -------------------------------------------------------------------


def _validate_lease(lease: Obj) -> list[str]:
    spec = lease.get("spec") or {}
    errors = []
    duration = spec.get("leaseDurationSeconds")
    if duration is not None and (not isinstance(duration, int) or duration <= 0):
        errors.append("spec.leaseDurationSeconds: Invalid value: must be greater than 0")
    transitions = spec.get("leaseTransitions")
    if transitions is not None and (not isinstance(transitions, int) or transitions < 0):
        errors.append("spec.leaseTransitions: Invalid value: must be greater than or equal to 0")
    return errors


def _default_namespace(namespace: Obj, now: float) -> None:
    meta = namespace.setdefault("metadata", {})
    if meta.get("name"):  # the API server labels every namespace with its name
        labels = meta.get("labels") or {}
        meta["labels"] = {**labels, "kubernetes.io/metadata.name": meta["name"]}
    namespace.setdefault("spec", {"finalizers": ["kubernetes"]})
    namespace.setdefault("status", {"phase": "Active"})


def _default_secret(secret: Obj, now: float) -> None:
    """A Secret as the API server stores it: of type Opaque when none is given, and
    ``stringData`` merged into ``data`` (base64), as its conversion does on every write."""
    if not secret.get("type"):
        secret["type"] = "Opaque"
    written = secret.pop("stringData", None) or {}
    if written:
        data = dict(secret.get("data") or {})
        for key, value in written.items():
            data[key] = base64.b64encode(str(value).encode()).decode()
        secret["data"] = data


# --- admission webhook configurations ---------------------------------------------------------


def _validate_webhook_configuration(configuration: Obj) -> list[str]:
    """What admissionregistration.k8s.io/v1 refuses in a webhook configuration, as far as the
    API test double calls the webhooks (names, a client config, v1 reviews, side effects)."""
    errors: list[str] = []
    seen: set[str] = set()
    for i, hook in enumerate(configuration.get("webhooks") or []):
        where = f"webhooks[{i}]"
        name = hook.get("name") or ""
        if not name or "." not in name:
            errors.append(
                f"{where}.name: Invalid value: {name!r}: should be a domain with at least three "
                "segments"
            )
        elif name in seen:
            errors.append(f"{where}.name: Duplicate value: {name!r}")
        seen.add(name)
        client = hook.get("clientConfig") or {}
        if bool(client.get("url")) == bool(client.get("service")):
            errors.append(
                f"{where}.clientConfig: Required value: exactly one of url or service is required"
            )
        if "v1" not in (hook.get("admissionReviewVersions") or []):
            errors.append(f"{where}.admissionReviewVersions: Invalid value: must include v1")
        if hook.get("sideEffects") not in ("None", "NoneOnDryRun"):
            errors.append(
                f"{where}.sideEffects: Unsupported value: {hook.get('sideEffects')!r}: "
                'supported values: "None", "NoneOnDryRun"'
            )
        if hook.get("failurePolicy", "Fail") not in ("Fail", "Ignore"):
            errors.append(
                f"{where}.failurePolicy: Unsupported value: {hook.get('failurePolicy')!r}"
            )
    return errors


# --- the table -------------------------------------------------------------------------------


def _meta_fields(obj: Obj) -> dict[str, str]:
    meta = obj.get("metadata", {})
    return {"metadata.name": meta.get("name", ""), "metadata.namespace": meta.get("namespace", "")}


def _no_defaults(obj: Obj, now: float) -> None:
    return None


def _no_errors(obj: Obj) -> list[str]:
    return []


def _no_update_rules(old: Obj, new: Obj, subresource: str) -> list[str]:
    return []


def _same(obj: Obj) -> Obj:
    return obj


@dataclass(frozen=True)
class ResourceType:
    """One resource type and its API server strategy."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    fields: Callable[[Obj], dict[str, str]] = _meta_fields
    """The object's selectable fields (every type supports metadata.name/namespace)."""
    subresources: frozenset[str] = frozenset()
    defaults: Callable[[Obj, float], None] = _no_defaults
    validate: Callable[[Obj], list[str]] = _no_errors
    """Errors on create (and update), each "field: what is wrong"."""
    update_rules: Callable[[Obj, Obj, str], list[str]] = _no_update_rules
    """(old, new, subresource): adjusts ``new`` to what the endpoint may change; errors."""
    storage: str = ""
    """Storage shared with another view of the same objects (core Events); default: own."""
    to_view: Callable[[Obj], Obj] = _same
    from_view: Callable[[Obj], Obj] = _same
    schema: bool = False
    """Decoded by the strict OpenAPI schema of its kind (``schema.py``) before validation."""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def store_key(self) -> str:
        return self.storage or f"{self.plural}.{self.group}"

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    def supported_fields(self) -> frozenset[str]:
        return frozenset(self.fields({"metadata": {}}))


POD: Final = ResourceType(
    group="",
    version="v1",
    plural="pods",
    kind="Pod",
    namespaced=True,
    fields=_pod_fields,
    subresources=frozenset({"status", "binding", "log"}),
    defaults=_default_pod,
    validate=_validate_pod,
    update_rules=_update_pod,
)
NODE: Final = ResourceType(
    group="",
    version="v1",
    plural="nodes",
    kind="Node",
    namespaced=False,
    fields=_node_fields,
    subresources=frozenset({"status"}),
    update_rules=_update_node,
)
NAMESPACE: Final = ResourceType(
    group="",
    version="v1",
    plural="namespaces",
    kind="Namespace",
    namespaced=False,
    defaults=_default_namespace,
)
LEASE: Final = ResourceType(
    group="coordination.k8s.io",
    version="v1",
    plural="leases",
    kind="Lease",
    namespaced=True,
    validate=_validate_lease,
)
EVENT: Final = ResourceType(
    group="events.k8s.io",
    version="v1",
    plural="events",
    kind="Event",
    namespaced=True,
    fields=_event_fields,
    validate=_validate_event,
)
CORE_EVENT: Final = ResourceType(
    group="",
    version="v1",
    plural="events",
    kind="Event",
    namespaced=True,
    fields=_event_fields,
    validate=_validate_core_event,
    storage=EVENT.store_key,
    to_view=event_to_core,
    from_view=event_from_core,
)

SECRET: Final = ResourceType(
    group="",
    version="v1",
    plural="secrets",
    kind="Secret",
    namespaced=True,
    defaults=_default_secret,
)
STORED_ONLY: Final = tuple(
    ResourceType(group=group, version=version, plural=plural, kind=kind, namespaced=namespaced)
    for group, version, plural, kind, namespaced in (
        ("", "v1", "configmaps", "ConfigMap", True),
        ("", "v1", "services", "Service", True),
        ("", "v1", "serviceaccounts", "ServiceAccount", True),
        ("apps", "v1", "deployments", "Deployment", True),
        ("apps", "v1", "daemonsets", "DaemonSet", True),
        ("apps", "v1", "statefulsets", "StatefulSet", True),
        ("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True),
        ("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", True),
        ("rbac.authorization.k8s.io", "v1", "roles", "Role", True),
        ("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", True),
        ("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False),
        ("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False),
    )
)
"""Kinds a Helm chart holds, stored as written (no controller acts on them): so that ``helm``
can map, look up and dry-run a release against the test double (``--dry-run=server``)."""
MUTATING_WEBHOOKS: Final = ResourceType(
    group="admissionregistration.k8s.io",
    version="v1",
    plural="mutatingwebhookconfigurations",
    kind="MutatingWebhookConfiguration",
    namespaced=False,
    validate=_validate_webhook_configuration,
)
VALIDATING_WEBHOOKS: Final = ResourceType(
    group="admissionregistration.k8s.io",
    version="v1",
    plural="validatingwebhookconfigurations",
    kind="ValidatingWebhookConfiguration",
    namespaced=False,
    validate=_validate_webhook_configuration,
)

DEVICE_CLASS: Final = ResourceType(
    group=dra.GROUP,
    version=dra.VERSION,
    plural="deviceclasses",
    kind="DeviceClass",
    namespaced=False,
    defaults=dra.default_generation,
    validate=dra.validate_device_class,
    update_rules=dra.update_device_class,
    schema=True,
)
RESOURCE_SLICE: Final = ResourceType(
    group=dra.GROUP,
    version=dra.VERSION,
    plural="resourceslices",
    kind="ResourceSlice",
    namespaced=False,
    fields=dra.slice_fields,
    defaults=dra.default_generation,
    validate=dra.validate_slice,
    update_rules=dra.update_slice,
    schema=True,
)
RESOURCE_CLAIM: Final = ResourceType(
    group=dra.GROUP,
    version=dra.VERSION,
    plural="resourceclaims",
    kind="ResourceClaim",
    namespaced=True,
    subresources=frozenset({"status"}),
    defaults=dra.default_claim,
    validate=dra.validate_claim,
    update_rules=dra.update_claim,
    schema=True,
)
RESOURCE_CLAIM_TEMPLATE: Final = ResourceType(
    group=dra.GROUP,
    version=dra.VERSION,
    plural="resourceclaimtemplates",
    kind="ResourceClaimTemplate",
    namespaced=True,
    defaults=dra.default_template,
    validate=dra.validate_template,
    update_rules=dra.update_template,
    schema=True,
)

RESOURCES: Final[tuple[ResourceType, ...]] = (
    POD,
    NODE,
    NAMESPACE,
    LEASE,
    EVENT,
    CORE_EVENT,
    SECRET,
    MUTATING_WEBHOOKS,
    VALIDATING_WEBHOOKS,
    DEVICE_CLASS,
    RESOURCE_SLICE,
    RESOURCE_CLAIM,
    RESOURCE_CLAIM_TEMPLATE,
    *STORED_ONLY,
)


def find(group: str, version: str, plural: str) -> ResourceType | None:
    for resource in RESOURCES:
        if (resource.group, resource.version, resource.plural) == (group, version, plural):
            return resource
    return None


def new_uid() -> str:
    return str(uuid.uuid4())


def valid_name(name: str) -> bool:
    return bool(name) and len(name) <= 253 and bool(_DNS_SUBDOMAIN.match(name))
