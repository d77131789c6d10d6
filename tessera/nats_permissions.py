"""``tessera nats-permissions``: print the NATS subject permissions of Tessera's identities.

The table itself is ``shared.permissions``; this command prints it for what configures a NATS
server: ``--format chart`` writes the Helm chart's ``files/nats-permissions.conf`` (the tests
check the committed file is exactly this output), ``--format json`` the allow lists of chosen
roles (on one node for the per-node roles) for an operator who makes the users, or the user JWTs
of a NATS server of their own.
"""

from __future__ import annotations

import argparse
import json
import sys
import typing

from shared import permissions
from shared.runtime.command import Command


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--format",
        choices=("chart", "json"),
        default="chart",
        help="chart: nats-server configuration variables, one per role (the chart's "
        "files/nats-permissions.conf); json: allow lists per identity (default: chart)",
    )
    parser.add_argument(
        "--role",
        action="append",
        choices=permissions.ROLES,
        help="json: only this role (repeatable; default: every role)",
    )
    parser.add_argument(
        "--node",
        default=None,
        help="json: the node of the per-node roles (deviceplugin, inventory); default: every "
        "node (one identity shared by all)",
    )


def run(args: argparse.Namespace) -> int:
    if args.format == "chart":
        if args.role or args.node:
            print(
                "tessera nats-permissions: --role and --node go with --format json", file=sys.stderr
            )
            return 2
        sys.stdout.write(permissions.chart_variables())
        return 0
    roles = typing.cast(list[permissions.Role], args.role or list(permissions.ROLES))
    print(json.dumps(permissions.table(roles, args.node), indent=2))
    return 0


COMMAND = Command(
    name="nats-permissions",
    summary="print the NATS subject permissions of each Tessera service identity",
    description="Print the subject permissions each Tessera identity gets on NATS (one per "
    "service, one per node for the device plugin and the inventory), from the one table in "
    "shared/permissions.py: as the Helm chart's configuration variables, or as JSON allow lists "
    "for a NATS server you configure yourself.",
    configure=configure,
    run=run,
)
