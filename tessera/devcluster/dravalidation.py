"""The registry validation of ``resource.k8s.io/v1`` objects that the schema cannot say: what
``pkg/apis/resource/validation/validation.go`` (kubernetes/kubernetes) refuses, each error as
``field.Error`` prints it (``spec.devices[3].name: Duplicate value: "gpu-0"``).

Pure functions over plain JSON objects (already decoded by ``schema.py``, so types are right
and required fields that are missing were reported there): each returns its errors. The limits
are the API's own constants (``staging/src/k8s.io/api/resource/v1/types.go``). Left out: CEL
compilation of selectors (only the expression's length is checked), the admin-access namespace
label, and the alpha fields (derived attributes, node allocatable resources, list attributes).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any, Final

from shared.quantity import QuantityError, parse_quantity

Obj = dict[str, Any]

RESOURCE_SLICE_MAX_DEVICES: Final = 128
RESOURCE_SLICE_MAX_DEVICES_WITH_TAINTS_OR_COUNTERS: Final = 64
MAX_ATTRIBUTES_AND_CAPACITIES: Final = 32
MAX_COUNTER_SETS: Final = 8
MAX_COUNTERS_PER_SET: Final = 32
MAX_COUNTER_CONSUMPTIONS: Final = 2
MAX_TAINTS: Final = 16
MAX_TOLERATIONS: Final = 16
MAX_BINDING_CONDITIONS: Final = 4
POOL_NAME_MAX_LENGTH: Final = 253
DEVICE_MAX_DOMAIN_LENGTH: Final = 63
DEVICE_MAX_ID_LENGTH: Final = 32
ATTRIBUTE_MAX_VALUE_LENGTH: Final = 64
DEVICE_REQUESTS_MAX: Final = 32
DEVICE_SELECTORS_MAX: Final = 32
DEVICE_CONSTRAINTS_MAX: Final = 32
DEVICE_CONFIG_MAX: Final = 32
FIRST_AVAILABLE_MAX: Final = 8
ALLOCATION_RESULTS_MAX: Final = 32
RESERVED_FOR_MAX: Final = 256
CEL_EXPRESSION_MAX_LENGTH: Final = 10 * 1024
OPAQUE_PARAMETERS_MAX_LENGTH: Final = 10 * 1024
REQUEST_POLICY_MAX_VALID_VALUES: Final = 10
DEVICE_STATUS_MAX_CONDITIONS: Final = 8

_DNS_LABEL: Final = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN: Final = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
_C_IDENTIFIER: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LABEL_NAME: Final = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE: Final = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_SEMVER: Final = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(-(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(\.(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*)?"
    r"(\+[0-9a-zA-Z-]+(\.[0-9a-zA-Z-]+)*)?$"
)
TAINT_EFFECTS: Final = ("NoExecute", "NoSchedule", "None")

# --- field.Error as the API server prints it --------------------------------------------------


def show(value: Any) -> str:
    """A value as ``field.Invalid`` shows it: strings quoted, numbers bare."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(value, separators=(",", ":"))


def required(path: str, detail: str = "") -> str:
    return f"{path}: Required value" + (f": {detail}" if detail else "")


def invalid(path: str, value: Any, detail: str) -> str:
    return f"{path}: Invalid value: {show(value)}: {detail}"


def forbidden(path: str, detail: str) -> str:
    return f"{path}: Forbidden: {detail}"


def too_many(path: str, count: int, limit: int) -> str:
    return f"{path}: Too many: {count}: must have at most {limit} items"


def too_long(path: str, limit: int) -> str:
    return f"{path}: Too long: may not be more than {limit} bytes"


def duplicate(path: str, value: Any) -> str:
    return f"{path}: Duplicate value: {show(value)}"


def not_supported(path: str, value: Any, supported: Sequence[str]) -> str:
    return f"{path}: Unsupported value: {show(value)}: supported values: " + ", ".join(
        show(s) for s in supported
    )


def immutable(path: str, value: Any) -> str:
    return invalid(path, value, "field is immutable")


# --- names -----------------------------------------------------------------------------------


def dns_label(value: str, path: str) -> list[str]:
    if len(value) > 63:
        return [invalid(path, value, "must be no more than 63 characters")]
    if not _DNS_LABEL.match(value):
        return [
            invalid(
                path,
                value,
                "a lowercase RFC 1123 label must consist of lower case alphanumeric characters "
                "or '-', and must start and end with an alphanumeric character",
            )
        ]
    return []


def dns_subdomain(value: str, path: str) -> list[str]:
    if len(value) > 253:
        return [invalid(path, value, "must be no more than 253 characters")]
    if not _DNS_SUBDOMAIN.match(value):
        return [
            invalid(
                path,
                value,
                "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
                "characters, '-' or '.', and must start and end with an alphanumeric character",
            )
        ]
    return []


def driver_name(value: str, path: str) -> list[str]:
    """A DRA driver name: the rules of a CSI driver name (``ValidateCSIDriverName``)."""
    if not value:
        return [required(path)]
    if len(value) > 63:
        return [too_long(path, 63)]
    return dns_subdomain(value.lower(), path)


def pool_name(value: str, path: str) -> list[str]:
    if not value:
        return [required(path)]
    errors = [too_long(path, POOL_NAME_MAX_LENGTH)] if len(value) > POOL_NAME_MAX_LENGTH else []
    for part in value.split("/"):
        errors += dns_subdomain(part, path)
    return errors


def _c_identifier(value: str, path: str) -> list[str]:
    errors = [too_long(path, DEVICE_MAX_ID_LENGTH)] if len(value) > DEVICE_MAX_ID_LENGTH else []
    if not _C_IDENTIFIER.match(value):
        errors.append(
            invalid(
                path,
                value,
                "a valid C identifier must start with alphabetic character or '_', followed by "
                "a string of alphanumeric characters or '_'",
            )
        )
    return errors


def qualified_name(value: str, path: str) -> list[str]:
    """An attribute or capacity name: a C identifier, optionally behind a ``domain/``."""
    parts = value.split("/")
    if len(parts) == 1:
        return _c_identifier(value, path)
    if len(parts) > 2:
        return [invalid(path, value, "must not contain more than one slash")]
    domain, name = parts
    errors = (
        [invalid(path, "", "the domain must not be empty")]
        if not domain
        else driver_name(domain, path)
    )
    errors += [invalid(path, "", "the name must not be empty")] if not name else []
    return errors + (_c_identifier(name, path) if name else [])


def fully_qualified_name(value: str, path: str) -> list[str]:
    errors = qualified_name(value, path)
    if "/" not in value:
        errors.append(
            invalid(
                path,
                value,
                "a fully qualified name must be a domain and a name separated by a slash",
            )
        )
    return errors


def label_name(value: str, path: str) -> list[str]:
    """``metav1validation.ValidateLabelName``: an optional DNS-subdomain prefix and a name."""
    if not value:
        return [required(path)]
    prefix, _, name = value.rpartition("/")
    errors = dns_subdomain(prefix, path) if prefix else []
    if len(name) > 63 or not _LABEL_NAME.match(name):
        errors.append(
            invalid(
                path,
                value,
                "name part must consist of alphanumeric characters, '-', '_' or '.', and must "
                "start and end with an alphanumeric character",
            )
        )
    return errors


def label_value(value: str, path: str) -> list[str]:
    if len(value) > 63 or not _LABEL_VALUE.match(value):
        return [
            invalid(
                path,
                value,
                "a valid label must be an empty string or consist of alphanumeric characters, "
                "'-', '_' or '.', and must start and end with an alphanumeric character",
            )
        ]
    return []


def uid(value: str, path: str) -> list[str]:
    try:
        parsed = uuid.UUID(value)
    except ValueError as error:
        return [invalid(path, value, f"error validating uid: {error}")]
    if str(parsed) != value:
        return [
            invalid(
                path,
                value,
                "uid must be in RFC 4122 normalized form, `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` "
                "with lowercase hexadecimal characters",
            )
        ]
    return []


# --- lists and maps --------------------------------------------------------------------------


def each(
    items: Sequence[Any] | None,
    limit: int,
    path: str,
    check: Callable[[Any, str], list[str]],
    key: Callable[[Any], Any] | None = None,
) -> list[str]:
    """``validateSlice``/``validateSet``: too many short-circuits, then every item, then
    duplicates by ``key`` (when given)."""
    items = items or []
    if limit >= 0 and len(items) > limit:
        return [too_many(path, len(items), limit)]
    errors: list[str] = []
    for i, item in enumerate(items):
        errors += check(item, f"{path}[{i}]")
    if key is not None:
        seen: set[Any] = set()
        for i, item in enumerate(items):
            value = key(item)
            if value in seen:
                errors.append(duplicate(f"{path}[{i}]", value))
            seen.add(value)
    return errors


def quantity(value: Any) -> Fraction:
    """A decoded quantity as a number (0 when absent: the schema reported that)."""
    try:
        return parse_quantity(value)
    except (QuantityError, TypeError, ValueError):
        return Fraction(0)


def semver(value: str) -> bool:
    return bool(_SEMVER.match(value))


# --- shared pieces ---------------------------------------------------------------------------


def opaque_configuration(config: Obj, path: str) -> list[str]:
    opaque = config.get("opaque")
    if not isinstance(opaque, dict):
        return [required(f"{path}.opaque")]
    errors = driver_name(opaque.get("driver") or "", f"{path}.opaque.driver")
    parameters = opaque.get("parameters")
    where = f"{path}.opaque.parameters"
    if not parameters:
        errors.append(required(where))
    elif len(json.dumps(parameters, separators=(",", ":"))) > OPAQUE_PARAMETERS_MAX_LENGTH:
        errors.append(too_long(where, OPAQUE_PARAMETERS_MAX_LENGTH))
    return errors


def selectors(items: Sequence[Obj] | None, path: str) -> list[str]:
    def check(selector: Obj, where: str) -> list[str]:
        cel = selector.get("cel")
        if not isinstance(cel, dict):
            return [required(f"{where}.cel")]
        expression = cel.get("expression") or ""
        if len(expression) > CEL_EXPRESSION_MAX_LENGTH:
            return [too_long(f"{where}.cel.expression", CEL_EXPRESSION_MAX_LENGTH)]
        if not expression.strip():
            return [required(f"{where}.cel.expression", "expression is empty")]
        return []

    return each(items, DEVICE_SELECTORS_MAX, path, check)


def toleration(item: Obj, path: str) -> list[str]:
    errors = label_name(item["key"], f"{path}.key") if item.get("key") else []
    operator = item.get("operator", "Equal")
    value = item.get("value") or ""
    if operator == "Exists":
        if value:
            errors.append(invalid(f"{path}.value", value, "must be empty for operator `Exists`"))
    elif operator == "Equal":
        errors += label_value(value, f"{path}.value")
    else:
        errors.append(not_supported(f"{path}.operator", operator, ("Equal", "Exists")))
    effect = item.get("effect") or ""
    if effect and effect not in TAINT_EFFECTS:
        errors.append(not_supported(f"{path}.effect", effect, TAINT_EFFECTS))
    return errors


def taint(item: Obj, path: str) -> list[str]:
    errors = label_name(item.get("key") or "", f"{path}.key")
    if item.get("value"):
        errors += label_value(item["value"], f"{path}.value")
    effect = item.get("effect") or ""
    if not effect:
        errors.append(required(f"{path}.effect"))
    elif effect not in TAINT_EFFECTS:
        errors.append(not_supported(f"{path}.effect", effect, TAINT_EFFECTS))
    return errors


def binding_conditions(item: Obj, path: str) -> list[str]:
    conditions = item.get("bindingConditions") or []
    failures = item.get("bindingFailureConditions") or []
    errors = each(
        conditions,
        MAX_BINDING_CONDITIONS,
        f"{path}.bindingConditions",
        label_name,
        key=str,
    )
    errors += each(
        failures,
        MAX_BINDING_CONDITIONS,
        f"{path}.bindingFailureConditions",
        label_name,
        key=str,
    )
    for i, condition in enumerate(failures):
        if condition in conditions:
            errors.append(
                invalid(
                    f"{path}.bindingFailureConditions[{i}]",
                    condition,
                    "bindingFailureConditions must not overlap with bindingConditions",
                )
            )
    if failures and not conditions:
        errors.append(
            invalid(
                f"{path}.bindingConditions",
                [],
                "bindingConditions are required to use bindingFailureConditions",
            )
        )
    if conditions and not failures:
        errors.append(
            invalid(
                f"{path}.bindingFailureConditions",
                [],
                "bindingFailureConditions are required to use bindingConditions",
            )
        )
    return errors


def node_selector(selector: Obj, path: str) -> list[str]:
    terms = selector.get("nodeSelectorTerms") or []
    errors: list[str] = []
    for i, term in enumerate(terms):
        for kind in ("matchExpressions", "matchFields"):
            for j, expression in enumerate(term.get(kind) or []):
                where = f"{path}.nodeSelectorTerms[{i}].{kind}[{j}]"
                operator = expression.get("operator") or ""
                values = expression.get("values") or []
                if operator in ("In", "NotIn") and not values:
                    errors.append(
                        required(
                            f"{where}.values",
                            "must be specified when `operator` is 'In' or 'NotIn'",
                        )
                    )
                elif operator in ("Exists", "DoesNotExist") and values:
                    errors.append(
                        forbidden(
                            f"{where}.values",
                            "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
                        )
                    )
                elif operator not in ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"):
                    errors.append(
                        not_supported(
                            f"{where}.operator",
                            operator,
                            ("DoesNotExist", "Exists", "Gt", "In", "Lt", "NotIn"),
                        )
                    )
    return errors


def gather_request_names(devices: Obj) -> dict[str, set[str] | None]:
    """Request name -> its subrequest names (None for an ``exactly`` request)."""
    names: dict[str, set[str] | None] = {}
    for request in devices.get("requests") or []:
        subrequests = request.get("firstAvailable") or []
        names[request.get("name") or ""] = (
            {s.get("name") or "" for s in subrequests} if subrequests else None
        )
    return names


def request_ref(name: str, path: str, names: dict[str, set[str] | None]) -> list[str]:
    detail = (
        "must be the name of a request in the claim or the name of a request and a subrequest "
        "separated by '/'"
    )
    segments = name.split("/")
    if len(segments) > 2:
        return [invalid(path, name, detail)]
    errors: list[str] = []
    for segment in segments:
        errors += dns_label(segment, path)
    known = segments[0] in names and (
        len(segments) == 1 or segments[1] in (names[segments[0]] or set())
    )
    if not known:
        errors.append(invalid(path, name, detail))
    return errors


def request_refs(
    items: Sequence[str] | None, path: str, names: dict[str, set[str] | None]
) -> list[str]:
    return each(items, DEVICE_REQUESTS_MAX, path, lambda n, p: request_ref(n, p, names), key=str)
