"""The device classes of the cluster's ResourceClaims and ResourceClaimTemplates into KV
``tessera-claim-classes`` (``shared/messages/claimclasses.py``): what the webhook reads to give
pods with ``gpu.tessera.dev`` claims Tessera's scheduler and to refuse them on any other
(docs/design.md §14). The webhook cannot read Kubernetes; the binder is its only client.

A ResourceClaimTemplate informer of its own and the claim informer's changes
(``draclaims.DraClaims``) keep each object's classes; a claim kube-controller-manager made from a
template for one pod is left out (a pod names the template, never that claim), so a burst of
template pods writes nothing here. Each change wakes the leader's publisher, which writes what
differs from what is published and, once both informers have listed, the word that every object
is there (``_listed``), as ``kvmirror.KvMirror`` writes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final

from services.binder.gateway import ClusterGateway
from services.binder.informer import Informer
from services.binder.kvmirror import KvMirror
from services.binder.metrics import BinderMetrics
from services.binder.rules.draobjects import (
    ClaimMeta,
    ResourceClaim,
    ResourceClaimTemplate,
    device_classes,
)
from shared import codec, subjects
from shared.clock import Clock
from shared.messages.claimclasses import ClaimClasses, ClaimClassesListed, ClaimKind
from shared.runtime.bus import Bus

BUCKET: Final = subjects.KV_CLAIM_CLASSES

Classes = tuple[str, ...]
Entry = tuple[ClaimKind, str, str, Classes]
"""kind, namespace, name, classes."""


class ClaimClassIndex(KvMirror[Entry]):
    """Every template's and user-made claim's classes, and the leader's writer of them (module
    docstring)."""

    what = "claim classes"

    def __init__(
        self,
        *,
        bus: Bus,
        gateway: ClusterGateway,
        clock: Clock,
        metrics: BinderMetrics,
        fence: Callable[[str], None],
        claims_synced: Callable[[], bool],
    ) -> None:
        super().__init__(
            bus=bus,
            clock=clock,
            fence=fence,
            bucket=BUCKET,
            listed_key=subjects.CLAIM_CLASSES_LISTED,
        )
        self._claims_synced = claims_synced
        self._current: dict[str, Entry] = {}
        self.templates: Informer[ResourceClaimTemplate] = Informer(
            name="resourceclaimtemplates",
            kind=ResourceClaimTemplate,
            gateway=gateway,
            on_change=self._template_changed,
            clock=clock,
            metrics=metrics,
        )

    # --- following -----------------------------------------------------------------------------

    def _take(self, kind: ClaimKind, meta: ClaimMeta, classes: Classes | None) -> None:
        """Object ``meta`` of ``kind`` now asks for ``classes`` (None: it is gone)."""
        key = subjects.claim_class_key(kind, meta.namespace, meta.name)
        if classes is None:
            if self._current.pop(key, None) is not None:
                self.changed()
            return
        entry: Entry = (kind, meta.namespace, meta.name, classes)
        if self._current.get(key) != entry:
            self._current[key] = entry
            self.changed()

    def _template_changed(
        self, old: ResourceClaimTemplate | None, new: ResourceClaimTemplate | None
    ) -> None:
        if new is not None:
            self._take("template", new.metadata, device_classes(new.spec.spec))
        elif old is not None:
            self._take("template", old.metadata, None)

    def claim_changed(self, old: ResourceClaim | None, new: ResourceClaim | None) -> None:
        """A claim the claim informer saw change (its handler calls this first)."""
        if new is not None and not new.made_for_a_pod:
            self._take("claim", new.metadata, device_classes(new.spec))
        elif new is None and old is not None and not old.made_for_a_pod:
            self._take("claim", old.metadata, None)

    # --- what is published ---------------------------------------------------------------------

    def current(self) -> Mapping[str, Entry]:
        return self._current

    def encode(self, key: str, value: Entry, *, now: float) -> bytes:
        kind, namespace, name, classes = value
        return codec.encode(
            ClaimClasses(
                kind=kind, namespace=namespace, name=name, classes=classes, observed_at=now
            )
        )

    def decode(self, key: str, data: bytes) -> Entry | None:
        try:
            message = codec.decode(data, ClaimClasses)
        except codec.DecodeError:
            return None  # rewritten, or deleted when no such object exists
        if subjects.claim_class_key(message.kind, message.namespace, message.name) != key:
            return None
        return (message.kind, message.namespace, message.name, message.classes)

    def listed(self, entries: int, *, now: float) -> bytes:
        return codec.encode(ClaimClassesListed(objects=entries, listed_at=now))

    def listable(self) -> bool:
        return self.templates.synced and self._claims_synced()
