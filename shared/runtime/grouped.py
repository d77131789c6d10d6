"""Durable publishes to one stream from many tasks at once, sent in groups.

While one group is on its way (``Bus.js_publish_all``: on NATS one answer for the whole group),
the publishes that arrive meanwhile queue up and go as the next group. Under a burst a
service's workers publish together and a group carries many messages for one answer; a lone
publish goes at once, as with ``Bus.js_publish``.
"""

from __future__ import annotations

import asyncio
from typing import Final

from shared.runtime.bus import Bus, BusUnavailableError, Publication

MAX_GROUP: Final = 256
"""Messages sent for one answer at most (a bound on what one lost expectation sends again)."""


class GroupedPublisher:
    """Publishes to ``stream`` in groups (see the module docstring)."""

    def __init__(self, *, bus: Bus, stream: str) -> None:
        self._bus = bus
        self._stream = stream
        self._queued: list[tuple[Publication, asyncio.Future[None]]] = []
        self._sending: asyncio.Task[None] | None = None

    async def publish(self, subject: str, data: bytes, *, msg_id: str) -> None:
        """Publish durably (stored, or already: ``msg_id``, when it returns); raises as
        ``Bus.js_publish`` when the message's group could not be published (it may be stored)."""
        done = asyncio.get_running_loop().create_future()
        self._queued.append((Publication(subject, data, msg_id), done))
        if self._sending is None or self._sending.done():
            self._sending = asyncio.create_task(self._send())
        await done

    async def _send(self) -> None:
        group: list[tuple[Publication, asyncio.Future[None]]] = []
        try:
            while self._queued:
                group, self._queued = self._queued[:MAX_GROUP], self._queued[MAX_GROUP:]
                try:
                    await self._bus.js_publish_all(self._stream, [p for p, _ in group])
                except Exception as error:  # each publisher handles it as it would its own
                    _settle(group, error)
                else:
                    _settle(group, None)
        finally:  # stopped: those still waiting hear so (a publisher retries, or stops too)
            stopped = BusUnavailableError("the publisher stopped before sending")
            _settle(group + self._queued, stopped)
            self._queued = []


def _settle(
    group: list[tuple[Publication, asyncio.Future[None]]], error: BaseException | None
) -> None:
    for _, done in group:
        if done.done():  # its publisher gave up waiting (cancelled), or it is settled
            continue
        if error is None:
            done.set_result(None)
        else:
            done.set_exception(error)
