"""Every option and environment variable the chart gives a Tessera container is a setting of that
service, and every value it passes is one the service's own settings loader accepts.

The services' settings are read from the real command line (``tessera <service> --help`` is
built from the same parser): a template that names a setting a service does not have fails here,
instead of the service ignoring an environment variable or refusing to start on a cluster.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from functools import cache

import pytest

from services.binder.command import SERVICE as BINDER
from services.dashboard.command import SERVICE as DASHBOARD
from services.deviceplugin.command import SERVICE as DEVICEPLUGIN
from services.inventory.command import SERVICE as INVENTORY
from services.placer.command import SERVICE as PLACER
from services.webhook.command import SERVICE as WEBHOOK
from shared.config import (
    ENV_ALIASES,
    ProcessSettings,
    add_settings_arguments,
    env_var,
    load_settings,
)
from tessera.cli import build_parser
from tests.deploy.chart import Container, containers, option_values, render
from tests.deploy.variants import VARIANTS

# Settings the chart passes that a service does not have yet (for work landing in parallel with
# the chart). test_not_yet_implemented_is_current fails as soon as one of them lands, so that this
# list is emptied when the branches are merged, never left stale.
NOT_YET_IMPLEMENTED: dict[str, frozenset[str]] = {}

SETTINGS: dict[str, type[ProcessSettings]] = {
    service.name: service.settings
    for service in (INVENTORY, PLACER, BINDER, DEVICEPLUGIN, DASHBOARD, WEBHOOK)
}
# Values the downward API fills in on a cluster.
FIELD_REF_SAMPLES = {"spec.nodeName": "gpu-node-1", "metadata.name": "tessera-placer-7d9f-x2k4q"}


@cache
def cli_settings() -> dict[str, dict[str, str]]:
    """Per ``tessera`` subcommand: each option string -> the setting (field) it sets."""
    parser = build_parser()
    (subparsers,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    found: dict[str, dict[str, str]] = {}
    for name, sub in subparsers.choices.items():
        found[name] = {
            option: action.dest
            for action in sub._actions
            for option in action.option_strings
            if action.dest not in ("help", "config")
        }
    return found


def env_settings(service: str) -> dict[str, str]:
    """Environment variable -> setting, as the service's settings loader reads them."""
    fields = set(cli_settings().get(service, {}).values())
    names = {env_var(field): field for field in fields}
    for field, aliases in ENV_ALIASES.items():
        if field in fields:
            names.update(dict.fromkeys(aliases, field))
    return names


def option_field(option: str) -> str:
    """``--no-leader-elect`` / ``--leader-elect`` -> ``leader_elect``."""
    return option.removeprefix("--").removeprefix("no-").replace("-", "_")


def tessera_containers(variant: str) -> Iterator[tuple[str, Container]]:
    for container in containers(render(VARIANTS[variant])):
        args = container.args()
        if args and args[0] in SETTINGS:
            assert container.spec["name"] == args[0], container.where
            yield args[0], container


def test_every_tessera_subcommand_the_chart_runs_is_known() -> None:
    ran = {service for variant in VARIANTS for service, _ in tessera_containers(variant)}
    assert ran == set(SETTINGS)
    assert set(SETTINGS) <= set(cli_settings())


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_option_and_env_var_is_a_setting_of_its_service(variant: str) -> None:
    problems = []
    for service, container in tessera_containers(variant):
        options = cli_settings().get(service, {})
        pending = NOT_YET_IMPLEMENTED.get(service, frozenset())
        for option in option_values(container.args()):
            if option not in options and option_field(option) not in pending:
                problems.append(f"{container.where}: `tessera {service}` has no option {option}")
        known_env = env_settings(service)
        for env in container.env():
            name = env["name"]
            if not (name.startswith("TESSERA_") or any(name in a for a in ENV_ALIASES.values())):
                continue  # not a Tessera setting (NVIDIA_VISIBLE_DEVICES for the runtime)
            field = known_env.get(name)
            if field is None and name.removeprefix("TESSERA_").lower() not in pending:
                problems.append(f"{container.where}: `tessera {service}` reads no variable {name}")
    assert not problems, "\n".join(problems)


def _loader_input(service: str, container: Container) -> tuple[list[str], dict[str, str]]:
    """The container's arguments and environment as the process would see them, minus the
    settings its service does not have yet (the service's parser would refuse those)."""
    pending = NOT_YET_IMPLEMENTED.get(service, frozenset())
    argv = [
        arg for arg in container.args()[1:] if option_field(arg.partition("=")[0]) not in pending
    ]
    env: dict[str, str] = {}
    for entry in container.env():
        if entry["name"].removeprefix("TESSERA_").lower() in pending:
            continue
        if "value" in entry:
            env[entry["name"]] = entry["value"]
        elif "fieldRef" in entry.get("valueFrom", {}):
            env[entry["name"]] = FIELD_REF_SAMPLES[entry["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            env[entry["name"]] = "from-a-secret"
    return argv, env


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_the_services_settings_loader_accepts_every_value(variant: str) -> None:
    for service, container in tessera_containers(variant):
        settings_type = SETTINGS.get(service)
        if settings_type is None:
            continue  # a command that does not exist yet (allow-listed above)
        argv, env = _loader_input(service, container)
        parser = argparse.ArgumentParser(prog=f"tessera {service}", exit_on_error=False)
        add_settings_arguments(parser, settings_type)
        parsed = parser.parse_args(argv)
        settings = load_settings(settings_type, env=env, cli=vars(parsed))
        assert settings.http_port == int(option_values(container.args())["--http-port"])
        if "node" in settings_type.__struct_fields__:
            node = getattr(settings, "node")  # noqa: B009 (a per-node service's field)
            assert node == FIELD_REF_SAMPLES["spec.nodeName"], container.where


def test_not_yet_implemented_is_current() -> None:
    """Each allow-listed setting is still missing from its service and still passed by the chart."""
    passed: dict[str, set[str]] = {service: set() for service in SETTINGS}
    for variant in VARIANTS:
        for service, container in tessera_containers(variant):
            passed[service] |= {option_field(o) for o in option_values(container.args())}
            passed[service] |= {e["name"].removeprefix("TESSERA_").lower() for e in container.env()}
    for service, pending in NOT_YET_IMPLEMENTED.items():
        implemented = pending & set(cli_settings().get(service, {}).values())
        assert not implemented, (
            f"`tessera {service}` now has {sorted(implemented)}: remove them from "
            "NOT_YET_IMPLEMENTED in tests/deploy/test_settings.py"
        )
        unused = pending - passed[service]
        assert not unused, f"the chart never passes {sorted(unused)} to {service}: drop them"


def test_a_misnamed_option_is_caught() -> None:
    """The check above can fail: an option no service has is reported."""
    assert "--placer-idd" not in cli_settings()["placer"]
    assert option_field("--placer-idd") not in NOT_YET_IMPLEMENTED.get("placer", frozenset())
    assert cli_settings()["placer"]["--placer-id"] == "placer_id"
    assert env_settings("inventory")["NODE_NAME"] == "node"
