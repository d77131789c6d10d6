"""Time as a port: code that needs the time or to wait takes a :class:`Clock` by keyword.

Pure cores never take a clock; they take ``now`` as an argument. Shells take a Clock so tests can
drive time with a fake one instead of sleeping.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    """Wall time, monotonic time and waiting."""

    def now(self) -> float:
        """Seconds since the epoch (wall clock, for timestamps on the wire)."""
        ...

    def monotonic(self) -> float:
        """Seconds from an arbitrary origin that never go backwards (for intervals)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds``."""
        ...


class SystemClock:
    """The real clock."""

    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
