"""``tessera``: run a service (``inventory``, ``placer``, ``binder``, ``deviceplugin``,
``dashboard``, ``webhook``) or a tool (``simulate``, ``up``, ``explain``).

Every subcommand has a ``--help`` that lists its settings with their environment variables and
defaults.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version

from services.binder.command import SERVICE as BINDER
from services.dashboard.command import SERVICE as DASHBOARD
from services.deviceplugin.command import SERVICE as DEVICEPLUGIN
from services.inventory.command import SERVICE as INVENTORY
from services.placer.command import SERVICE as PLACER
from services.placer.sim.command import COMMAND as SIMULATE
from services.webhook.command import SERVICE as WEBHOOK
from shared.runtime.command import Command
from tessera.explain import COMMAND as EXPLAIN
from tessera.up.command import COMMAND as UP

COMMANDS: tuple[Command, ...] = (
    INVENTORY.command(),
    PLACER.command(),
    BINDER.command(),
    DEVICEPLUGIN.command(),
    DASHBOARD.command(),
    WEBHOOK.command(),
    SIMULATE,
    UP,
    EXPLAIN,
)


def tessera_version() -> str:
    """The installed package's version (``pyproject.toml``), or ``unknown`` outside an install."""
    try:
        return version("tessera")
    except PackageNotFoundError:
        return "unknown"


def build_parser(commands: Sequence[Command] = COMMANDS) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tessera",
        description="Tessera: GPU sharing for Kubernetes. Services talk over NATS; each "
        "subcommand runs one of them or a tool.",
        epilog="Run 'tessera <command> --help' for a command's settings.",
    )
    parser.add_argument("--version", action="version", version=f"tessera {tessera_version()}")
    sub = parser.add_subparsers(dest="command", metavar="<command>", required=True)
    for command in commands:
        child = sub.add_parser(
            command.name,
            help=command.summary,
            description=command.description,
        )
        command.configure(child)
        child.set_defaults(_run=command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args._run(args))


if __name__ == "__main__":
    sys.exit(main())
