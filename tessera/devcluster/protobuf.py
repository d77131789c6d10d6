"""Kubernetes' protobuf encoding of a request body, read into the JSON form the double stores.

kubectl's ``create`` generators (``kubectl create namespace``, ``create secret generic``,
``create configmap``) go through typed clients that send ``application/vnd.kubernetes.protobuf``:
the magic ``k8s\\x00``, then a ``runtime.Unknown`` (field 1 its ``TypeMeta``: apiVersion, kind;
field 2 the object's own message). The API server decodes any built-in kind; this double reads the
kinds in :data:`KINDS`, from the field numbers of ``k8s.io/api/core/v1/generated.proto`` and
``k8s.io/apimachinery/pkg/apis/meta/v1/generated.proto``, and refuses any other kind with a
:class:`ProtobufError` that names it (the client can send JSON instead: ``kubectl create -f``).
Fields the tables do not name are skipped, as a protobuf reader skips unknown fields.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any, Final

from tessera.devcluster.resources import timestamp

MAGIC: Final = b"k8s\x00"
CONTENT_TYPE: Final = "application/vnd.kubernetes.protobuf"

Schema = dict[int, tuple[str, Any]]
"""Field number -> (JSON name, how to read it: one of the kinds below, or a nested Schema)."""

STRING: Final = "string"
BYTES: Final = "bytes"
"""Read as base64 text, as JSON carries ``[]byte``."""
INT: Final = "int"
BOOL: Final = "bool"
STRINGS: Final = "strings"
"""A repeated string."""
STRING_MAP: Final = "string_map"
BYTES_MAP: Final = "bytes_map"
TIME: Final = "time"
"""``metav1.Time``: seconds (1) and nanos (2); read as RFC 3339."""

OBJECT_META: Final[Schema] = {
    1: ("name", STRING),
    2: ("generateName", STRING),
    3: ("namespace", STRING),
    5: ("uid", STRING),
    6: ("resourceVersion", STRING),
    7: ("generation", INT),
    8: ("creationTimestamp", TIME),
    11: ("labels", STRING_MAP),
    12: ("annotations", STRING_MAP),
    14: ("finalizers", STRINGS),
}
KINDS: Final[dict[tuple[str, str], Schema]] = {
    ("v1", "Namespace"): {1: ("metadata", OBJECT_META), 2: ("spec", {1: ("finalizers", STRINGS)})},
    ("v1", "Secret"): {
        1: ("metadata", OBJECT_META),
        2: ("data", BYTES_MAP),
        3: ("type", STRING),
        4: ("stringData", STRING_MAP),
        5: ("immutable", BOOL),
    },
    ("v1", "ConfigMap"): {
        1: ("metadata", OBJECT_META),
        2: ("data", STRING_MAP),
        3: ("binaryData", BYTES_MAP),
        4: ("immutable", BOOL),
    },
}


class ProtobufError(ValueError):
    """The body is not a protobuf object this double reads (the message says why)."""


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise ProtobufError("a varint runs past the end of the body")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7


def _fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) of each field: an int for varints, bytes for length-delimited."""
    at = 0
    while at < len(data):
        key, at = _varint(data, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, at = _varint(data, at)
            yield number, value
        elif wire == 2:
            length, at = _varint(data, at)
            if at + length > len(data):
                raise ProtobufError("a field runs past the end of the body")
            yield number, data[at : at + length]
            at += length
        elif wire in (1, 5):  # fixed 64 or 32 bits: no field read here has them
            at += 8 if wire == 1 else 4
        else:
            raise ProtobufError(f"unsupported wire type {wire}")


def _text(value: int | bytes) -> str:
    if not isinstance(value, bytes):
        raise ProtobufError("a string field holds a number")
    try:
        return value.decode()
    except UnicodeDecodeError:
        raise ProtobufError("a string field is not UTF-8") from None


def _entry(value: int | bytes) -> tuple[str, bytes]:
    if not isinstance(value, bytes):
        raise ProtobufError("a map entry holds a number")
    key, item = "", b""
    for number, part in _fields(value):
        if number == 1:
            key = _text(part)
        elif number == 2 and isinstance(part, bytes):
            item = part
    return key, item


def _time(value: int | bytes) -> str | None:
    if not isinstance(value, bytes):
        raise ProtobufError("a time field holds a number")
    seconds = next((v for n, v in _fields(value) if n == 1 and isinstance(v, int)), None)
    if seconds is None:
        return None
    return timestamp(float(seconds))


def _message(data: bytes, schema: Schema) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for number, value in _fields(data):
        if number not in schema:
            continue
        name, kind = schema[number]
        if isinstance(kind, dict):
            if not isinstance(value, bytes):
                raise ProtobufError(f"{name} holds a number")
            obj[name] = _message(value, kind)
        elif kind == STRING:
            text = _text(value)
            if text:  # proto2 optional strings: an empty one is how Go writes "unset"
                obj[name] = text
        elif kind in (INT, BOOL):
            if not isinstance(value, int):
                raise ProtobufError(f"{name} is not a number")
            if value:
                obj[name] = bool(value) if kind == BOOL else value
        elif kind == STRINGS:
            obj.setdefault(name, []).append(_text(value))
        elif kind == TIME:
            stamp = _time(value)
            if stamp is not None:
                obj[name] = stamp
        else:
            key, item = _entry(value)
            obj.setdefault(name, {})[key] = (
                base64.b64encode(item).decode() if kind == BYTES_MAP else _text(item)
            )
    return obj


def decode(body: bytes) -> dict[str, Any]:
    """The object a protobuf body carries, as JSON would carry it; ProtobufError when it is not
    one this double reads."""
    if not body.startswith(MAGIC):
        raise ProtobufError("the body does not start with the Kubernetes protobuf magic k8s\\0")
    type_meta, raw = b"", b""
    for number, value in _fields(body[len(MAGIC) :]):
        if number == 1 and isinstance(value, bytes):
            type_meta = value
        elif number == 2 and isinstance(value, bytes):
            raw = value
    names = {n: _text(v) for n, v in _fields(type_meta) if n in (1, 2)}
    api_version, kind = names.get(1, ""), names.get(2, "")
    schema = KINDS.get((api_version, kind))
    if schema is None:
        readable = ", ".join(k for _, k in KINDS)
        raise ProtobufError(
            f"the API test double reads protobuf bodies of {readable} only, not "
            f"{kind or 'an object without a kind'} ({api_version or 'no apiVersion'}); send it "
            "as JSON (kubectl create -f FILE)"
        )
    return {"apiVersion": api_version, "kind": kind, **_message(raw, schema)}
