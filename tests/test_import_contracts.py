"""The import contracts (``lint-imports`` in ``scripts/test``) cover every service: a service
added without a contract would escape them (issue 24)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _contracts() -> dict[str, dict[str, Any]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {c["name"]: c for c in config["tool"]["importlinter"]["contracts"]}


def _services() -> list[str]:
    return sorted(
        path.name
        for path in (ROOT / "services").iterdir()
        if (path / "__init__.py").is_file() and not path.name.startswith("_")
    )


def test_every_service_is_independent_and_has_a_pure_core_under_contract() -> None:
    contracts = _contracts()
    independent = set(contracts["Services never import each other"]["modules"])
    pure = contracts["Pure cores import no I/O library"]["source_modules"]
    missing = [
        name
        for name in _services()
        if f"services.{name}" not in independent
        or not any(m == f"services.{name}" or m.startswith(f"services.{name}.") for m in pure)
    ]
    assert not missing, (
        f"services with no import contract: {missing}; list each in the independence contract "
        "and its pure core in 'Pure cores import no I/O library' (pyproject.toml)"
    )


def test_each_io_library_is_forbidden_everywhere_but_in_its_adapters() -> None:
    """Deny by default: the contract's sources are whole packages, the adapters are exceptions."""
    contracts = _contracts()
    for library in ("pynvml", "grpc", "nats", "kubernetes_asyncio"):
        (contract,) = [c for c in contracts.values() if c.get("forbidden_modules") == [library]]
        assert sorted(contract["source_modules"]) == ["services", "shared", "tessera"], contract
        assert all(f"-> {library}" in line for line in contract.get("ignore_imports", []))


NOT_LAYERED = {"services.deviceplugin._proto", "services.deviceplugin.protogen"}
"""Generated gRPC code and the tool that generates it: no layer of the service imports them but
the gRPC server (which the grpc contract lists)."""


def _modules(service: str) -> set[str]:
    """Every module and package directly under ``services/<service>``."""
    folder = ROOT / "services" / service
    found = {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}
    found |= {p.name for p in folder.iterdir() if (p / "__init__.py").is_file()}
    return {f"services.{service}.{name}" for name in found} - NOT_LAYERED


def test_every_module_of_every_service_sits_in_a_layer() -> None:
    """Deny by default: a new file must be placed in its service's layers, or no contract would
    say what it may import."""
    layered: dict[str, set[str]] = {}
    for contract in _contracts().values():
        if contract["type"] != "layers":
            continue
        (container,) = contract["containers"]
        names = {
            name.strip()
            for layer in contract["layers"]
            for name in layer.replace("|", ":").split(":")
        }
        layered[container] = {f"{container}.{name}" for name in names}
    for service in _services():
        container = f"services.{service}"
        assert container in layered, f"{container} has no layers contract"
        unplaced = sorted(_modules(service) - layered[container])
        assert not unplaced, f"modules in no layer of {container}'s contract: {unplaced}"
