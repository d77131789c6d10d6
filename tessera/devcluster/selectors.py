"""Field and label selectors as the Kubernetes API server parses and applies them.

Label selectors (``labelSelector``): comma-separated requirements, each ``key=value``,
``key==value``, ``key!=value``, ``key in (a,b)``, ``key notin (a,b)``, ``key`` (exists) or ``!key``
(does not exist). Field selectors (``fieldSelector``): comma-separated ``field=value``,
``field==value`` or ``field!=value`` over the fields a resource type supports; ``\\,``, ``\\=`` and
``\\\\`` escape those characters in values. An unsupported field is the API's 400
``field label not supported: <field>``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

Operator = Literal["=", "!=", "in", "notin", "exists", "!exists"]


class SelectorError(ValueError):
    """The selector does not parse, or names a field the resource does not support."""


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: Operator
    values: frozenset[str] = frozenset()

    def matches(self, present: bool, value: str) -> bool:
        if self.operator == "exists":
            return present
        if self.operator == "!exists":
            return not present
        if self.operator in ("=", "in"):
            return present and value in self.values
        return not present or value not in self.values  # "!=" and "notin"


@dataclass(frozen=True)
class LabelSelector:
    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(r.key in labels, labels.get(r.key, "")) for r in self.requirements)


@dataclass(frozen=True)
class FieldSelector:
    requirements: tuple[Requirement, ...] = ()

    def matches(self, fields: Mapping[str, str]) -> bool:
        return all(r.matches(True, fields.get(r.key, "")) for r in self.requirements)


_SET = re.compile(r"^\s*(!?)\s*([A-Za-z0-9_./-]+)\s+(in|notin)\s*\((.*)\)\s*$")
_EQUALITY = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s*(==|=|!=)\s*(.*?)\s*$")
_EXISTS = re.compile(r"^\s*(!?)\s*([A-Za-z0-9_./-]+)\s*$")


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside parentheses."""
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return [p for p in parts if p.strip()]


def parse_label_selector(text: str) -> LabelSelector:
    """Parse a ``labelSelector`` query value; SelectorError when it does not parse."""
    requirements = []
    for part in _split_top_level(text):
        if match := _SET.match(part):
            if match.group(1):
                raise SelectorError(f"unable to parse requirement: {part!r}")
            values = frozenset(v.strip() for v in match.group(4).split(",") if v.strip())
            op: Operator = "in" if match.group(3) == "in" else "notin"
            requirements.append(Requirement(match.group(2), op, values))
        elif match := _EQUALITY.match(part):
            op = "!=" if match.group(2) == "!=" else "="
            requirements.append(Requirement(match.group(1), op, frozenset({match.group(3)})))
        elif match := _EXISTS.match(part):
            op = "!exists" if match.group(1) else "exists"
            requirements.append(Requirement(match.group(2), op))
        else:
            raise SelectorError(f"unable to parse requirement: {part!r}")
    return LabelSelector(tuple(requirements))


def _split_escaped(text: str, separator: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    escaped = False
    for char in text:
        if escaped:
            current.append(char)
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == separator:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return parts


def parse_field_selector(text: str, supported: frozenset[str]) -> FieldSelector:
    """Parse a ``fieldSelector`` against the fields the resource type supports."""
    requirements = []
    for part in _split_escaped(text, ","):
        if not part.strip():
            continue
        operator: Operator
        if "!=" in part:
            key, value = part.split("!=", 1)
            operator = "!="
        elif "==" in part:
            key, value = part.split("==", 1)
            operator = "="
        elif "=" in part:
            key, value = part.split("=", 1)
            operator = "="
        else:
            raise SelectorError(f"invalid selector: {part!r}; can't understand {part!r}")
        key = key.strip()
        if key not in supported:
            raise SelectorError(f"field label not supported: {key}")
        requirements.append(Requirement(key, operator, frozenset({value})))
    return FieldSelector(tuple(requirements))


Selector = Callable[[Mapping[str, str], Mapping[str, str]], bool]
"""(fields, labels) -> whether an object matches."""


def selector(field: FieldSelector, label: LabelSelector) -> Selector:
    """One predicate over an object's selectable fields and its labels."""
    if not field.requirements and not label.requirements:
        return lambda _fields, _labels: True
    return lambda fields, labels: field.matches(fields) and label.matches(labels)


_STRUCTURED_OPERATORS: dict[str, Operator] = {
    "In": "in",
    "NotIn": "notin",
    "Exists": "exists",
    "DoesNotExist": "!exists",
}


def structured_label_selector(selector_obj: Mapping[str, object] | None) -> LabelSelector:
    """A ``metav1.LabelSelector`` object (``matchLabels``, ``matchExpressions``), as webhook
    configurations' ``namespaceSelector`` and ``objectSelector`` are written. Empty or None
    matches everything. SelectorError on an unknown operator."""
    requirements: list[Requirement] = []
    match_labels = (selector_obj or {}).get("matchLabels") or {}
    if isinstance(match_labels, Mapping):
        for key, value in match_labels.items():
            requirements.append(Requirement(str(key), "=", frozenset({str(value)})))
    expressions = (selector_obj or {}).get("matchExpressions") or []
    for expression in expressions if isinstance(expressions, list) else []:
        operator = _STRUCTURED_OPERATORS.get(str(expression.get("operator")))
        if operator is None:
            raise SelectorError(f"unknown label selector operator {expression.get('operator')!r}")
        values = frozenset(str(v) for v in expression.get("values") or [])
        requirements.append(Requirement(str(expression.get("key", "")), operator, values))
    return LabelSelector(tuple(requirements))
