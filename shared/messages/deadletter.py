"""``tessera.deadletter.<family>``: input a service rejected at its edge, kept with the reason."""

from __future__ import annotations

from typing import Literal

from shared.messages.base import Message


class DeadLetter(Message, frozen=True, kw_only=True):
    """A message that failed to decode or validate, republished so nothing is silently lost."""

    family: str
    subject: str
    reason: str
    service: str
    payload: str
    """The original bytes: as text when they are UTF-8, else base64."""
    payload_encoding: Literal["utf-8", "base64"] = "utf-8"
    received_at: float
    payload_truncated: bool = False
    """True when ``payload`` holds only the start of the original (it was too large to carry)."""
    payload_bytes: int = 0
    """Size of the original payload in bytes (0 in letters from before this field existed)."""
