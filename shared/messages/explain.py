"""``tessera.placer.explain``: ``tessera explain`` asks the placers about a pod by name (request
and reply, core NATS; no stream keeps them).

Every placer replica listens (no queue group): each replica that knows the pod (it holds it, or
the shared claims, waiting board or its own recent outcomes name it) answers, and the asker takes
the first answer. A replica that does not know the pod stays silent, so no answer within the
asker's timeout means no placer knows it; no listener at all means no placer runs.
"""

from __future__ import annotations

from typing import Any

from shared.messages.base import Message


class ExplainRequest(Message, frozen=True, kw_only=True):
    """Which pod to explain."""

    namespace: str
    name: str


class ExplainReply(Message, frozen=True, kw_only=True):
    """One replica's explanation of the pod: the JSON object ``GET /v1/pods/<uid>`` answers on
    that replica's HTTP port (its claim and record, its last outcome there, and every node's
    verdict for it now)."""

    pod_uid: str
    namespace: str
    name: str
    replica: str
    explanation: dict[str, Any]
