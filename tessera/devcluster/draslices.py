"""The registry rules of a ``resource.k8s.io/v1`` ResourceSlice, ported from
``validateResourceSliceSpec`` in ``pkg/apis/resource/validation/validation.go``
(kubernetes/kubernetes): driver and pool, exactly one node choice, devices or shared counters
(never both), the device limits (128, or 64 with taints or counter consumption), each device's
name, attributes, capacities and their request policies (consumable capacity), taints, counters
and binding conditions, and the fields an update may not change.
"""

from __future__ import annotations

from typing import Any

from tessera.devcluster.dravalidation import (
    ATTRIBUTE_MAX_VALUE_LENGTH,
    MAX_ATTRIBUTES_AND_CAPACITIES,
    MAX_COUNTER_CONSUMPTIONS,
    MAX_COUNTER_SETS,
    MAX_COUNTERS_PER_SET,
    MAX_TAINTS,
    REQUEST_POLICY_MAX_VALID_VALUES,
    RESOURCE_SLICE_MAX_DEVICES,
    RESOURCE_SLICE_MAX_DEVICES_WITH_TAINTS_OR_COUNTERS,
    Obj,
    binding_conditions,
    dns_label,
    dns_subdomain,
    driver_name,
    duplicate,
    each,
    forbidden,
    immutable,
    invalid,
    node_selector,
    pool_name,
    qualified_name,
    quantity,
    required,
    semver,
    taint,
    too_long,
)

_NODE_CHOICES = "`nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection`"


def resource_slice_spec(spec: Obj, old: Obj | None = None) -> list[str]:
    """``validateResourceSliceSpec``; ``old`` is the stored spec on an update (whose unchanged
    capacities and taints are not validated again)."""
    errors = driver_name(spec.get("driver") or "", "spec.driver")
    pool = spec.get("pool") or {}
    errors += pool_name(pool.get("name") or "", "spec.pool.name")
    if int(pool.get("resourceSliceCount") or 0) <= 0:
        errors.append(
            invalid(
                "spec.pool.resourceSliceCount",
                pool.get("resourceSliceCount", 0),
                "must be greater than zero",
            )
        )
    if int(pool.get("generation") or 0) < 0:
        errors.append(
            invalid(
                "spec.pool.generation",
                pool["generation"],
                "must be greater than or equal to zero",
            )
        )
    if old is not None:
        errors += slice_immutables(spec, old)
    errors += _node_choice(spec)
    if spec.get("sharedCounters") is not None and spec.get("devices") is not None:
        errors.append(invalid("spec", "", "only one of `sharedCounters` or `devices` is allowed"))
    devices = spec.get("devices") or []
    advanced = any(d.get("taints") or d.get("consumesCounters") for d in devices)
    limit = (
        RESOURCE_SLICE_MAX_DEVICES_WITH_TAINTS_OR_COUNTERS
        if advanced
        else RESOURCE_SLICE_MAX_DEVICES
    )
    old_devices = {d.get("name"): d for d in (old or {}).get("devices") or []}
    per_device = bool(spec.get("perDeviceNodeSelection"))
    errors += each(
        devices,
        limit,
        "spec.devices",
        lambda device, path: _device(device, old_devices.get(device.get("name")), path, per_device),
        key=lambda device: device.get("name"),
    )
    errors += each(
        spec.get("sharedCounters"),
        MAX_COUNTER_SETS,
        "spec.sharedCounters",
        _counter_set,
        key=lambda counter_set: counter_set.get("name"),
    )
    return errors


def slice_immutables(spec: Obj, old: Obj) -> list[str]:
    """What a ResourceSlice update may not change: driver, pool name, node name."""
    errors: list[str] = []
    for path, new_value, old_value in (
        (
            "spec.pool.name",
            (spec.get("pool") or {}).get("name"),
            (old.get("pool") or {}).get("name"),
        ),
        ("spec.driver", spec.get("driver"), old.get("driver")),
        ("spec.nodeName", spec.get("nodeName"), old.get("nodeName")),
    ):
        if new_value != old_value:
            errors.append(immutable(path, new_value))
    return errors


def _node_choice(spec: Obj) -> list[str]:
    errors: list[str] = []
    chosen: list[str] = []
    node = spec.get("nodeName")
    if node is not None:
        if node:
            chosen.append("`nodeName`")
            errors += dns_subdomain(node, "spec.nodeName")
        else:
            errors.append(
                invalid("spec.nodeName", node, "must be either unset or set to a non-empty string")
            )
    selector = spec.get("nodeSelector")
    if selector is not None:
        chosen.append("`nodeSelector`")
        errors += node_selector(selector, "spec.nodeSelector")
        if len(selector.get("nodeSelectorTerms") or []) != 1:
            errors.append(
                invalid(
                    "spec.nodeSelector.nodeSelectorTerms",
                    selector.get("nodeSelectorTerms") or [],
                    "must have exactly one node selector term",
                )
            )
    for flag in ("allNodes", "perDeviceNodeSelection"):
        value = spec.get(flag)
        if value is None:
            continue
        if value:
            chosen.append(f"`{flag}`")
        else:
            errors.append(invalid(f"spec.{flag}", value, "must be either unset or set to true"))
    if not chosen:
        errors.append(required("spec", f"exactly one of {_NODE_CHOICES} is required"))
    elif len(chosen) > 1:
        errors.append(
            invalid(
                "spec",
                "{" + ", ".join(chosen) + "}",
                f"exactly one of {_NODE_CHOICES} is required, but multiple fields are set",
            )
        )
    return errors


def _device(device: Obj, old: Obj | None, path: str, per_device_node_selection: bool) -> list[str]:
    errors = dns_label(device.get("name") or "", f"{path}.name")
    attributes = device.get("attributes") or {}
    capacity = device.get("capacity") or {}
    if len(attributes) + len(capacity) > MAX_ATTRIBUTES_AND_CAPACITIES:
        errors.append(
            invalid(
                path,
                len(attributes) + len(capacity),
                "the total number of attributes and capacities must not exceed "
                f"{MAX_ATTRIBUTES_AND_CAPACITIES}",
            )
        )
    for key, attribute in attributes.items():
        errors += qualified_name(key, f"{path}.attributes")
        errors += _attribute(attribute, f"{path}.attributes[{key}]")
    multiple = bool(device.get("allowMultipleAllocations"))
    if old is None or old.get("capacity") != device.get("capacity"):
        for key, value in capacity.items():
            errors += qualified_name(key, f"{path}.capacity")
            policy = value.get("requestPolicy")
            if policy is None:
                continue
            where = f"{path}.capacity[{key}].requestPolicy"
            if multiple:
                errors += _request_policy(value.get("value"), policy, where)
            else:
                errors.append(forbidden(where, "allowMultipleAllocations must be true"))
    if old is None or old.get("taints") != device.get("taints"):
        errors += each(device.get("taints"), MAX_TAINTS, f"{path}.taints", taint)
    errors += each(
        device.get("consumesCounters"),
        MAX_COUNTER_CONSUMPTIONS,
        f"{path}.consumesCounters",
        _counter_consumption,
        key=lambda consumption: consumption.get("counterSet"),
    )
    errors += _device_node_choice(device, path, per_device_node_selection)
    errors += binding_conditions(device, path)
    return errors


def _device_node_choice(device: Obj, path: str, per_device_node_selection: bool) -> list[str]:
    set_here = [k for k in ("nodeName", "nodeSelector", "allNodes") if device.get(k) is not None]
    if not per_device_node_selection:
        if set_here:
            return [
                invalid(
                    path,
                    None,
                    "`nodeName`, `nodeSelector` and `allNodes` can only be set if "
                    "`perDeviceNodeSelection` is set to true in the ResourceSlice spec",
                )
            ]
        return []
    errors: list[str] = []
    if device.get("nodeName") is not None:
        errors += dns_subdomain(device["nodeName"], f"{path}.nodeName")
    if device.get("nodeSelector") is not None:
        errors += node_selector(device["nodeSelector"], f"{path}.nodeSelector")
    if device.get("allNodes") is False:
        errors.append(invalid(f"{path}.allNodes", False, "must be either unset or set to true"))
    if len(set_here) != 1:
        detail = (
            "exactly one of `nodeName`, `nodeSelector`, or `allNodes` is required when "
            "`perDeviceNodeSelection` is set to true in the ResourceSlice spec"
        )
        errors.append(required(path, detail) if not set_here else invalid(path, set_here, detail))
    return errors


def _attribute(attribute: Obj, path: str) -> list[str]:
    errors: list[str] = []
    kinds = ("bool", "int", "string", "version", "bools", "ints", "strings", "versions")
    present = [k for k in kinds if k in attribute]
    for kind in ("string", "version"):
        if kind in attribute:
            errors += _text_value(attribute[kind], f"{path}.{kind}", kind == "version")
    for kind in ("strings", "versions"):
        for i, value in enumerate(attribute.get(kind) or []):
            errors += _text_value(value, f"{path}.{kind}[{i}]", kind == "versions")
    for kind in ("bools", "ints", "strings", "versions"):
        if kind in attribute and not attribute[kind]:
            errors.append(invalid(f"{path}.{kind}", [], "must not be empty if specified"))
    if len(present) != 1:
        errors.append(
            invalid(path, attribute if present else "", "exactly one value must be specified")
        )
    return errors


def _text_value(value: str, path: str, version: bool) -> list[str]:
    errors = []
    if version and not semver(value):
        errors.append(
            invalid(path, value, "must be a string compatible with semver.org spec 2.0.0")
        )
    if len(value) > ATTRIBUTE_MAX_VALUE_LENGTH:
        errors.append(too_long(path, ATTRIBUTE_MAX_VALUE_LENGTH))
    return errors


def _request_policy(capacity: Any, policy: Obj, path: str) -> list[str]:
    if capacity is None:
        return []  # the capacity's value is missing: the schema said so
    maximum = quantity(capacity)
    valid_values = policy.get("validValues") or []
    valid_range = policy.get("validRange")
    default = policy.get("default")
    if valid_values and valid_range is not None:
        return [
            forbidden(
                path,
                'exactly one policy can be specified, cannot specify "validValues" and '
                '"validRange" at the same time',
            )
        ]
    if valid_values:
        if default is None:
            return [required(f"{path}.default", "required when validValues is defined")]
        return _valid_values(quantity(default), default, maximum, capacity, valid_values, path)
    if valid_range is not None:
        if default is None:
            return [required(f"{path}.default", "required when validRange is defined")]
        return _valid_range(quantity(default), default, maximum, capacity, valid_range, path)
    return []


def _valid_values(
    default: Any, default_text: Any, maximum: Any, capacity: Any, values: list[Any], path: str
) -> list[str]:
    where = f"{path}.validValues"
    if len(values) > REQUEST_POLICY_MAX_VALID_VALUES:
        return [f"{where}: Too many: {len(values)}: must have at most 10 items"]
    numbers = [quantity(v) for v in values]
    errors = [
        invalid(f"{where}[{i + 1}]", values[i + 1], "values must be sorted in ascending order")
        for i in range(len(numbers) - 1)
        if numbers[i] > numbers[i + 1]
    ]
    seen: set[Any] = set()
    for i, number in enumerate(numbers):
        if number > maximum:
            errors.append(
                invalid(
                    f"{where}[{i}]", values[i], f"option is larger than capacity value: {capacity}"
                )
            )
        if number in seen:
            errors.append(duplicate(f"{where}[{i}]", values[i]))
        seen.add(number)
    if default not in seen:
        errors.append(
            invalid(
                where, default_text, "default value is not valid according to the requestPolicy"
            )
        )
    return errors


def _valid_range(
    default: Any, default_text: Any, maximum: Any, capacity: Any, valid_range: Obj, path: str
) -> list[str]:
    where = f"{path}.validRange"
    if valid_range.get("min") is None:
        return [required(f"{where}.min", "required when validRange is defined")]
    low = quantity(valid_range["min"])
    errors: list[str] = []
    if low > maximum:
        errors.append(
            invalid(
                f"{where}.min", valid_range["min"], f"min is larger than capacity value: {capacity}"
            )
        )
    if default < low:
        errors.append(
            invalid(
                f"{where}.default", default_text, f"default is less than min: {valid_range['min']}"
            )
        )
    high_text = valid_range.get("max")
    if high_text is not None:
        high = quantity(high_text)
        if low > high:
            errors.append(
                invalid(f"{where}.max", valid_range["min"], f"min is larger than max: {high_text}")
            )
        if high > maximum:
            errors.append(
                invalid(f"{where}.max", high_text, f"max is larger than capacity value: {capacity}")
            )
        if default > high:
            errors.append(
                invalid(f"{where}.default", default_text, f"default is more than max: {high_text}")
            )
    step_text = valid_range.get("step")
    if step_text is None:
        return errors
    step = quantity(step_text)
    if step <= 0:
        errors.append(invalid(f"{where}.step", step_text, "must be greater than zero"))
        return errors
    if low + step > maximum:
        errors.append(
            invalid(
                f"{where}.step",
                step_text,
                f"one step {low + step} is larger than capacity value: {capacity}",
            )
        )
    detail = f"value is not a multiple of a given step ({step_text}) from ({valid_range['min']})"
    for text in (default_text, high_text):
        if text is not None and (quantity(text) - low) % step != 0:
            errors.append(invalid(f"{where}.step", text, detail))
    return errors


def _counter_set(counter_set: Obj, path: str) -> list[str]:
    errors = dns_label(counter_set.get("name") or "", f"{path}.name")
    errors += _counters(counter_set.get("counters"), MAX_COUNTERS_PER_SET, f"{path}.counters")
    return errors


def _counter_consumption(consumption: Obj, path: str) -> list[str]:
    errors = dns_label(consumption.get("counterSet") or "", f"{path}.counterSet")
    errors += _counters(consumption.get("counters"), MAX_COUNTERS_PER_SET, f"{path}.counters")
    return errors


def _counters(counters: Obj | None, limit: int, path: str) -> list[str]:
    if not counters:
        return [required(path)]
    if len(counters) > limit:
        return [f"{path}: Too many: {len(counters)}: must have at most {limit} items"]
    errors: list[str] = []
    for name in counters:
        errors += dns_label(name, path)
    return errors
