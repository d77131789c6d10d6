"""The ``tessera`` console script: help for every command, clear errors, honest placeholders."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tessera.cli import COMMANDS

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
    unbuilt = [c.name for c in COMMANDS if c.name in SERVICES and _is_placeholder(c.name)]
    for name in unbuilt:
        result = tessera(name)
        assert result.returncode == 3
        assert "not built yet" in result.stderr


def _is_placeholder(name: str) -> bool:
    module = __import__(f"services.{name}.command", fromlist=["SERVICE"])
    return module.SERVICE.main is None
