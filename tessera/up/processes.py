"""The processes ``tessera up`` starts, and the guarantee that none of them outlives it.

Every child is started through a tiny launcher that asks the kernel to SIGKILL the child when its
parent dies (``prctl(PR_SET_PDEATHSIG)``), checks the parent is still the one that started it
(it may have died in between), then ``exec``\\ s the real program: so even a ``tessera up`` killed
with SIGKILL leaves no process behind. Each child also runs in its own session (process group):
a Ctrl-C on the terminal reaches ``tessera up`` alone, which stops the children in order
(SIGTERM, then SIGKILL to the whole group after a grace period), and a chaos test can SIGKILL
one service (:meth:`Supervisor.kill`) and start it again (:meth:`Supervisor.restart`) with the
same command line and log file.

Each service logs to its own file in the run directory; its HTTP port comes from its
``service starting`` log line (every service is started with ``--http-port 0``). A child may host
several services (``tessera.up.agents``): each is then known by its own name too
(:meth:`Supervisor.start`'s ``hosts``), its port read from the line naming it as ``agent``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

LAUNCHER: Final = (
    "import ctypes, os, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG, SIGKILL\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    os._exit(70)  # the parent died before the death signal was armed\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)
STOP_GRACE_S: Final = 10.0


class StartError(Exception):
    """A child did not start (it exited, or never said where it listens)."""


@dataclass
class Child:
    """One supervised process."""

    name: str
    argv: list[str]
    log: Path
    env: dict[str, str] | None = None
    process: subprocess.Popen[bytes] | None = None
    http_port: int | None = None
    starts: int = 0
    kills: list[float] = field(default_factory=list)
    _log_offset: int = 0

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def python_command(*args: str) -> list[str]:
    """A ``tessera`` subcommand run by this Python."""
    return [sys.executable, "-m", "tessera.cli", *args]


class Supervisor:
    """Starts children with a parent-death guarantee and stops every one of them."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.logs = run_dir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.children: dict[str, Child] = {}
        self.hosted: dict[str, str] = {}
        """Service name -> the child that hosts it (among others)."""
        self._ports: dict[str, int] = {}

    def start(
        self,
        name: str,
        argv: list[str],
        *,
        env: dict[str, str] | None = None,
        hosts: Iterable[str] = (),
    ) -> Child:
        """Start ``argv`` as ``name`` (log in ``logs/<name>.log``); ``hosts``: the services it
        runs, each known by its name from then on."""
        if name in self.children and self.children[name].alive:
            raise ValueError(f"{name} is already running")
        child = self.children.get(name) or Child(
            name=name, argv=argv, log=self.logs / f"{name.replace('/', '-')}.log", env=env
        )
        self.children[name] = child
        for service in hosts:
            self.hosted[service] = name
        self._spawn(child)
        return child

    def child(self, name: str) -> Child:
        """The child running service ``name`` (itself, or the one hosting it)."""
        return self.children[self.hosted.get(name, name)]

    def _spawn(self, child: Child) -> None:
        child.http_port = None
        for service, host in self.hosted.items():
            if host == child.name:
                self._ports.pop(service, None)
        child._log_offset = child.log.stat().st_size if child.log.exists() else 0
        with child.log.open("ab") as sink:
            child.process = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", LAUNCHER, str(os.getpid()), *child.argv],
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                env=child.env,
                start_new_session=True,
            )
        child.starts += 1

    def restart(self, name: str) -> Child:
        child = self.child(name)
        if child.alive:
            raise ValueError(f"{name} is still running")
        self._spawn(child)
        return child

    def kill(self, name: str, signum: int = signal.SIGKILL) -> None:
        """Send ``signum`` to ``name`` (the child running it) and wait for it to exit."""
        child = self.child(name)
        if child.process is None or child.process.poll() is not None:
            return
        child.kills.append(time.time())
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.process.pid, signum)
        child.process.wait()

    def http_port(self, name: str) -> int | None:
        """The port of ``name``'s ``service starting`` line of its current run, once logged."""
        hosted = name in self.hosted
        child = self.child(name)
        known = self._ports.get(name) if hosted else child.http_port
        if known is not None:
            return known
        try:
            with child.log.open("rb") as handle:
                handle.seek(child._log_offset)
                text = handle.read().decode(errors="replace")
        except OSError:
            return None
        for line in text.splitlines():
            if "service starting" not in line:
                continue
            with contextlib.suppress(ValueError):
                entry = json.loads(line)
                if entry.get("msg") != "service starting" or "http_port" not in entry:
                    continue
                if not hosted:
                    child.http_port = int(entry["http_port"])
                    return child.http_port
                if entry.get("agent") == name:
                    self._ports[name] = int(entry["http_port"])
                    return self._ports[name]
        return None

    def check_alive(self, name: str) -> None:
        child = self.child(name)
        if not child.alive:
            code = child.process.returncode if child.process is not None else None
            raise StartError(
                f"{name} exited with code {code}; the end of {child.log}:\n{child.log_tail()}"
            )

    def stop_all(self, names: Iterable[str] | None = None, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM every child (or those ``names``; newest first), wait up to ``grace_s``,
        SIGKILL what is left."""
        wanted = set(self.children) if names is None else set(names)
        chosen = [c for c in self.children.values() if c.name in wanted]
        running = [c for c in reversed(chosen) if c.alive]
        for child in running:
            assert child.process is not None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for child in running:
            assert child.process is not None
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        for child in chosen:
            if child.process is None or child.process.poll() is not None:
                continue
            # The whole group: nothing a child started may stay behind either.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.process.wait(timeout=5)
