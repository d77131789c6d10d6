"""KV ``tessera-namespaces``: the cluster's namespaces and their labels (binder -> placers).

A pod-affinity term may choose its namespaces by their labels (``namespaceSelector``). A pod the
binder publishes has its selectors resolved already (``shared.scheduling``, from the binder's
namespace informer), but a pod kube-scheduler sends to the placer's extender comes straight from
kube-scheduler, so the extender resolves them the same way from these entries: one per namespace
under its name, and under ``_listed`` (``subjects.NAMESPACES_LISTED``) the binder's word that
every namespace is there. Until that word is in, a selector cannot be resolved, and the extender
says so rather than guessing.
"""

from __future__ import annotations

from shared.messages.base import Message


class NamespaceLabels(Message, frozen=True, kw_only=True):
    """One namespace's labels (a namespace that is gone is a deleted key)."""

    namespace: str
    labels: dict[str, str] = {}
    observed_at: float = 0.0


class NamespacesListed(Message, frozen=True, kw_only=True):
    """Every namespace of the cluster has its entry, and the binder keeps them current."""

    namespaces: int
    """How many there were when this was written."""
    listed_at: float = 0.0
