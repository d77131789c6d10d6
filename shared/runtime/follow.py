"""Following a KV bucket forever: the one watch loop every service's mirror runs.

A watch ends when the server drops it or the connection is lost, and fails when NATS is away or
its store is being checked after a reconnect (a bucket recreated, ``shared.runtime.bus``). Either
way the mirror must go on: a loop that let the error through stopped its service (a device plugin
died on one ``nats: timeout`` in a start-up storm; a binder on a NATS server killed). So:
each watch gives its initial values, then ``on_loaded`` with the keys they listed (a key the
mirror holds and they do not was deleted while no watch ran), then every change; a watch that
ends is started again after a pause, one that fails after a back-off doubling while it keeps
failing.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Final

from shared.clock import Clock
from shared.runtime.bus import Bus, KvEntry

log = logging.getLogger(__name__)

RETRY_S: Final = 0.5
MAX_RETRY_S: Final = 10.0


async def _nothing(_: set[str]) -> None:
    return None


async def follow(
    bus: Bus,
    bucket: str,
    *,
    on_entry: Callable[[KvEntry], Awaitable[None]],
    on_loaded: Callable[[set[str]], Awaitable[None]] = _nothing,
    clock: Clock,
    keys: str = ">",
    what: str = "",
) -> None:
    """Apply every value of ``bucket`` (its ``keys``) to ``on_entry``, forever (see the module
    docstring); ``on_loaded`` runs once each watch's initial values are all in."""
    name = what or bucket
    delay = RETRY_S
    while True:
        watch = bus.kv_watch(bucket, keys)
        listed: set[str] | None = set()
        try:
            async for entry in watch:
                if entry is None:
                    if listed is not None:
                        await on_loaded(listed)
                        listed = None
                        delay = RETRY_S
                    continue
                if listed is not None:
                    listed.add(entry.key)
                await on_entry(entry)
            log.warning(f"{name} watch ended; watching again")
        except Exception as error:  # NATS away, the store being checked: the mirror stays
            log.warning(
                f"{name} watch failed; watching again",
                extra={"bucket": bucket, "error": f"{type(error).__name__}: {error}"},
            )
            delay = min(delay * 2, MAX_RETRY_S)
        finally:
            with contextlib.suppress(Exception):
                await watch.aclose()  # type: ignore[attr-defined]
        await clock.sleep(delay)
