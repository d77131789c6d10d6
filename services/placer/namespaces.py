"""The extender's view of the cluster's namespaces: what resolves a namespace selector of a pod
kube-scheduler asks about.

A pod the binder publishes has its pod-affinity namespace selectors resolved already, from the
binder's namespace informer (``shared.scheduling``). A pod kube-scheduler sends to the extender's
filter and prioritize comes straight from kube-scheduler, so the extender resolves its selectors
the same way from the labels the binder publishes (KV ``tessera-namespaces``,
``shared/messages/namespaces.py``), followed here. Until the binder's word that every namespace
is listed is in, a selector cannot be resolved: :meth:`Namespaces.unresolved` says so, and the
extender refuses the pod with that reason rather than resolve the selector against too few
namespaces (an anti-affinity term that matched no namespace would be a term ignored).
"""

from __future__ import annotations

import logging
from typing import Final

from services.placer.shell.watches import kv_delivery
from shared import subjects
from shared.clock import Clock
from shared.kubeobjects import Pod
from shared.messages.namespaces import NamespaceLabels, NamespacesListed
from shared.runtime.bus import Bus, KvEntry
from shared.runtime.edge import Edge
from shared.runtime.follow import follow
from shared.scheduling import uses_namespace_selector

log = logging.getLogger(__name__)

FAMILY: Final = "namespaces"

NOT_LISTED: Final = (
    "the pod's namespaceSelector cannot be resolved yet: the Tessera binder has not published "
    f"the cluster's namespaces (KV {subjects.KV_NAMESPACES}); is a binder of this version "
    "running?"
)


class Namespaces:
    """Every namespace's labels as the binder published them, and whether they are all there."""

    def __init__(self) -> None:
        self.labels: dict[str, dict[str, str]] = {}
        self.listed = False
        """The binder's word that every namespace is in :attr:`labels` is in."""

    def put(self, name: str, labels: dict[str, str] | None) -> None:
        """Namespace ``name`` has ``labels`` (None: it is gone)."""
        if labels is None:
            self.labels.pop(name, None)
        else:
            self.labels[name] = labels

    def keep_only(self, keys: set[str]) -> None:
        """A watch listed exactly ``keys``: forget what was deleted while no watch ran."""
        for name in [n for n in self.labels if n not in keys]:
            del self.labels[name]
        if subjects.NAMESPACES_LISTED not in keys:
            self.listed = False

    def unresolved(self, pod: Pod) -> str:
        """Why a namespace selector of ``pod`` cannot be resolved now (empty: it can, or the pod
        names none)."""
        if self.listed or not uses_namespace_selector(pod):
            return ""
        return NOT_LISTED


async def follow_namespaces(namespaces: Namespaces, *, bus: Bus, edge: Edge, clock: Clock) -> None:
    """Keep ``namespaces`` current from KV ``tessera-namespaces``, forever; an entry that does not
    decode, or names another namespace than its key, is rejected at the edge (counted and
    dead-lettered) and changes nothing."""

    async def on_entry(entry: KvEntry) -> None:
        delivery = kv_delivery(entry, subjects.KV_NAMESPACES)
        if entry.key == subjects.NAMESPACES_LISTED:
            if entry.deleted:
                namespaces.listed = False
            elif await edge.accept(delivery, NamespacesListed, family=FAMILY) is not None:
                if not namespaces.listed:
                    log.info(
                        "the cluster's namespaces are known",
                        extra={"count": len(namespaces.labels)},
                    )
                namespaces.listed = True
            return
        if entry.deleted:
            namespaces.put(entry.key, None)
            return
        found = await edge.accept(delivery, NamespaceLabels, family=FAMILY)
        if found is None:
            return
        if found.namespace != entry.key:
            await edge.reject(
                delivery,
                family=FAMILY,
                reason=f"entry under key {entry.key} names {found.namespace!r}",
                kind="validate",
            )
            return
        namespaces.put(found.namespace, dict(found.labels))

    async def on_loaded(keys: set[str]) -> None:
        namespaces.keep_only(keys)

    await follow(
        bus,
        subjects.KV_NAMESPACES,
        on_entry=on_entry,
        on_loaded=on_loaded,
        clock=clock,
        what="namespaces",
    )
