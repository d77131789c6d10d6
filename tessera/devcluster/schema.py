"""What the API server's decoder does to a ``resource.k8s.io/v1`` object, from the strict
Kubernetes 1.37 OpenAPI schemas (``schemas/resource.k8s.io-v1.json``, made by ``schemagen.py``).

The real API server decodes a request body into Go structs before anything validates it, so:

- a value of the wrong type is a 400 ``BadRequest``: ``ResourceClaim in version "v1" cannot be
  handled as a ResourceClaim: json: cannot unmarshal string into Go struct field
  ExactDeviceRequest.spec.devices.requests.exactly.count of type int64`` (an invalid quantity or
  time likewise, with its parser's message);
- a field the type does not have is dropped, or, under ``fieldValidation=Strict`` (what kubectl
  sends), a 400 ``strict decoding error: unknown field "spec.devices.requests[0].foo"``;
- ``null`` is the same as absent;
- quantities are stored in canonical form (``1024Mi`` is ``1Gi``), as a re-encoded Quantity is.

:func:`decode` does all of that in place and also returns the required fields that are missing
(``spec.driver: Required value``) for validation to report with its own errors (422): Go would
decode them as zero values, which the registry's validation then refuses. Required integers and
booleans are left to the validation rules, because their zero value can be valid.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Final

from shared.quantity import QuantityError, canonical

SCHEMA_FILE: Final = Path(__file__).with_name("schemas") / "resource.k8s.io-v1.json"
QUANTITY: Final = "io.k8s.apimachinery.pkg.api.resource.Quantity"
_QUANTITY_PATTERN: Final = "^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"
_DATE_TIME: Final = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")
_GO_TYPES: Final = {"integer": "int64", "string": "string", "boolean": "bool", "number": "float64"}
_JSON_KINDS: Final = {str: "string", bool: "bool", int: "number", float: "number"}


@dataclass
class Decoded:
    """What decoding found; the object itself is pruned and canonicalised in place."""

    unknown: list[str] = field(default_factory=list)
    """Field paths the type does not have (dropped)."""
    type_errors: list[str] = field(default_factory=list)
    """The decoder's messages for values it cannot decode (the request is a 400)."""
    missing: list[str] = field(default_factory=list)
    """``path: Required value`` for each required field that is absent."""


@cache
def _document() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(SCHEMA_FILE.read_text())
    return loaded


def root_of(kind: str) -> str:
    """The definition name of a ``resource.k8s.io/v1`` kind (KeyError for another kind)."""
    return str(_document()["roots"][kind])


def decode(kind: str, obj: dict[str, Any]) -> Decoded:
    """Decode ``obj`` (a ``kind`` object, changed in place) as the API server would."""
    decoded = Decoded()
    definitions: dict[str, Any] = _document()["definitions"]
    _Walker(definitions, decoded).object(root_of(kind), obj, "", "")
    return decoded


def _types(schema: dict[str, Any]) -> list[str]:
    declared = schema.get("type", [])
    return [declared] if isinstance(declared, str) else list(declared)


class _Walker:
    def __init__(self, definitions: dict[str, Any], decoded: Decoded) -> None:
        self.definitions = definitions
        self.decoded = decoded

    def _resolve(self, schema: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """(definition name or "", the schema itself) for a property schema."""
        ref = schema.get("$ref")
        if ref:
            return ref, self.definitions[ref]
        return "", schema

    def object(self, name: str, value: dict[str, Any], path: str, go_path: str) -> None:
        self._object(name, self.definitions[name], value, path, go_path)

    def _object(
        self, name: str, schema: dict[str, Any], value: dict[str, Any], path: str, go_path: str
    ) -> None:
        properties: dict[str, Any] = schema.get("properties") or {}
        extra = schema.get("additionalProperties", True)
        for key in list(value):
            where = f"{path}.{key}" if path else key
            go_where = f"{go_path}.{key}" if go_path else key
            if value[key] is None:
                del value[key]
            elif key in properties:
                value[key] = self.value(properties[key], value[key], where, go_where, name)
            elif isinstance(extra, dict):
                value[key] = self.value(extra, value[key], where, go_where, name)
            elif extra is False:
                self.decoded.unknown.append(where)
                del value[key]
        for key in schema.get("required") or []:
            if key in value:
                continue
            _, required = self._resolve(properties.get(key, {}))
            if not {"integer", "boolean"} & set(_types(required)):
                self.decoded.missing.append(
                    f"{path}.{key}: Required value" if path else f"{key}: Required value"
                )

    def value(self, schema: dict[str, Any], value: Any, path: str, go_path: str, owner: str) -> Any:
        """``value`` decoded against ``schema`` (pruned, canonical), type errors recorded."""
        name, schema = self._resolve(schema)
        if name == QUANTITY:
            return self._quantity(value)
        kinds = _types(schema)
        struct = owner.rsplit(".", 1)[-1]
        if "object" in kinds:
            if not isinstance(value, dict):
                self._mismatch(
                    value,
                    struct,
                    go_path,
                    "map[string]interface {}" if not name else name.rsplit(".", 1)[-1],
                )
                return value
            if name:
                self._object(name, schema, value, path, go_path)
            elif "properties" in schema or "additionalProperties" in schema:
                self._object(owner, schema, value, path, go_path)
            return value
        if "array" in kinds:
            if not isinstance(value, list):
                self._mismatch(value, struct, go_path, "[]")
                return value
            items = schema.get("items") or {}
            return [
                self.value(items, item, f"{path}[{i}]", go_path, owner)
                for i, item in enumerate(value)
                if item is not None
            ]
        if "integer" in kinds:
            if isinstance(value, bool) or not isinstance(value, int):
                self._mismatch(value, struct, go_path, "int64")
            return value
        if "boolean" in kinds and not isinstance(value, bool):
            self._mismatch(value, struct, go_path, "bool")
        elif "string" in kinds:
            if not isinstance(value, str):
                self._mismatch(value, struct, go_path, "string")
            elif schema.get("format") == "date-time" and not _DATE_TIME.match(value):
                self.decoded.type_errors.append(
                    f'parsing time "{value}" as "2006-01-02T15:04:05Z07:00": cannot parse '
                    f'"{value}" as a RFC 3339 time'
                )
        return value

    def _quantity(self, value: Any) -> Any:
        try:
            return canonical(value)
        except QuantityError:
            self.decoded.type_errors.append(
                f"quantities must match the regular expression '{_QUANTITY_PATTERN}'"
            )
            return value

    def _mismatch(self, value: Any, struct: str, go_path: str, go_type: str) -> None:
        if isinstance(value, dict):
            seen = "object"
        elif isinstance(value, list):
            seen = "array"
        else:
            seen = _JSON_KINDS.get(type(value), "value")
            if seen == "number":
                seen = f"number {value}"
        self.decoded.type_errors.append(
            f"json: cannot unmarshal {seen} into Go struct field {struct}.{go_path} of type "
            f"{_GO_TYPES.get(go_type, go_type)}"
        )
