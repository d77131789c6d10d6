"""The three patch formats the Kubernetes API accepts on JSON resources.

- ``application/merge-patch+json``: RFC 7386 (``null`` deletes a key, lists are replaced).
- ``application/strategic-merge-patch+json``: like a merge patch, except that lists with a patch
  merge key are merged element by element (``status.conditions`` by ``type``,
  ``spec.containers`` by ``name``, ...), primitive lists with the ``merge`` strategy are unioned,
  and the ``$patch`` (``replace``/``delete``), ``$retainKeys``, ``$deleteFromPrimitiveList/`` and
  ``$setElementOrder/`` directives are honoured. The merge keys are those of the core types'
  struct tags (``patchMergeKey``), for the fields pods, nodes, events and resource claims have.
- ``application/json-patch+json``: RFC 6902 operations with RFC 6901 pointers.

Errors are :class:`PatchError` with the HTTP status the API server would answer (400 for a
malformed patch, 422 for a failed ``test`` or a path that does not exist).
"""

from __future__ import annotations

from typing import Any, Final

from tessera.devcluster.jsoncopy import clone

MERGE_PATCH: Final = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH: Final = "application/strategic-merge-patch+json"
JSON_PATCH: Final = "application/json-patch+json"
CONTENT_TYPES: Final = (MERGE_PATCH, STRATEGIC_MERGE_PATCH, JSON_PATCH)

ANY: Final = "*"
"""Stands for any element of a list in a field path."""

MERGE_KEYS: Final[dict[tuple[str, ...], str]] = {
    ("metadata", "ownerReferences"): "uid",
    ("metadata", "managedFields"): "manager",
    ("spec", "containers"): "name",
    ("spec", "initContainers"): "name",
    ("spec", "ephemeralContainers"): "name",
    ("spec", "containers", ANY, "env"): "name",
    ("spec", "containers", ANY, "ports"): "containerPort",
    ("spec", "containers", ANY, "volumeMounts"): "mountPath",
    ("spec", "containers", ANY, "volumeDevices"): "devicePath",
    ("spec", "initContainers", ANY, "env"): "name",
    ("spec", "initContainers", ANY, "volumeMounts"): "mountPath",
    ("spec", "volumes"): "name",
    ("spec", "imagePullSecrets"): "name",
    ("spec", "hostAliases"): "ip",
    ("spec", "readinessGates"): "conditionType",
    ("spec", "resourceClaims"): "name",
    ("spec", "schedulingGates"): "name",
    ("status", "conditions"): "type",
    ("status", "podIPs"): "ip",
    ("status", "hostIPs"): "ip",
    ("status", "addresses"): "type",
    ("status", "images"): "names",
    ("status", "resourceClaimStatuses"): "name",
    ("status", "reservedFor"): "uid",
}
"""Lists merged element by element in a strategic merge patch, by field path -> merge key."""

PRIMITIVE_MERGE_LISTS: Final[frozenset[tuple[str, ...]]] = frozenset(
    {("metadata", "finalizers"), ("spec", "podCIDRs")}
)
"""Lists of scalars whose strategic-merge strategy is ``merge`` (union), not replace."""


class PatchError(Exception):
    """The patch cannot be applied; ``status`` is the HTTP status the API server answers."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def apply_patch(document: dict[str, Any], patch: Any, content_type: str) -> dict[str, Any]:
    """A new document: ``document`` with ``patch`` applied (``document`` is left untouched)."""
    if content_type == MERGE_PATCH:
        if not isinstance(patch, dict):
            raise PatchError(400, "a merge patch must be a JSON object")
        result = merge_patch(document, patch)
    elif content_type == STRATEGIC_MERGE_PATCH:
        if not isinstance(patch, dict):
            raise PatchError(400, "a strategic merge patch must be a JSON object")
        result = strategic_merge_patch(document, patch)
    elif content_type == JSON_PATCH:
        if not isinstance(patch, list):
            raise PatchError(400, "a JSON patch must be a JSON array of operations")
        result = json_patch(document, patch)
    else:
        raise PatchError(415, f"the body of the request was in an unknown format: {content_type}")
    if not isinstance(result, dict):
        raise PatchError(422, "the patch did not leave a JSON object")
    return result


# --- RFC 7386 --------------------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return clone(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# --- strategic merge -------------------------------------------------------------------------

_DELETE = object()


def _path_matches(path: tuple[str, ...], pattern: tuple[str, ...]) -> bool:
    return len(path) == len(pattern) and all(
        p in (ANY, k) for k, p in zip(path, pattern, strict=True)
    )


def _merge_key(path: tuple[str, ...]) -> str | None:
    for pattern, key in MERGE_KEYS.items():
        if _path_matches(path, pattern):
            return key
    return None


def strategic_merge_patch(original: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """Strategic merge ``patch`` into ``original`` (paths relative to the object's root)."""
    merged = _merge_map(original, patch, ())
    return {} if merged is _DELETE else merged


def _merge_map(original: Any, patch: dict[str, Any], path: tuple[str, ...]) -> Any:
    directive = patch.get("$patch")
    if directive == "delete":
        return _DELETE
    body = {k: v for k, v in patch.items() if k != "$patch"}
    if directive == "replace":
        return _strip_directives(body)
    if directive is not None:
        raise PatchError(400, f"unknown patch directive $patch: {directive!r}")
    result = dict(original) if isinstance(original, dict) else {}
    retain = body.pop("$retainKeys", None)
    if retain is not None:
        if not isinstance(retain, list):
            raise PatchError(400, "$retainKeys must be a list of field names")
        result = {k: v for k, v in result.items() if k in retain}
    for key, value in body.items():
        if key.startswith("$setElementOrder/"):
            continue  # order hints do not change content
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            if isinstance(result.get(field), list) and isinstance(value, list):
                result[field] = [v for v in result[field] if v not in value]
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            merged = _merge_map(result.get(key), value, (*path, key))
            if merged is _DELETE:
                result.pop(key, None)
            else:
                result[key] = merged
        elif isinstance(value, list):
            result[key] = _merge_list(result.get(key), value, (*path, key))
        else:
            result[key] = value
    return result


def _merge_list(original: Any, patch: list[Any], path: tuple[str, ...]) -> list[Any]:
    if any(isinstance(item, dict) and item.get("$patch") == "replace" for item in patch):
        return [
            _strip_directives(i)
            for i in patch
            if not (isinstance(i, dict) and i.get("$patch") == "replace")
        ]
    current = list(original) if isinstance(original, list) else []
    key = _merge_key(path)
    if key is not None:
        for item in patch:
            if not isinstance(item, dict) or key not in item:
                raise PatchError(
                    400, f"map in list {'.'.join(path)} is missing its merge key {key!r}"
                )
            index = next(
                (
                    i
                    for i, old in enumerate(current)
                    if isinstance(old, dict) and old.get(key) == item[key]
                ),
                None,
            )
            merged = _merge_map(current[index] if index is not None else None, item, (*path, ANY))
            if merged is _DELETE:
                if index is not None:
                    del current[index]
            elif index is not None:
                current[index] = merged
            else:
                current.append(merged)
        return current
    if path in PRIMITIVE_MERGE_LISTS:
        return current + [v for v in patch if v not in current]
    return [_strip_directives(i) if isinstance(i, dict) else i for i in patch]


def _strip_directives(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: _strip_directives(v)
            for k, v in value.items()
            if not (k.startswith("$") and k != "$ref")
        }
    if isinstance(value, list):
        return [_strip_directives(v) for v in value]
    return value


# --- RFC 6902 --------------------------------------------------------------------------------


def _pointer(text: Any) -> list[str]:
    if not isinstance(text, str) or (text and not text.startswith("/")):
        raise PatchError(400, f"invalid JSON pointer {text!r}")
    if text == "":
        return []
    return [part.replace("~1", "/").replace("~0", "~") for part in text[1:].split("/")]


def _parent(document: Any, parts: list[str], op: str) -> tuple[Any, str]:
    node = document
    for part in parts[:-1]:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise PatchError(422, f"{op}: path /{'/'.join(parts)} does not exist")
    return node, parts[-1]


def _get(document: Any, parts: list[str], op: str) -> Any:
    if not parts:
        return document
    parent, last = _parent(document, parts, op)
    if isinstance(parent, dict) and last in parent:
        return parent[last]
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent[int(last)]
    raise PatchError(422, f"{op}: path /{'/'.join(parts)} does not exist")


def _remove(document: Any, parts: list[str], op: str) -> Any:
    parent, last = _parent(document, parts, op)
    if isinstance(parent, dict) and last in parent:
        return parent.pop(last)
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent.pop(int(last))
    raise PatchError(422, f"{op}: path /{'/'.join(parts)} does not exist")


def _add(document: Any, parts: list[str], value: Any, op: str) -> Any:
    if not parts:
        return value
    parent, last = _parent(document, parts, op)
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-":
            parent.append(value)
        elif last.isdigit() and int(last) <= len(parent):
            parent.insert(int(last), value)
        else:
            raise PatchError(422, f"{op}: index {last} out of range")
    else:
        raise PatchError(422, f"{op}: path /{'/'.join(parts)} does not exist")
    return document


def json_patch(document: Any, operations: list[Any]) -> Any:
    """RFC 6902: apply ``operations`` in order to a copy of ``document``."""
    result = clone(document)
    for operation in operations:
        if not isinstance(operation, dict) or "op" not in operation:
            raise PatchError(400, f"invalid JSON patch operation {operation!r}")
        op = operation["op"]
        parts = _pointer(operation.get("path"))
        if op == "add":
            result = _add(result, parts, clone(operation.get("value")), op)
        elif op == "remove":
            _remove(result, parts, op)
        elif op == "replace":
            _get(result, parts, op)
            if parts:
                _remove(result, parts, op)
            result = _add(result, parts, clone(operation.get("value")), op)
        elif op in ("move", "copy"):
            source = _pointer(operation.get("from"))
            value = _get(result, source, op)
            if op == "move":
                _remove(result, source, op)
            result = _add(result, parts, clone(value), op)
        elif op == "test":
            if _get(result, parts, op) != operation.get("value"):
                raise PatchError(422, f"test failed: /{'/'.join(parts)} is not the given value")
        else:
            raise PatchError(400, f"unknown JSON patch operation {op!r}")
    return result
