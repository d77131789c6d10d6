"""Ports chosen before a process starts (``tessera.up.ports``): below the kernel's ephemeral
range, where no other process's ``bind`` to port 0 can be handed them meanwhile."""

from __future__ import annotations

import random
import socket
from pathlib import Path

import pytest

from tessera.up.ports import DEFAULT_EPHEMERAL_START, ephemeral_start, free_port


class Picks(random.Random):
    """A chooser that picks the given ports in turn."""

    def __init__(self, *ports: int) -> None:
        super().__init__(0)
        self._ports = list(ports)

    def randrange(self, start: int, stop: int | None = None, step: int = 1) -> int:
        port = self._ports.pop(0)
        assert stop is not None and start <= port < stop, (start, stop, port)
        return port


def bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_a_port_is_chosen_below_the_ephemeral_range_and_is_free() -> None:
    start = ephemeral_start()
    ports = {free_port() for _ in range(20)}
    assert all(max(1024, start - 10000) <= p < start for p in ports), (start, sorted(ports))
    assert all(bindable(p) for p in ports)


@pytest.mark.parametrize(
    ("content", "start"),
    [("40000\t60999\n", 40000), ("", DEFAULT_EPHEMERAL_START), (None, DEFAULT_EPHEMERAL_START)],
)
def test_the_range_is_read_from_the_kernel(tmp_path: Path, content: str | None, start: int) -> None:
    path = tmp_path / "ip_local_port_range"
    if content is not None:
        path.write_text(content)
    assert ephemeral_start(path) == start


def test_a_port_in_use_is_passed_over() -> None:
    used, free = [p for p in range(20000, 22000) if bindable(p)][:2]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", used))
        assert free_port(start=25000, choose=Picks(used, free)) == free


def test_a_range_with_no_room_below_it_leaves_the_choice_to_the_kernel() -> None:
    port = free_port(start=1100, choose=Picks())  # a pick here would fail: none is asked
    assert bindable(port)
