"""The device classes of the cluster's ResourceClaims and ResourceClaimTemplates into KV
``tessera-claim-classes`` (``shared/messages/claimclasses.py``): what the webhook reads to give
pods with ``gpu.tessera.dev`` claims Tessera's scheduler and to refuse them on any other
(docs/design.md §14). The webhook cannot read Kubernetes; the binder is its only client.

A ResourceClaimTemplate informer of its own and the claim informer's changes
(``draclaims.DraClaims``) keep each object's classes; a claim kube-controller-manager made from a
template for one pod is left out (a pod names the template, never that claim), so a burst of
template pods writes nothing here. Each change wakes the leader's publisher, which writes what
differs from what is published and, once both informers have listed, the word that every object
is there (``_listed``). A new leader, or one whose NATS lost its store, first reads what is
published, so a failover writes only what changed meanwhile. Every write is fenced by the Lease.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Final

from services.binder.gateway import ClusterGateway
from services.binder.informer import Informer
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
from shared.runtime.consumer import RETRY_S

log = logging.getLogger(__name__)

BUCKET: Final = subjects.KV_CLAIM_CLASSES

Classes = tuple[str, ...]
Entry = tuple[ClaimKind, str, str, Classes]
"""kind, namespace, name, classes."""


def classes_changes(
    published: dict[str, Classes | None], current: dict[str, Entry]
) -> tuple[list[str], list[str]]:
    """The keys to write (new, changed, or unreadable as published) and those to delete
    (gone), each sorted."""
    writes = sorted(key for key, entry in current.items() if published.get(key) != entry[3])
    deletes = sorted(key for key in published if key not in current)
    return writes, deletes


class ClaimClassIndex:
    """Every template's and user-made claim's classes, and the leader's writer of them (module
    docstring)."""

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
        self._bus = bus
        self._clock = clock
        self._fence = fence
        self._claims_synced = claims_synced
        self._current: dict[str, Entry] = {}
        self._published: dict[str, Classes | None] | None = None
        """What is published (None: to be read from KV first)."""
        self._listed = False
        self._dirty = asyncio.Event()
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
                self._dirty.set()
            return
        entry: Entry = (kind, meta.namespace, meta.name, classes)
        if self._current.get(key) != entry:
            self._current[key] = entry
            self._dirty.set()

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

    # --- publishing ----------------------------------------------------------------------------

    def resync(self) -> None:
        """Read what is published again, and write it all anew where it differs (a new leader, a
        store NATS lost)."""
        self._published = None
        self._listed = False
        self._dirty.set()

    async def run(self) -> None:
        """Publish every change, until cancelled (the leader's)."""
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            try:
                await self.publish()
            except Exception as error:  # NATS away, leadership lost: try again shortly
                log.warning("cannot publish the claim classes yet", extra={"error": repr(error)})
                await self._clock.sleep(RETRY_S)
                self._dirty.set()

    async def publish(self) -> None:
        """Write what differs from what is published, then (once both informers listed) the
        word that all is."""
        if self._published is None:
            self._published = await self._read_published()
        published = self._published
        current = dict(self._current)
        writes, deletes = classes_changes(published, current)
        now = self._clock.now()
        for key in writes:
            kind, namespace, name, classes = current[key]
            message = ClaimClasses(
                kind=kind, namespace=namespace, name=name, classes=classes, observed_at=now
            )
            self._fence("publish claim classes")
            await self._bus.kv_put(BUCKET, key, codec.encode(message))
            published[key] = classes
        for key in deletes:
            self._fence("delete claim classes")
            await self._bus.kv_delete(BUCKET, key)
            del published[key]
        if not self._listed and self.templates.synced and self._claims_synced():
            listed = ClaimClassesListed(objects=len(current), listed_at=now)
            self._fence("publish the claim classes listed")
            await self._bus.kv_put(BUCKET, subjects.CLAIM_CLASSES_LISTED, codec.encode(listed))
            self._listed = True
            log.info("claim classes published", extra={"objects": len(current)})
        elif not self._listed:
            await self._clock.sleep(RETRY_S / 4)  # an informer still lists: look again soon
            self._dirty.set()

    async def _read_published(self) -> dict[str, Classes | None]:
        found: dict[str, Classes | None] = {}
        for entry in await self._bus.kv_list(BUCKET, ">"):
            if entry.deleted or entry.key == subjects.CLAIM_CLASSES_LISTED:
                continue
            try:
                message = codec.decode(entry.value, ClaimClasses)
            except codec.DecodeError:
                found[entry.key] = None  # rewritten, or deleted when no such object exists
                continue
            key = subjects.claim_class_key(message.kind, message.namespace, message.name)
            found[entry.key] = message.classes if key == entry.key else None
        return found
