"""The NATS connection's state (the first layer of :class:`~shared.runtime.nats.NatsBus`):
nats-py's callbacks, reconnect back-off, and why a server could not be reached or refused the
credentials.

All layers of the adapter log as ``shared.runtime.bus``, the logger's name from before the adapter
was split from the port, so that log filters keep working.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import time
from urllib.parse import urlsplit

import nats.errors
from nats.aio.client import Client as NatsClient

from shared.config import NatsSecurity
from shared.runtime.bus import ConnectionState, ConnectionStatus

log = logging.getLogger("shared.runtime.bus")


class NatsRefusedError(Exception):
    """The server refused the connection for its credentials or TLS; retrying cannot help."""


class NatsUnreachableError(ConnectionError):
    """The server could not be reached (refused, DNS, timeout, network): retrying may help.
    The message says which (:func:`unreachable_reason`)."""


def _address(url: str) -> tuple[str, str]:
    """(host, host:port) of one server URL (an unparsable one as it is)."""
    try:
        where = urlsplit(url.strip())
        host = where.hostname or url
        return host, f"{host}:{where.port or 4222}"
    except ValueError:
        return url, url


def unreachable_reason(error: BaseException, url: str) -> str:
    """Why the server at ``url`` (several, comma-separated: a cluster) could not be reached, for a
    log line and ``/readyz``: the connection refused, a name DNS cannot resolve, a timeout,
    another network error."""
    if isinstance(error, NatsUnreachableError):
        return str(error)
    servers = [_address(part) for part in url.split(",") if part.strip()] or [(url, url)]
    host = ", ".join(dict.fromkeys(h for h, _ in servers))
    address = ", ".join(a for _, a in servers)
    if isinstance(error, ConnectionRefusedError):
        return f"connection refused by {address} (is nats-server running there?)"
    if isinstance(error, socket.gaierror):
        return f"DNS cannot resolve {host!r}: {error.strerror or error}"
    if isinstance(error, TimeoutError | nats.errors.TimeoutError):
        return f"no answer from {address} in time (timeout)"
    if isinstance(error, OSError) and error.strerror:
        return f"network error reaching {address}: {error.strerror}"
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


AUTHORIZATION_MARKERS = (
    "authorization violation",
    "authentication expired",
    "authentication revoked",
)
"""Words in a server error that mean the credentials were refused (compared in lower case)."""

MAX_AUTH_BACKOFF_S = 30.0
QUIET_LOG_S = 30.0
"""Other connection errors repeating every attempt are logged at most this often."""


def refusal_of(error: BaseException) -> str | None:
    """Why ``error`` means the server refused our credentials or TLS, or None when it does not."""
    if isinstance(error, ssl.SSLError):
        return f"TLS failed: {error}"
    text = str(error).lower()
    if isinstance(error, nats.errors.AuthorizationError) or any(
        marker in text for marker in AUTHORIZATION_MARKERS
    ):
        return f"authorization failed: {str(error) or type(error).__name__}"
    return None


def _tls_context(security: NatsSecurity) -> ssl.SSLContext | None:
    if not security.uses_tls:
        return None
    context = ssl.create_default_context(cafile=security.tls_ca_file or None)
    if security.tls_cert_file:
        context.load_cert_chain(security.tls_cert_file, security.tls_key_file or None)
    return context


DEFAULT_INBOX_PREFIX = "_INBOX"
"""nats-py's reply-subject prefix, for a client that is none of Tessera's identities."""


class NatsConnection:
    """Where the connection to NATS stands, kept from nats-py's callbacks (the
    ``ConnectionMonitor`` of the adapter)."""

    def __init__(self, client: NatsClient) -> None:
        self._nc = client
        self._checked = asyncio.Event()
        """Set while the store the connection reached has been checked (topology, epoch)."""
        self._checked.set()
        self._state: ConnectionState = "connected"
        self._reason = ""
        self._disconnects = 0
        self._reconnects = 0
        self._auth_failures = 0
        self._failures_in_row = 0
        self._reconnect_wait = 1.0
        self._last_quiet_log = 0.0
        self._draining = False
        loop = asyncio.get_running_loop()
        self._lost: asyncio.Future[None] = loop.create_future()
        self._closed: asyncio.Future[str] = loop.create_future()
        self._up = asyncio.Event()
        """Set while connected (and once closed for good, to wake whoever waits for it)."""
        self._up.set()

    # --- connection state (callbacks of nats-py) -----------------------------------------------

    def _on_error(self, error: Exception) -> None:
        refusal = refusal_of(error)
        if refusal is not None:
            self._auth_failures += 1
            self._state, self._reason = "authorization failed", refusal
        self._failures_in_row += 1
        delay = self._delay_after(self._failures_in_row)
        extra = {"error": f"{type(error).__name__}: {error}", "retry_s": delay}
        if refusal is not None:  # each back-off step, so an operator sees it without a flood
            log.error("nats refused the credentials", extra=extra)
            return
        now = time.monotonic()
        if now - self._last_quiet_log >= QUIET_LOG_S or self._failures_in_row == 1:
            self._last_quiet_log = now
            log.warning("nats error", extra=extra | {"attempts": self._failures_in_row})

    def _delay_after(self, failures: int) -> float:
        if self._state == "authorization failed":
            return float(min(self._reconnect_wait * 2 ** max(failures - 1, 0), MAX_AUTH_BACKOFF_S))
        return self._reconnect_wait

    def _next_delay(self) -> float:
        """Seconds before the next reconnect attempt: none for the first after a loss."""
        return 0.0 if self._failures_in_row == 0 else self._delay_after(self._failures_in_row)

    def _on_disconnect(self) -> None:
        # Commands queued but not yet written would be sent after the reconnect, long after
        # their callers gave up: drop them, and fail the requests waiting for answers.
        self._nc._pending.clear()
        self._nc._pending_data_size = 0
        self._failures_in_row = 0  # errors so far were of the lost connection, not attempts
        if not self._lost.done():
            self._lost.set_result(None)
        self._up.clear()
        self._checked.clear()
        if self._state == "connected" and not self._draining:
            self._disconnects += 1
            self._state, self._reason = "reconnecting", "disconnected; reconnecting"
            log.warning("nats disconnected")

    def _on_reconnect(self) -> None:
        self._reconnects += 1
        self._failures_in_row = 0
        self._state, self._reason = "connected", ""
        self._lost = asyncio.get_running_loop().create_future()
        self._up.set()
        log.info("nats reconnected")

    def _on_closed(self) -> None:
        self._up.set()
        self._checked.set()
        if not self._lost.done():
            self._lost.set_result(None)
        if self._draining:
            return
        error = self._nc.last_error
        reason = (refusal_of(error) if error else None) or (
            f"connection closed: {type(error).__name__}: {error}" if error else "connection closed"
        )
        self._state, self._reason = "closed", reason
        if not self._closed.done():
            self._closed.set_result(reason)

    def connection_status(self) -> ConnectionStatus:
        state = self._state
        if state == "connected" and not self._nc.is_connected:
            state = "reconnecting"
        return ConnectionStatus(
            state=state,
            reason="" if state == "connected" else self._reason or "disconnected; reconnecting",
            disconnects=self._disconnects,
            reconnects=self._reconnects,
            authorization_failures=self._auth_failures,
        )

    async def wait_closed(self) -> str:
        return await asyncio.shield(self._closed)

    @property
    def connected(self) -> bool:
        # nats-py reports the new connection up (and flushes) before it calls our reconnected
        # callback; until then the bus still holds the lost connection's future, and a write
        # would be judged lost the moment it started. Up means both.
        return bool(self._nc.is_connected) and not self._lost.done()

    async def _reconnected(self) -> None:
        """Return once the connection is up again (or closed for good)."""
        await self._up.wait()
