"""``tessera.bindings.<node>``: what the binder did with a decision (binder -> placer)."""

from __future__ import annotations

from typing import Literal

from shared.messages.base import Message

BindOutcome = Literal["bound", "failed", "gone"]


class BindingResult(Message, frozen=True, kw_only=True):
    """``bound``: pod annotated and bound. ``failed``: the placer must release the booking.
    ``gone``: the pod vanished before binding."""

    pod_uid: str
    namespace: str
    name: str
    node: str
    outcome: BindOutcome
    reason: str = ""
    at: float
