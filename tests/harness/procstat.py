"""What a process has used so far, from Linux ``/proc``: the benchmarks' CPU and wake-up counts."""

from __future__ import annotations

import os
from pathlib import Path


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def context_switches(pid: int) -> int:
    """Context switches of process ``pid``'s threads so far: how often one went to sleep waiting
    for something (voluntary) or was put off the CPU (involuntary). On a machine with more
    processes than cores, each costs CPU beyond the work itself: the thread comes back to caches
    another process has filled (0 once it is gone)."""
    total = 0
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        try:
            lines = status.read_text().splitlines()
        except OSError:
            continue  # the thread ended meanwhile
        total += sum(int(line.split(":", 1)[1]) for line in lines if "ctxt_switches:" in line)
    return total
