"""The cluster's namespaces and their labels into KV ``tessera-namespaces``: what the placer's
extender resolves the namespace selectors of kube-scheduler's pods with
(``shared/messages/namespaces.py``; the pods the binder publishes have theirs resolved here
already).

The namespace informer keeps every namespace's labels (``ClusterSync.namespace_labels``); each
change wakes the leader's publisher (``kvmirror.KvMirror``), which writes what differs from what
is published (:func:`namespace_changes`) and, once everything is written, the word that every
namespace is listed (``_listed``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from services.binder.kvmirror import KvMirror, mirror_changes
from shared import codec, subjects
from shared.clock import Clock
from shared.messages.namespaces import NamespaceLabels, NamespacesListed
from shared.runtime.bus import Bus

Labels = Mapping[str, str]
Published = Mapping[str, Labels | None]
"""Namespace -> the labels published for it (None: an entry that does not read)."""


def namespace_changes(
    published: Published, current: Mapping[str, Labels]
) -> tuple[list[str], list[str]]:
    """The namespaces to write (new, relabelled, or unreadable as published) and those to delete
    (gone), each sorted by name."""
    return mirror_changes(published, current)


class NamespacePublisher(KvMirror[Labels]):
    """The leader's writer of ``tessera-namespaces`` (module docstring)."""

    what = "namespaces"

    def __init__(
        self,
        *,
        bus: Bus,
        clock: Clock,
        labels: Mapping[str, Labels],
        fence: Callable[[str], None],
    ) -> None:
        super().__init__(
            bus=bus,
            clock=clock,
            fence=fence,
            bucket=subjects.KV_NAMESPACES,
            listed_key=subjects.NAMESPACES_LISTED,
        )
        self._labels = labels
        """The namespace informer's: every namespace's labels, kept current."""

    def current(self) -> Mapping[str, Labels]:
        return {name: dict(labels) for name, labels in self._labels.items()}

    def encode(self, key: str, value: Labels, *, now: float) -> bytes:
        return codec.encode(NamespaceLabels(namespace=key, labels=dict(value), observed_at=now))

    def decode(self, key: str, data: bytes) -> Labels | None:
        try:
            message = codec.decode(data, NamespaceLabels)
        except codec.DecodeError:
            return None  # rewritten, or deleted when no such namespace exists
        return message.labels if message.namespace == key else None

    def listed(self, entries: int, *, now: float) -> bytes:
        return codec.encode(NamespacesListed(namespaces=entries, listed_at=now))
