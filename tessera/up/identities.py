"""The NATS identities ``tessera up`` gives its processes: one per service, one per node for the
per-node services, each with the subject permissions of ``shared.permissions``.

Passwords are random, written to files readable by this user only in the run directory, and
reach each process as ``TESSERA_NATS_USER`` plus ``TESSERA_NATS_PASSWORD_FILE`` (never on a
command line). ``admin`` (every subject) is ``tessera up``'s own connection and what an operator
uses to look around (``--keep`` prints where its password is).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from shared import permissions
from shared.config import NatsSecurity
from shared.runtime.nats import NatsBus

ADMIN: Final = "admin"


@dataclass(frozen=True)
class Identity:
    user: str
    password_file: Path
    grants: permissions.Permissions | None
    """None: every subject (the admin)."""

    @property
    def password(self) -> str:
        return self.password_file.read_text()

    def env(self) -> dict[str, str]:
        """What a service process needs to log in as this identity."""
        return {
            "TESSERA_NATS_USER": self.user,
            "TESSERA_NATS_PASSWORD_FILE": str(self.password_file),
        }

    def security(self) -> NatsSecurity:
        return NatsSecurity(user=self.user, password=self.password)


class Identities:
    """Every identity of one run, made at construction (files under ``directory``).

    ``shared_node_identities``: also one identity per per-node role that speaks for every node
    (what a chart without per-node credentials gives its DaemonSets).
    """

    def __init__(
        self, directory: Path, nodes: Iterable[str], *, shared_node_identities: bool = False
    ) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        os.chmod(directory, 0o700)
        self.directory = directory
        self._by_user: dict[str, Identity] = {}
        self._add(ADMIN, None)
        for role in ("placer", "binder", "dashboard", "webhook"):
            self._add(permissions.user_name(role), permissions.permissions(role))
        for node in nodes:
            for role in sorted(permissions.NODE_ROLES):
                self._add(permissions.user_name(role, node), permissions.permissions(role, node))
        if shared_node_identities:
            for role in sorted(permissions.NODE_ROLES):
                self._add(permissions.user_name(role), permissions.permissions(role))

    def _add(self, user: str, grants: permissions.Permissions | None) -> None:
        path = self.directory / f"{user}.password"
        path.write_text(secrets.token_hex(16))
        os.chmod(path, 0o600)
        self._by_user[user] = Identity(user=user, password_file=path, grants=grants)

    def of(self, role: str, node: str | None = None) -> Identity:
        """The identity of ``role`` (on ``node``); ``admin`` for the admin."""
        return self._by_user[ADMIN if role == ADMIN else permissions.user_name(role, node)]

    async def connect(
        self,
        url: str,
        role: str,
        node: str | None = None,
        *,
        inbox_node: str | None = None,
        request_timeout: float = 5.0,
    ) -> NatsBus:
        """A bus logged in as ``role`` (on ``node``), with that identity's inbox prefix (on
        ``inbox_node`` for a shared per-node identity) and topology rights."""
        identity = self.of(role, node)
        return await NatsBus.connect(
            url,
            name=f"tessera-{identity.user}",
            security=identity.security(),
            request_timeout=request_timeout,
            inbox_prefix=(
                "_INBOX" if role == ADMIN else permissions.inbox_prefix(role, node or inbox_node)
            ),
            update_topology=role == ADMIN or permissions.may_update_topology(role),
            create_epoch=role == ADMIN or permissions.creates_store(role),
        )

    def server_config(self) -> str:
        """The nats-server ``authorization`` block admitting exactly these identities."""
        return permissions.server_authorization(
            [
                permissions.User(name=i.user, password=i.password, permissions=i.grants)
                for i in self._by_user.values()
            ]
        )
