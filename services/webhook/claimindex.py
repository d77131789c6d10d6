"""The device classes of the cluster's ResourceClaims and ResourceClaimTemplates, as the webhook
knows them from KV ``tessera-claim-classes`` (the binder publishes it:
``shared/messages/claimclasses.py``; docs/design.md §14).

:class:`ClaimIndex` is plain state: each entry's classes, and whether the binder's word that
every object is listed (``_listed``) and the watch's initial values are both in
(:attr:`ClaimIndex.known`). Before that no name is known. After it, a name not in the index is
still unknown, never "not Tessera's": it may have been created an instant ago. An entry that does
not decode, or whose key does not match what it says, is ignored (counted by the shell).
:func:`watch_claim_classes` feeds it from a KV watch and wakes whoever waits for a name
(:meth:`ClaimIndex.learned`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from shared import codec, subjects
from shared.messages.claimclasses import ClaimClasses, ClaimKind
from shared.runtime.bus import Bus
from shared.runtime.tasks import ChangeCounter


class ClaimIndex:
    """Every claim's and template's device classes (see the module docstring)."""

    def __init__(self) -> None:
        self._classes: dict[str, tuple[str, ...]] = {}
        self.listed = False
        """The binder said every object is published."""
        self.synced = False
        """The watch's initial values are read."""
        self.changed = ChangeCounter()
        """Bumped by the feeder after each change it applied (:meth:`learned` waits on it)."""

    @property
    def known(self) -> bool:
        return self.listed and self.synced

    def lookup(self, kind: ClaimKind, namespace: str, name: str) -> tuple[str, ...] | None:
        """The object's classes; None when not known (yet)."""
        if not self.known:
            return None
        return self._classes.get(subjects.claim_class_key(kind, namespace, name))

    def apply(self, key: str, value: bytes | None) -> str:
        """Take one KV change (``value`` None: deleted); why it was ignored, or empty."""
        if key == subjects.CLAIM_CLASSES_LISTED:
            self.listed = value is not None
            return ""
        if value is None:
            self._classes.pop(key, None)
            return ""
        try:
            message = codec.decode(value, ClaimClasses)
        except codec.DecodeError as error:
            return f"claim classes at {key} do not decode: {error}"
        if subjects.claim_class_key(message.kind, message.namespace, message.name) != key:
            return f"claim classes at {key} name {message.kind} {message.namespace}/{message.name}"
        self._classes[key] = message.classes
        return ""

    def mark_synced(self) -> None:
        self.synced = True

    def restart(self) -> None:
        """A new watch delivers every value again: know nothing until it has."""
        self._classes.clear()
        self.listed = self.synced = False

    async def learned(self, known: Callable[[], bool], timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for ``known()`` to hold, looking again at each change;
        whether it holds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            seen = self.changed.version  # noted before looking: no change is missed
            if known():
                return True
            left = deadline - loop.time()
            if left <= 0 or not await self.changed.wait_past(seen, timeout=left):
                return known()

    def __len__(self) -> int:
        return len(self._classes)


async def watch_claim_classes(
    bus: Bus, index: ClaimIndex, ignored: Callable[[str], None], count: Callable[[int], None]
) -> None:
    """Feed ``index`` from the bucket until the watch ends (``ignored``: each entry ignored,
    with why; ``count``: how many objects it knows, after each change)."""
    watch = bus.kv_watch(subjects.KV_CLAIM_CLASSES)
    try:
        async for entry in watch:
            if entry is None:
                index.mark_synced()
            else:
                problem = index.apply(entry.key, None if entry.deleted else entry.value)
                if problem:
                    ignored(problem)
            await index.changed.bump()
            count(len(index) if index.known else 0)
    finally:
        await watch.aclose()
