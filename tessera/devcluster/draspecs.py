"""The registry rules of the ``resource.k8s.io/v1`` kinds a workload writes, ported from
``pkg/apis/resource/validation/validation.go`` (kubernetes/kubernetes): the DeviceClass spec, a
claim's device requests (ResourceClaim and ResourceClaimTemplate), and the status updates of a
claim (allocation result, ``reservedFor``, device status). ResourceSlices: ``draslices.py``.

Each function takes decoded JSON (``schema.py`` ran first) and returns ``field.Error`` texts
(``dravalidation.py`` writes them).
"""

from __future__ import annotations

from tessera.devcluster.dravalidation import (
    ALLOCATION_RESULTS_MAX,
    DEVICE_CONFIG_MAX,
    DEVICE_CONSTRAINTS_MAX,
    DEVICE_REQUESTS_MAX,
    DEVICE_STATUS_MAX_CONDITIONS,
    FIRST_AVAILABLE_MAX,
    MAX_TOLERATIONS,
    RESERVED_FOR_MAX,
    Obj,
    binding_conditions,
    dns_label,
    dns_subdomain,
    driver_name,
    each,
    forbidden,
    fully_qualified_name,
    gather_request_names,
    immutable,
    invalid,
    node_selector,
    not_supported,
    opaque_configuration,
    pool_name,
    qualified_name,
    quantity,
    request_ref,
    request_refs,
    required,
    selectors,
    toleration,
    uid,
)

# --- DeviceClass -----------------------------------------------------------------------------


def device_class_spec(spec: Obj) -> list[str]:
    errors = selectors(spec.get("selectors"), "spec.selectors")
    errors += each(spec.get("config"), DEVICE_CONFIG_MAX, "spec.config", opaque_configuration)
    name = spec.get("extendedResourceName")
    if name is not None and ("/" not in name or name.startswith(("kubernetes.io/", "requests."))):
        errors.append(
            invalid("spec.extendedResourceName", name, "must be a valid extended resource name")
        )
    return errors


# --- ResourceClaim and ResourceClaimTemplate specs -------------------------------------------


def device_claim(devices: Obj, path: str) -> list[str]:
    """A claim's ``spec.devices`` (``validateDeviceClaim``)."""
    names = gather_request_names(devices)
    errors = each(
        devices.get("requests"),
        DEVICE_REQUESTS_MAX,
        f"{path}.requests",
        _device_request,
        key=lambda request: request.get("name"),
    )
    errors += each(
        devices.get("constraints"),
        DEVICE_CONSTRAINTS_MAX,
        f"{path}.constraints",
        lambda constraint, where: _constraint(constraint, where, names),
    )
    errors += each(
        devices.get("config"),
        DEVICE_CONFIG_MAX,
        f"{path}.config",
        lambda config, where: (
            request_refs(config.get("requests"), f"{where}.requests", names)
            + opaque_configuration(config, where)
        ),
    )
    return errors


def _device_request(request: Obj, path: str) -> list[str]:
    errors = dns_label(request.get("name") or "", f"{path}.name")
    first = request.get("firstAvailable") or []
    exactly = request.get("exactly")
    if not first and exactly is None:
        errors.append(required(path, "exactly one of `exactly` or `firstAvailable` is required"))
    elif first and exactly is not None:
        errors.append(
            invalid(
                path,
                None,
                "exactly one of `exactly` or `firstAvailable` is required, but multiple fields "
                "are set",
            )
        )
    elif first:
        errors += each(
            first,
            FIRST_AVAILABLE_MAX,
            f"{path}.firstAvailable",
            lambda sub, where: (
                dns_label(sub.get("name") or "", f"{where}.name") + _exact(sub, where)
            ),
            key=lambda sub: sub.get("name"),
        )
    elif isinstance(exactly, dict):
        errors += _exact(exactly, f"{path}.exactly")
    return errors


def _exact(request: Obj, path: str) -> list[str]:
    """What ``exactly`` and each ``firstAvailable`` entry share."""
    errors: list[str] = []
    class_name = request.get("deviceClassName") or ""
    if class_name:
        errors += dns_subdomain(class_name, f"{path}.deviceClassName")
    errors += selectors(request.get("selectors"), f"{path}.selectors")
    mode = request.get("allocationMode")
    count = request.get("count", 0)
    if mode == "All":
        if count:
            errors.append(
                invalid(
                    f"{path}.count", count, "must not be specified when allocationMode is 'All'"
                )
            )
    elif mode == "ExactCount":
        if count <= 0:
            errors.append(invalid(f"{path}.count", count, "must be greater than zero"))
    else:
        errors.append(not_supported(f"{path}.allocationMode", mode, ("All", "ExactCount")))
    errors += each(request.get("tolerations"), MAX_TOLERATIONS, f"{path}.tolerations", toleration)
    for key, value in ((request.get("capacity") or {}).get("requests") or {}).items():
        errors += qualified_name(key, f"{path}.capacity.requests")
        if quantity(value) < 0:
            errors.append(invalid(f"{path}.capacity.requests[{key}]", value, "must be positive"))
    return errors


def _constraint(constraint: Obj, path: str, names: dict[str, set[str] | None]) -> list[str]:
    errors = request_refs(constraint.get("requests"), f"{path}.requests", names)
    if constraint.get("matchAttribute") is not None:
        errors += fully_qualified_name(constraint["matchAttribute"], f"{path}.matchAttribute")
    elif constraint.get("distinctAttribute") is not None:
        errors += fully_qualified_name(constraint["distinctAttribute"], f"{path}.distinctAttribute")
    else:
        errors.append(
            required(
                path,
                'exactly one of "matchAttribute" or "distinctAttribute" is required, but multiple '
                "fields are set",
            )
        )
    return errors


# --- ResourceClaim status --------------------------------------------------------------------


def claim_status_update(claim: Obj, old: Obj) -> list[str]:
    """``ValidateResourceClaimStatusUpdate`` (``/status`` writes)."""
    status = claim.get("status") or {}
    old_status = old.get("status") or {}
    names = gather_request_names((claim.get("spec") or {}).get("devices") or {})
    reserved = status.get("reservedFor") or []
    errors = each(
        reserved,
        RESERVED_FOR_MAX,
        "status.reservedFor",
        lambda _consumer, _path: [],  # resource, name and uid are required: the schema's
        key=lambda consumer: consumer.get("uid"),
    )
    allocation = status.get("allocation")
    old_allocation = old_status.get("allocation")
    allocated = _allocated_devices(allocation)
    errors += each(
        status.get("devices"),
        -1,
        "status.devices",
        lambda device, where: _device_status(device, where, allocated),
        key=_device_id,
    )
    if reserved:
        if allocation is None:
            errors.append(
                forbidden("status.reservedFor", "may not be specified when `allocated` is not set")
            )
        elif (claim.get("metadata") or {}).get("deletionTimestamp"):
            before = {r.get("uid") for r in old_status.get("reservedFor") or []}
            if any(r.get("uid") not in before for r in reserved):
                errors.append(
                    forbidden(
                        "status.reservedFor",
                        "new entries may not be added while `deallocationRequested` or "
                        "`deletionTimestamp` are set",
                    )
                )
    if allocation is not None and old_allocation is not None:
        if allocation != old_allocation:
            errors.append(immutable("status.allocation", "{...}"))
    elif allocation is not None:
        errors += allocation_result(allocation, "status.allocation", names)
    return errors


def _device_id(device: Obj) -> str:
    share = device.get("shareID")
    base = f"{device.get('driver')}/{device.get('pool')}/{device.get('device')}"
    return f"{base}/{share}" if share else base


def _allocated_devices(allocation: Obj | None) -> set[str]:
    results = ((allocation or {}).get("devices") or {}).get("results") or []
    return {_device_id(r) for r in results}


def _device_status(device: Obj, path: str, allocated: set[str]) -> list[str]:
    errors = driver_name(device.get("driver") or "", f"{path}.driver")
    errors += pool_name(device.get("pool") or "", f"{path}.pool")
    errors += dns_label(device.get("device") or "", f"{path}.device")
    if device.get("shareID"):
        errors += uid(device["shareID"], f"{path}.shareID")
    if _device_id(device) not in allocated:
        errors.append(invalid(path, _device_id(device), "must be an allocated device in the claim"))
    conditions = device.get("conditions") or []
    if len(conditions) > DEVICE_STATUS_MAX_CONDITIONS:
        errors.append(
            f"{path}.conditions: Too many: {len(conditions)}: must have at most "
            f"{DEVICE_STATUS_MAX_CONDITIONS} items"
        )
    return errors


def allocation_result(allocation: Obj, path: str, names: dict[str, set[str] | None]) -> list[str]:
    """A new ``status.allocation`` (``validateAllocationResult``)."""
    devices = allocation.get("devices") or {}
    errors = each(
        devices.get("results"),
        ALLOCATION_RESULTS_MAX,
        f"{path}.devices.results",
        lambda result, where: _result(result, where, names),
    )
    errors += each(
        devices.get("config"),
        2 * DEVICE_CONFIG_MAX,
        f"{path}.devices.config",
        lambda config, where: _allocation_config(config, where, names),
    )
    if allocation.get("nodeSelector") is not None:
        errors += node_selector(allocation["nodeSelector"], f"{path}.nodeSelector")
    return errors


def _result(result: Obj, path: str, names: dict[str, set[str] | None]) -> list[str]:
    errors = request_ref(result.get("request") or "", f"{path}.request", names)
    errors += driver_name(result.get("driver") or "", f"{path}.driver")
    errors += pool_name(result.get("pool") or "", f"{path}.pool")
    errors += dns_label(result.get("device") or "", f"{path}.device")
    errors += binding_conditions(result, path)
    errors += each(result.get("tolerations"), MAX_TOLERATIONS, f"{path}.tolerations", toleration)
    if result.get("shareID") is not None:
        errors += uid(result["shareID"], f"{path}.shareID")
    return errors


def _allocation_config(config: Obj, path: str, names: dict[str, set[str] | None]) -> list[str]:
    source = config.get("source") or ""
    errors: list[str] = []
    if not source:
        errors.append(required(f"{path}.source"))
    elif source not in ("FromClaim", "FromClass"):
        errors.append(not_supported(f"{path}.source", source, ("FromClaim", "FromClass")))
    errors += request_refs(config.get("requests"), f"{path}.requests", names)
    return errors + opaque_configuration(config, path)
