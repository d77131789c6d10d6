"""The ``tessera`` console script: help for every command, clear errors, honest placeholders."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tessera.cli import ENTRIES

ROOT = Path(__file__).resolve().parents[1]
SERVICES = ("inventory", "placer", "binder", "deviceplugin", "dashboard")


def tessera(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tessera.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_top_level_help_lists_every_service() -> None:
    result = tessera("--help")
    assert result.returncode == 0
    for name in SERVICES:
        assert name in result.stdout


def test_version_is_the_package_version() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    result = tessera("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"tessera {project['version']}\n"


@pytest.mark.parametrize("service", SERVICES)
def test_each_service_help_documents_its_settings(service: str) -> None:
    result = tessera(service, "--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    assert "--nats-url" in text
    assert "env TESSERA_NATS_URL; default: nats://127.0.0.1:4222" in text
    assert "--http-port" in text
    assert "--config FILE" in text


@pytest.mark.parametrize("service", ["inventory", "deviceplugin"])
def test_per_node_services_take_node(service: str) -> None:
    text = " ".join(tessera(service, "--help").stdout.split())
    assert "--node" in text
    assert "NODE_NAME" in text


def test_configuration_error_is_one_line_and_exit_2() -> None:
    result = tessera("binder", "--http-port", "not-a-port")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "tessera binder: configuration error: --http-port (command line): Expected `int`, got `str`"
    )
    assert "Traceback" not in result.stderr


def test_a_service_without_its_core_says_so_and_exits_non_zero() -> None:
    unbuilt = [e.name for e in ENTRIES if e.name in SERVICES and _is_placeholder(e.name)]
    for name in unbuilt:
        result = tessera(name)
        assert result.returncode == 3
        assert "not built yet" in result.stderr


def _is_placeholder(name: str) -> bool:
    module = __import__(f"services.{name}.command", fromlist=["SERVICE"])
    return module.SERVICE.main is None


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_the_top_level_lists_each_command_with_its_own_summary(entry: object) -> None:
    """The top level lists the commands without importing them: its summaries must be theirs."""
    command = entry.load()  # type: ignore[attr-defined]
    assert (command.name, command.summary) == (entry.name, entry.summary)  # type: ignore[attr-defined]


def test_a_service_imports_only_its_own_command() -> None:
    """A per-node process (hundreds of them in a large simulated cluster) pays for its own code,
    not for the simulated cluster, the simulator or the dashboard."""
    probe = (
        "import sys; from tessera.cli import build_parser; build_parser(['inventory']); "
        "print(' '.join(sorted(m for m in sys.modules if m.startswith(('tessera.up', "
        "'tessera.devcluster', 'services.placer', 'services.dashboard', 'matplotlib')))))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    assert loaded == [], loaded
