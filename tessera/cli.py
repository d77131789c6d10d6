"""``tessera``: run a service (``inventory``, ``placer``, ``binder``, ``deviceplugin``,
``dashboard``, ``webhook``) or a tool (``simulate``, ``up``, ``explain``, ``nats-permissions``).

Every subcommand has a ``--help`` that lists its settings with their environment variables and
defaults. Only the command that runs is imported: a service process does not pay for the others
(the simulated cluster, the simulator, the dashboard...), which a cluster of many per-node
processes would pay over and over.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

from shared.runtime.command import Command, ServiceCommand


@dataclass(frozen=True)
class Entry:
    """A subcommand as the top level lists it, and where its :class:`Command` lives."""

    name: str
    summary: str
    target: str
    """``module:ATTRIBUTE`` of its Command (or ServiceCommand)."""

    def load(self) -> Command:
        module, attribute = self.target.split(":")
        found = getattr(importlib.import_module(module), attribute)
        command: Command = found.command() if isinstance(found, ServiceCommand) else found
        return command


# The summaries repeat the commands' own (tests/test_cli.py holds them equal), so that the top
# level's --help imports none of them.
ENTRIES: tuple[Entry, ...] = (
    Entry(
        "inventory",
        "publish NVML telemetry and GPU health for one node",
        "services.inventory.command:SERVICE",
    ),
    Entry("placer", "decide node and GPUs for pending pods", "services.placer.command:SERVICE"),
    Entry(
        "binder",
        "watch pods and nodes, bind decided pods, explain Pending ones",
        "services.binder.command:SERVICE",
    ),
    Entry(
        "deviceplugin",
        "serve the kubelet's device plugin API for one node",
        "services.deviceplugin.command:SERVICE",
    ),
    Entry(
        "dashboard",
        "serve a live web page of every GPU's slices and every Pending pod",
        "services.dashboard.command:SERVICE",
    ),
    Entry(
        "webhook",
        "serve the admission webhook: default Tessera pods, refuse what cannot be placed",
        "services.webhook.command:SERVICE",
    ),
    Entry(
        "simulate",
        "replay a pod trace through the placement core and compare policies",
        "services.placer.sim.command:COMMAND",
    ),
    Entry(
        "up",
        "run the whole system on this machine against a simulated cluster",
        "tessera.up.command:COMMAND",
    ),
    Entry(
        "explain",
        "say where a pod went and why, or why it is Pending (asks the placers)",
        "tessera.explain:COMMAND",
    ),
    Entry(
        "nats-permissions",
        "print the NATS subject permissions of each Tessera service identity",
        "tessera.nats_permissions:COMMAND",
    ),
)


def tessera_version() -> str:
    """The installed package's version (``pyproject.toml``), or ``unknown`` outside an install."""
    try:
        return version("tessera")
    except PackageNotFoundError:
        return "unknown"


def build_parser(chosen: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The ``tessera`` parser with the subcommands named in ``chosen`` (every one: None)
    configured; the others are listed only."""
    parser = argparse.ArgumentParser(
        prog="tessera",
        description="Tessera: GPU sharing for Kubernetes. Services talk over NATS; each "
        "subcommand runs one of them or a tool.",
        epilog="Run 'tessera <command> --help' for a command's settings.",
    )
    parser.add_argument("--version", action="version", version=f"tessera {tessera_version()}")
    sub = parser.add_subparsers(dest="command", metavar="<command>", required=True)
    for entry in ENTRIES:
        if chosen is not None and entry.name not in chosen:
            sub.add_parser(entry.name, help=entry.summary, add_help=False)
            continue
        command = entry.load()
        child = sub.add_parser(command.name, help=command.summary, description=command.description)
        command.configure(child)
        child.set_defaults(_run=command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    named = [a for a in arguments if not a.startswith("-")][:1]
    args = build_parser(named).parse_args(arguments)
    return int(args._run(args))


if __name__ == "__main__":
    sys.exit(main())
