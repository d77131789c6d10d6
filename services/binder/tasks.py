"""Cancellation that cannot be lost.

On Python 3.11, ``asyncio.wait_for`` (used inside nats-py) swallows a cancellation that arrives
as its inner future completes: the task runs on as if nothing happened. A TaskGroup cancels its
children only once, so a long-running loop that lost its cancellation would keep a stopping
service alive forever. The request is still recorded (``Task.cancelling()``), so loops call
:func:`checkpoint` and stop anyway.
"""

from __future__ import annotations

import asyncio


def checkpoint() -> None:
    """Raise CancelledError if this task was asked to stop (even if a library swallowed it)."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
