"""``tessera``: run a service (``inventory``, ``placer``, ``binder``, ``deviceplugin``,
``dashboard``) or a tool (``simulate``, ``up``, ``nats-permissions``).

Every subcommand has a ``--help`` that lists its settings with their environment variables and
defaults.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from services.binder.command import SERVICE as BINDER
from services.dashboard.command import SERVICE as DASHBOARD
from services.deviceplugin.command import SERVICE as DEVICEPLUGIN
from services.inventory.command import SERVICE as INVENTORY
from services.placer.command import SERVICE as PLACER
from services.placer.sim.command import COMMAND as SIMULATE
from shared.runtime.command import Command
from tessera.nats_permissions import COMMAND as NATS_PERMISSIONS
from tessera.up.command import COMMAND as UP

COMMANDS: tuple[Command, ...] = (
    INVENTORY.command(),
    PLACER.command(),
    BINDER.command(),
    DEVICEPLUGIN.command(),
    DASHBOARD.command(),
    SIMULATE,
    UP,
    NATS_PERMISSIONS,
)


def build_parser(commands: Sequence[Command] = COMMANDS) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tessera",
        description="Tessera: GPU sharing for Kubernetes. Services talk over NATS; each "
        "subcommand runs one of them or a tool.",
        epilog="Run 'tessera <command> --help' for a command's settings.",
    )
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
