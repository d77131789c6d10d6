"""requirements.lock pins every dependency, and .venv holds exactly what it pins."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _name(requirement: str) -> str:
    """The normalised distribution name of a requirement (PEP 503)."""
    match = re.match(r"[A-Za-z0-9._-]+", requirement.strip())
    assert match, requirement
    return re.sub(r"[-_.]+", "-", match.group(0)).lower()


def _locked() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"requirements.lock: not an exact pin: {line}"
            pins[_name(name)] = version
    return pins


def test_every_dependency_in_pyproject_is_locked() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        declared.extend(extra)
    missing = sorted({_name(r) for r in declared} - set(_locked()))
    assert not missing, f"not in requirements.lock (run `bash scripts/lock`): {missing}"


def test_the_environment_holds_the_locked_versions() -> None:
    drifted = []
    for name, version in _locked().items():
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            drifted.append(f"{name}: locked {version}, not installed")
            continue
        if installed != version:
            drifted.append(f"{name}: locked {version}, installed {installed}")
    assert not drifted, f"run `bash scripts/setup` (or `bash scripts/lock`): {drifted}"
