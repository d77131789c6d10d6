"""The store's own state, KV bucket ``tessera-meta``: which store this is, and whether what is
bound has been restored into it.

NATS holds working state; the Kubernetes API holds what is bound (docs/design.md §12). When NATS
loses its store (a pod with an ``emptyDir`` restarted, a volume lost), the streams and buckets are
created again empty, and with them a new :class:`StoreEpoch`. The binder then restores every
bound pod's placement from its ``tessera.dev/assignment`` annotation (``PodRestore`` on
``tessera.pods.restore``, which a placer books, claims and records) and writes
:class:`StoreRestored` for the epoch once all of them are recorded; placers decide nothing new
before that, so no GPU a running pod holds is ever given to another.
"""

from __future__ import annotations

from shared.messages.base import Message


class StoreEpoch(Message, frozen=True, kw_only=True):
    """Key ``epoch``: created (create-only) with the streams and buckets of a new store."""

    epoch: str
    """A random id, new with every empty store."""
    created_at: float


class StoreRestored(Message, frozen=True, kw_only=True):
    """Key ``restored``: every bound pod's placement is recorded in the store of ``epoch``."""

    epoch: str
    restored_at: float
    pods: int
    """Placements restored from the Kubernetes API (0 when nothing was missing)."""
    binder: str
    """Identity of the binder that restored them."""
