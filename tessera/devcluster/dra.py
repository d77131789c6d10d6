"""``resource.k8s.io/v1`` in the API test double: DeviceClass and ResourceSlice (cluster-scoped),
ResourceClaim (with ``/status``) and ResourceClaimTemplate (namespaced), each with the strategy
of its registry package in kubernetes/kubernetes (``pkg/registry/resource/<kind>/strategy.go``),
and the pod fields that refer to claims (``spec.resourceClaims``,
``spec.containers[].resources.claims``, ``status.resourceClaimStatuses``,
``pkg/apis/core/validation/validation.go``).

- Decoding: the strict 1.37 OpenAPI schema of each kind (``schema.py``).
- Defaults (``pkg/apis/resource/v1/defaults.go``): a request's ``allocationMode`` is
  ``ExactCount`` and its ``count`` 1, a toleration's ``operator`` is ``Equal``.
- Create: a claim's status is dropped (``PrepareForCreate``); DeviceClass and ResourceSlice get
  ``metadata.generation`` 1, raised by one on each spec change.
- Update: a claim's and a template's spec are immutable; a claim's status changes only through
  ``/status`` (a main-resource write keeps the stored status, a ``/status`` write keeps the
  spec and the metadata but its status part); a slice's driver, pool and node are immutable.
- Validation: ``draspecs.py`` and ``draslices.py``.
- Field selectors: ``spec.nodeName`` and ``spec.driver`` on slices (``toSelectableFields``).
"""

from __future__ import annotations

import json
from typing import Any, Final

from tessera.devcluster.draslices import resource_slice_spec, slice_immutables
from tessera.devcluster.draspecs import claim_status_update, device_claim, device_class_spec
from tessera.devcluster.dravalidation import (
    dns_label,
    dns_subdomain,
    duplicate,
    immutable,
    invalid,
    label_name,
    label_value,
    required,
)
from tessera.devcluster.jsoncopy import clone

Obj = dict[str, Any]

GROUP: Final = "resource.k8s.io"
VERSION: Final = "v1"
FINALIZER: Final = "resource.kubernetes.io/delete-protection"
"""Set by whoever allocates a claim; the claim controller removes it once deallocated."""
POD_CLAIM_ANNOTATION: Final = "resource.kubernetes.io/pod-claim-name"
"""On a claim generated from a template: the name of the pod's claim entry it is for."""


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


# --- defaults --------------------------------------------------------------------------------


def _default_request(request: Obj) -> None:
    request.setdefault("allocationMode", "ExactCount")
    if request["allocationMode"] == "ExactCount" and not request.get("count"):
        request["count"] = 1
    for toleration in request.get("tolerations") or []:
        if isinstance(toleration, dict):
            toleration.setdefault("operator", "Equal")


def default_device_claim(spec: Obj) -> None:
    """``SetDefaults`` of a claim spec's requests (``exactly`` and each ``firstAvailable``)."""
    devices = spec.get("devices") if isinstance(spec, dict) else None
    if not isinstance(devices, dict):
        return
    for request in devices.get("requests") or []:
        if not isinstance(request, dict):
            continue
        if isinstance(request.get("exactly"), dict):
            _default_request(request["exactly"])
        for sub in request.get("firstAvailable") or []:
            if isinstance(sub, dict):
                _default_request(sub)


def default_claim(claim: Obj, now: float) -> None:
    claim["status"] = {}  # status must not be set by a client on create
    default_device_claim(claim.setdefault("spec", {}))


def default_template(template: Obj, now: float) -> None:
    default_device_claim(template.setdefault("spec", {}).get("spec") or {})


def default_generation(obj: Obj, now: float) -> None:
    obj.setdefault("metadata", {})["generation"] = 1


# --- validation ------------------------------------------------------------------------------


def validate_device_class(device_class: Obj) -> list[str]:
    return device_class_spec(device_class.get("spec") or {})


def validate_slice(resource_slice: Obj) -> list[str]:
    return resource_slice_spec(resource_slice.get("spec") or {})


def validate_claim(claim: Obj) -> list[str]:
    devices = (claim.get("spec") or {}).get("devices") or {}
    return device_claim(devices, "spec.devices")


def validate_template(template: Obj) -> list[str]:
    """``ValidateResourceClaimTemplate``: the claim spec, and the template's metadata as
    ``ValidateTemplateObjectMeta`` checks it (label and annotation keys, label values)."""
    spec = template.get("spec") or {}
    meta = spec.get("metadata") or {}
    errors: list[str] = []
    for key, value in (meta.get("labels") or {}).items():
        errors += label_name(key, "spec.metadata.labels")
        errors += label_value(str(value), f"spec.metadata.labels[{key}]")
    for key in meta.get("annotations") or {}:
        errors += label_name(key.lower(), "spec.metadata.annotations")
    devices = (spec.get("spec") or {}).get("devices") or {}
    return errors + device_claim(devices, "spec.spec.devices")


# --- updates ---------------------------------------------------------------------------------


def _bump_generation(old: Obj, new: Obj) -> None:
    generation = (old.get("metadata") or {}).get("generation") or 1
    if old.get("spec") != new.get("spec"):
        generation += 1
    new.setdefault("metadata", {})["generation"] = generation


def update_device_class(old: Obj, new: Obj, subresource: str) -> list[str]:
    _bump_generation(old, new)
    return []


def update_slice(old: Obj, new: Obj, subresource: str) -> list[str]:
    _bump_generation(old, new)
    return slice_immutables(new.get("spec") or {}, old.get("spec") or {})


def update_template(old: Obj, new: Obj, subresource: str) -> list[str]:
    default_template(new, 0.0)
    if new.get("spec") != old.get("spec"):
        return [immutable("spec", _compact(new.get("spec")))]
    return []


_STATUS_KEEPS_METADATA: Final = (
    "labels",
    "annotations",
    "finalizers",
    "ownerReferences",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "generation",
)
"""What a ``/status`` write cannot change in the metadata (``ResetObjectMetaForStatus``)."""


def update_claim(old: Obj, new: Obj, subresource: str) -> list[str]:
    if subresource != "status":
        new["status"] = clone(old.get("status") or {})
        default_device_claim(new.setdefault("spec", {}))
        if new.get("spec") != old.get("spec"):
            return [immutable("spec", _compact(new.get("spec")))]
        return []
    new["spec"] = clone(old.get("spec") or {})
    meta, old_meta = new.setdefault("metadata", {}), old.get("metadata") or {}
    for key in _STATUS_KEEPS_METADATA:
        if key in old_meta:
            meta[key] = clone(old_meta[key])
        else:
            meta.pop(key, None)
    _drop_deallocated_device_status(old, new)
    return claim_status_update(new, old)


def _drop_deallocated_device_status(old: Obj, new: Obj) -> None:
    """``dropDeallocatedStatusDevices``: device status entries of devices the new allocation no
    longer has go with them."""
    status = new.get("status") or {}
    if not status.get("devices"):
        return

    def devices_of(claim: Obj) -> set[tuple[Any, Any, Any]]:
        allocation = (claim.get("status") or {}).get("allocation") or {}
        results = (allocation.get("devices") or {}).get("results") or []
        return {(r.get("driver"), r.get("pool"), r.get("device")) for r in results}

    gone = devices_of(old) - devices_of(new)
    kept = [
        d
        for d in status["devices"]
        if (d.get("driver"), d.get("pool"), d.get("device")) not in gone
    ]
    if kept:
        status["devices"] = kept
    else:
        status.pop("devices")


# --- field selectors -------------------------------------------------------------------------


def slice_fields(resource_slice: Obj) -> dict[str, str]:
    spec = resource_slice.get("spec") or {}
    return {
        "metadata.name": (resource_slice.get("metadata") or {}).get("name", ""),
        "spec.nodeName": spec.get("nodeName") or "",
        "spec.driver": spec.get("driver") or "",
    }


# --- pods ------------------------------------------------------------------------------------


def _pod_claim_value(claim: Obj) -> str:
    return (
        f'core.PodResourceClaim{{Name:"{claim.get("name", "")}", '
        f"ResourceClaimName:{_pointer(claim.get('resourceClaimName'))}, "
        f"ResourceClaimTemplateName:{_pointer(claim.get('resourceClaimTemplateName'))}}}"
    )


def _pointer(value: Any) -> str:
    return "(*string)(nil)" if value is None else f'"{value}"'


def validate_pod_claims(spec: Obj) -> list[str]:
    """``validatePodResourceClaims`` and each container's ``resources.claims``
    (``validateResourceClaimNames``)."""
    errors: list[str] = []
    names: set[str] = set()
    for i, claim in enumerate(spec.get("resourceClaims") or []):
        path = f"spec.resourceClaims[{i}]"
        if not isinstance(claim, dict):
            errors.append(f"{path}: Invalid value: must be an object")
            continue
        name = claim.get("name") or ""
        if not name:
            errors.append(required(f"{path}.name"))
        elif name in names:
            errors.append(duplicate(f"{path}.name", name))
        else:
            errors += dns_label(name, f"{path}.name")
            names.add(name)
        by_name, by_template = (
            claim.get("resourceClaimName"),
            claim.get("resourceClaimTemplateName"),
        )
        if by_name is not None and by_template is not None:
            errors.append(
                f"{path}: Invalid value: {_pod_claim_value(claim)}: at most one of "
                "`resourceClaimName` or `resourceClaimTemplateName` may be specified"
            )
        if by_name is None and by_template is None:
            errors.append(
                f"{path}: Invalid value: {_pod_claim_value(claim)}: must specify one of: "
                "`resourceClaimName`, `resourceClaimTemplateName`"
            )
        for key, value in (
            ("resourceClaimName", by_name),
            ("resourceClaimTemplateName", by_template),
        ):
            if value is not None:
                errors += dns_subdomain(str(value), f"{path}.{key}")
    for kind in ("initContainers", "containers"):
        for i, container in enumerate(spec.get(kind) or []):
            claims = ((container or {}).get("resources") or {}).get("claims") or []
            errors += _container_claims(claims, names, f"spec.{kind}[{i}].resources.claims")
    return errors


def _container_claims(claims: list[Obj], names: set[str], path: str) -> list[str]:
    errors: list[str] = []
    seen: set[str] = set()
    for i, claim in enumerate(claims):
        where = f"{path}[{i}]"
        name = (claim or {}).get("name") or ""
        if not name:
            errors.append(required(where))
            continue
        key = name
        if claim.get("request"):
            errors += dns_label(claim["request"], f"{where}.request")
            key = f"{name}/{claim['request']}"
        if key in seen:
            errors.append(duplicate(where, key))
        seen.add(key)
        if name not in names:
            known = ": " + ", ".join(sorted(names)) if names else " which is empty"
            errors.append(
                f'{where}: Not found: "{name}": must be one of the names in '
                f"pod.spec.resourceClaims{known}"
            )
    return errors


def validate_pod_claim_statuses(pod: Obj) -> list[str]:
    """``validatePodResourceClaimStatuses`` (a pod ``/status`` write)."""
    claims = {c.get("name") for c in (pod.get("spec") or {}).get("resourceClaims") or []}
    errors: list[str] = []
    seen: set[str] = set()
    for i, status in enumerate((pod.get("status") or {}).get("resourceClaimStatuses") or []):
        path = f"status.resourceClaimStatuses[{i}]"
        name = status.get("name") or ""
        if name not in claims:
            errors.append(
                invalid(
                    f"{path}.name", name, "must match the name of an entry in `spec.resourceClaims`"
                )
            )
        if name in seen:
            errors.append(duplicate(f"{path}.name", name))
        seen.add(name)
        if status.get("resourceClaimName") is not None:
            errors += dns_subdomain(str(status["resourceClaimName"]), f"{path}.name")
    return errors


def claim_name(pod: Obj, pod_claim: Obj) -> tuple[str | None, bool, str]:
    """``resourceclaim.Name``: (the claim's name or None when none is needed, whether the claim
    must be owned by the pod, the error when the name is not known yet)."""
    if pod_claim.get("resourceClaimName") is not None:
        return str(pod_claim["resourceClaimName"]), False, ""
    meta = pod.get("metadata") or {}
    where = f'pod "{meta.get("namespace")}/{meta.get("name")}"'
    if pod_claim.get("resourceClaimTemplateName") is not None:
        for status in (pod.get("status") or {}).get("resourceClaimStatuses") or []:
            if status.get("name") == pod_claim.get("name"):
                name = status.get("resourceClaimName")
                return (str(name) if name is not None else None), True, ""
        return None, False, f"{where}: ResourceClaim not created yet"
    return (
        None,
        False,
        f'{where}, spec.resourceClaim "{pod_claim.get("name")}": none of the supported fields '
        "are set",
    )


def owned_by(claim: Obj, pod: Obj) -> bool:
    """``metav1.IsControlledBy``: the claim's controller reference is the pod."""
    uid = (pod.get("metadata") or {}).get("uid")
    return any(
        ref.get("controller") and ref.get("uid") == uid
        for ref in (claim.get("metadata") or {}).get("ownerReferences") or []
    )


def reserved_for(claim: Obj, pod_uid: str) -> bool:
    return any(
        r.get("uid") == pod_uid for r in (claim.get("status") or {}).get("reservedFor") or []
    )
