"""Small asyncio helpers the service shells share."""

from __future__ import annotations

import asyncio
from typing import Any


async def cancel_and_wait(future: asyncio.Future[Any]) -> None:
    """Cancel ``future`` and wait until it has finished, whatever it ends with.

    Unlike ``with suppress(BaseException): await future``, a cancellation of the *calling* task
    that arrives meanwhile is not swallowed: it still stops the caller (a stop must not be lost).
    """
    future.cancel()
    await asyncio.wait({future})
    if not future.cancelled():
        future.exception()  # retrieved: it finished another way before the cancel landed
