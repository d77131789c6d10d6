"""Ports chosen for a local system's processes before they start (nats-server's client and
route ports, the webhook's TLS port).

A port probed free with ``bind(("127.0.0.1", 0))`` comes from the kernel's ephemeral range, where
every other ``bind`` to port 0 (each service starts with ``--http-port 0``) and every outgoing
connection gets its port too: between the probe and the process binding it, another process can
be handed the same port (in CI a node's inventory took the webhook's TLS port that way, and the
webhook could not listen). So the port is chosen below that range, where the kernel hands out
none on its own, and probed free there.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path
from typing import Final

EPHEMERAL_RANGE: Final = Path("/proc/sys/net/ipv4/ip_local_port_range")
DEFAULT_EPHEMERAL_START: Final = 32768
"""Linux's default start of the ephemeral range, where the file above cannot be read."""
BELOW: Final = 10000
"""How far below the ephemeral range's start ports are chosen from."""
LOWEST: Final = 1024
"""The lowest port chosen (those below are privileged)."""
TRIES: Final = 200


def ephemeral_start(path: Path = EPHEMERAL_RANGE) -> int:
    """The first port of the kernel's ephemeral range."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return DEFAULT_EPHEMERAL_START


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(*, start: int | None = None, choose: random.Random | None = None) -> int:
    """A TCP port free on loopback now, below the ephemeral range (``start``: its first port,
    read from the kernel by default); where the range leaves no room below it, one the kernel
    picks."""
    end = ephemeral_start() if start is None else start
    low = max(LOWEST, end - BELOW)
    chooser = choose if choose is not None else random.SystemRandom()
    if end - low >= TRIES:
        for _ in range(TRIES):
            port = chooser.randrange(low, end)
            if _bindable(port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
