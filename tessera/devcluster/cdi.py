"""Container Device Interface specs, resolved as a CDI-enabled container runtime does for the CDI
device names a DRA plugin returns (the CDI spec, github.com/cncf-tags/container-device-interface,
``SPEC.md``).

A spec file (``*.json``, ``*.yaml``, ``*.yml``) in a spec directory holds ``cdiVersion``, ``kind``
(``vendor/class``), ``devices`` (each a ``name`` and its ``containerEdits``) and optional
spec-wide ``containerEdits``. A device's fully qualified name is ``vendor/class=name``. Resolving
a container's names applies, for each device in order, its spec's edits and then its own: ``env``
(``KEY=VALUE``, a later one wins), ``mounts`` (``hostPath``, ``containerPath``, ``options``:
``ro`` makes it read-only) and ``deviceNodes`` (``path``, the host's ``hostPath`` if it differs).
Later directories take precedence over earlier ones for the same device (``/etc/cdi`` then
``/var/run/cdi`` by default). A file that does not parse, or lacks a kind or device names, is
skipped with the reason; a name no spec defines is unresolvable, and the runtime refuses to create
the container (``unresolvable CDI devices ...``).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml

log = logging.getLogger(__name__)

_KIND: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
_NAME: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")
SUFFIXES: Final = (".json", ".yaml", ".yml")


class UnresolvableDevicesError(Exception):
    """Some CDI device names are defined by no spec: the container cannot be created."""

    def __init__(self, names: Sequence[str]) -> None:
        super().__init__(f"unresolvable CDI devices {', '.join(names)}")
        self.names = tuple(names)


@dataclass
class Edits:
    """What a container gets from its CDI devices."""

    env: dict[str, str] = field(default_factory=dict)
    mounts: list[tuple[str, str, bool]] = field(default_factory=list)
    """(container path, host path, read only)."""
    device_nodes: list[str] = field(default_factory=list)
    """Container paths of the device nodes."""

    def apply(self, edits: Any) -> None:
        if not isinstance(edits, dict):
            return
        for entry in edits.get("env") or []:
            key, _, value = str(entry).partition("=")
            if key:
                self.env[key] = value
        for mount in edits.get("mounts") or []:
            if isinstance(mount, dict) and mount.get("containerPath"):
                options = mount.get("options") or []
                self.mounts.append(
                    (str(mount["containerPath"]), str(mount.get("hostPath", "")), "ro" in options)
                )
        for node in edits.get("deviceNodes") or []:
            if isinstance(node, dict) and node.get("path"):
                self.device_nodes.append(str(node["path"]))


@dataclass(frozen=True)
class _Device:
    spec_edits: Any
    edits: Any


def _parse(path: Path) -> Any:
    text = path.read_text()
    return json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)


class SpecCache:
    """Spec files as parsed, each kept while the file stays the same one (inode, modification
    time, size): a runtime's CDI registry parses a spec again only when its file changes, and a
    node with many prepared claims would otherwise parse every spec for every container."""

    def __init__(self) -> None:
        self._parsed: dict[Path, tuple[tuple[int, int, int], Any]] = {}

    def parse(self, path: Path) -> Any:
        info = path.stat()
        key = (info.st_ino, info.st_mtime_ns, info.st_size)
        kept = self._parsed.get(path)
        if kept is not None and kept[0] == key:
            return kept[1]
        spec = _parse(path)
        self._parsed[path] = (key, spec)
        return spec

    def keep_only(self, paths: set[Path]) -> None:
        """Forget the files that are gone."""
        for path in set(self._parsed) - paths:
            del self._parsed[path]


def load(
    directories: Iterable[Path], cache: SpecCache | None = None
) -> tuple[dict[str, _Device], list[str]]:
    """Every device the spec directories define (later directories win), and why files were
    skipped."""
    devices: dict[str, _Device] = {}
    skipped: list[str] = []
    seen: set[Path] = set()
    for directory in directories:
        if not directory.is_dir():
            continue
        for path in sorted(p for p in directory.iterdir() if p.suffix in SUFFIXES):
            seen.add(path)
            try:
                spec = cache.parse(path) if cache is not None else _parse(path)
            except (OSError, ValueError, yaml.YAMLError) as error:
                skipped.append(f"{path.name}: {error}")
                continue
            problem = _problem(spec)
            if problem:
                skipped.append(f"{path.name}: {problem}")
                continue
            for device in spec["devices"]:
                devices[f"{spec['kind']}={device['name']}"] = _Device(
                    spec.get("containerEdits"), device.get("containerEdits")
                )
    for reason in skipped:
        log.warning("CDI spec skipped", extra={"reason": reason})
    if cache is not None:
        cache.keep_only(seen)
    return devices, skipped


def _problem(spec: Any) -> str:
    if not isinstance(spec, dict):
        return "not a CDI spec object"
    if not spec.get("cdiVersion"):
        return "cdiVersion is missing"
    if not _KIND.match(str(spec.get("kind", ""))):
        return f"invalid kind {spec.get('kind')!r}: must be vendor/class"
    devices = spec.get("devices")
    if not isinstance(devices, list) or not devices:
        return "no devices"
    for device in devices:
        if not isinstance(device, dict) or not _NAME.match(str(device.get("name", ""))):
            return f"invalid device {device!r}"
    return ""


def resolve(
    names: Sequence[str], directories: Iterable[Path], cache: SpecCache | None = None
) -> Edits:
    """The edits of ``names`` in order; UnresolvableDevicesError when some have no spec."""
    edits = Edits()
    if not names:
        return edits
    devices, _ = load(directories, cache)
    missing = [name for name in names if name not in devices]
    if missing:
        raise UnresolvableDevicesError(missing)
    for name in names:
        device = devices[name]
        edits.apply(device.spec_edits)
        edits.apply(device.edits)
    return edits
