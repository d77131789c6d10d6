"""``tessera.extender.pods``: the placer's scheduler extender asks the binder for a pod (request
and reply, core NATS; no stream keeps them).

kube-scheduler's bind call names the pod (namespace, name, UID) but does not carry it, and the
filter call that did may have gone to another placer replica. The binder, the only Kubernetes
client, answers from its informer (or reads the pod from the API server when its cache has not
seen it yet) with the pod parsed as the placer reads every pod.
"""

from __future__ import annotations

from shared.messages.base import Message
from shared.messages.pods import PodPending


class PodLookup(Message, frozen=True, kw_only=True):
    """Which pod the extender is binding."""

    uid: str
    namespace: str
    name: str


class PodLookupReply(Message, frozen=True, kw_only=True):
    """The pod as the placer reads it, or why there is none.

    ``pod`` is set for a pod that can be placed; ``node`` when it is already bound (to that node);
    ``error`` otherwise: gone, replaced by another pod of the same name, asking for no Tessera
    resource, or invalid (the field-precise reasons).
    """

    uid: str
    pod: PodPending | None = None
    node: str = ""
    error: str = ""
