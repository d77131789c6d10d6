"""Keep the plugin served and registered with the kubelet, across kubelet restarts.

The kubelet's protocol: the plugin serves its DevicePlugin socket in the plugin directory, then
calls ``Registration.Register`` on ``kubelet.sock`` in the same directory. A restarting kubelet
deletes every socket there, creates ``kubelet.sock`` anew and forgets the plugin: the plugin must
notice, serve its socket again and register again.

:class:`KubeletLink` does that by watching the identity (device, inode, change time) of
``kubelet.sock`` and the presence of its own socket, polling through the clock port (a stat is
cheaper than a filesystem-notification dependency and the kubelet takes seconds to restart anyway).
It owns no device or assignment state: the service keeps that across every restart of the socket.

The gRPC server and the Register call are ports (:class:`PluginServer`, :data:`Register`), so this
module imports no gRPC; ``server.py`` provides both.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final, Protocol

from shared.clock import Clock

log = logging.getLogger(__name__)

KUBELET_SOCKET: Final = "kubelet.sock"
DEFAULT_PLUGIN_DIR: Final = "/var/lib/kubelet/device-plugins"
MAX_SOCKET_PATH: Final = 107
"""Unix socket paths longer than this cannot be bound or dialled."""

SocketIdentity = tuple[int, int, int]


class RegistrationError(Exception):
    """The kubelet could not be reached or refused the registration (the message says which)."""


class PluginServer(Protocol):
    """The plugin's own gRPC server."""

    async def start(self, socket_path: str) -> None:
        """Serve on ``socket_path`` (replacing any stale file there)."""
        ...

    async def stop(self) -> None:
        """Stop serving (a no-op when not serving)."""
        ...


Register = Callable[[str], Awaitable[None]]
"""Register with the kubelet listening on the given socket path; raises RegistrationError."""

StateReport = Callable[[bool, str], None]
"""Told (registered, reason when not) on every change, e.g. to feed ``/readyz``."""


def socket_identity(path: Path) -> SocketIdentity | None:
    """(device, inode, change time) of ``path``, or None when it does not exist."""
    try:
        status = os.stat(path)
    except FileNotFoundError:
        return None
    return (status.st_dev, status.st_ino, status.st_ctime_ns)


class KubeletLink:
    """Serve and register; serve and register again whenever the kubelet restarts."""

    def __init__(
        self,
        *,
        plugin_dir: Path,
        endpoint: str,
        server: PluginServer,
        register: Register,
        clock: Clock,
        poll_s: float,
        report: StateReport,
        max_backoff_s: float = 30.0,
    ) -> None:
        self._kubelet_socket = plugin_dir / KUBELET_SOCKET
        self._plugin_socket = plugin_dir / endpoint
        self._server = server
        self._register = register
        self._clock = clock
        self._poll_s = poll_s
        self._report = report
        self._max_backoff_s = max_backoff_s
        self.registrations = 0

    @property
    def plugin_socket(self) -> Path:
        return self._plugin_socket

    async def run(self) -> None:
        """Until cancelled: wait for the kubelet, serve, register, watch for a restart."""
        backoff = self._poll_s
        try:
            while True:
                kubelet = await self._wait_for_kubelet()
                await self._server.stop()
                await self._server.start(str(self._plugin_socket))
                try:
                    await self._register(str(self._kubelet_socket))
                except RegistrationError as error:
                    reason = f"registration with the kubelet failed: {error}"
                    self._report(False, reason)
                    log.warning(reason, extra={"retry_s": backoff})
                    await self._clock.sleep(backoff)
                    backoff = min(backoff * 2, self._max_backoff_s)
                    continue
                backoff = self._poll_s
                self.registrations += 1
                self._report(True, "")
                log.info(
                    "registered with the kubelet",
                    extra={"socket": str(self._plugin_socket), "times": self.registrations},
                )
                reason = await self._watch(kubelet)
                self._report(False, reason)
                log.warning(f"{reason}; serving and registering again")
                await self._server.stop()
        finally:
            await self._server.stop()

    async def _wait_for_kubelet(self) -> SocketIdentity:
        reported = False
        while True:
            identity = socket_identity(self._kubelet_socket)
            if identity is not None:
                return identity
            if not reported:
                self._report(False, f"waiting for the kubelet socket {self._kubelet_socket}")
                reported = True
            await self._clock.sleep(self._poll_s)

    async def _watch(self, kubelet: SocketIdentity) -> str:
        """Return, with the reason, once the registration no longer holds."""
        while True:
            await self._clock.sleep(self._poll_s)
            current = socket_identity(self._kubelet_socket)
            if current is None:
                return f"the kubelet socket {self._kubelet_socket} disappeared (kubelet restart)"
            if current != kubelet:
                return f"the kubelet socket {self._kubelet_socket} was recreated (kubelet restart)"
            if socket_identity(self._plugin_socket) is None:
                return f"the plugin socket {self._plugin_socket} was removed"
