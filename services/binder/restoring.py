"""The leader restores what is bound into a NATS store that lost it (DESIGN section 12).

NATS holds working state; the Kubernetes API holds what is bound. Whenever the store's epoch
(``shared.messages.store``) has no :class:`StoreRestored` yet (a new, empty store after NATS lost
its own; or a first start), the leading binder publishes a ``PodRestore`` (``restore.py``) for
every bound Tessera pod whose assignment record the store lacks, waits until a placer has
recorded each of them (publishing again what is not), then writes ``StoreRestored`` for the
epoch. Placers decide nothing new before it, so no running pod's GPUs are given to another. A
new epoch also republishes every pending pod and node's facts (the streams lost them too).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Final

from services.binder.metrics import BinderMetrics
from services.binder.restore import restore_of
from shared import codec, subjects
from shared.clock import Clock
from shared.kubeobjects import Pod
from shared.messages.pods import PodRestore
from shared.messages.store import StoreRestored
from shared.runtime.bus import Bus

log = logging.getLogger(__name__)

CHECK_S: Final = 1.0
"""How often the leader looks whether the store's epoch is restored."""
REPUBLISH_S: Final = 10.0
"""A restore not recorded this long after it was published is published again."""


class StoreRestorer:
    """Keeps the store's epoch restored while this binder leads (see the module docstring)."""

    def __init__(
        self,
        *,
        bus: Bus,
        clock: Clock,
        identity: str,
        metrics: BinderMetrics,
        bound_pods: Callable[[], Iterable[Pod]],
        republish: Callable[[], None],
    ) -> None:
        self._bus = bus
        self._clock = clock
        self._identity = identity
        self._metrics = metrics
        self._bound_pods = bound_pods
        self._republish = republish
        self._epoch = ""

    async def run(self) -> None:
        """Restore each epoch that is not restored yet, forever (cancelled with leadership)."""
        while True:
            epoch = self._bus.store_epoch
            if epoch:
                if self._epoch and epoch != self._epoch:
                    log.warning(
                        "NATS lost its store: republishing pending pods and node facts",
                        extra={"epoch": epoch},
                    )
                    self._republish()
                self._epoch = epoch
                try:
                    if await self._restored_epoch() != epoch:
                        await self._restore(epoch)
                except Exception as error:  # NATS away: tried again at the next check
                    log.warning(
                        "cannot restore the NATS store yet",
                        extra={"epoch": epoch, "error": f"{type(error).__name__}: {error}"},
                    )
            await self._clock.sleep(CHECK_S)

    async def _restored_epoch(self) -> str:
        entry = await self._bus.kv_get(subjects.KV_META, subjects.META_RESTORED)
        if entry is None:
            return ""
        try:
            return codec.decode(entry.value, StoreRestored).epoch
        except codec.DecodeError:
            return ""  # unreadable: restore again, and write a good one

    async def _restore(self, epoch: str) -> None:
        recorded = set(await self._bus.kv_keys(subjects.KV_ASSIGNMENTS))
        pending: dict[str, PodRestore] = {}
        for pod in self._bound_pods():
            restore = restore_of(pod, store_epoch=epoch)
            if isinstance(restore, str):
                self._metrics.restores.labels(outcome="refused").inc()
                log.warning(
                    "a bound pod's placement cannot be restored",
                    extra={"pod": pod.metadata.key, "reason": restore},
                )
                continue
            key = subjects.assignment_key(restore.node, restore.pod.uid)
            if key not in recorded:
                pending[key] = restore
        if pending:
            log.warning(
                "restoring the placements of bound pods into the NATS store",
                extra={"epoch": epoch, "pods": len(pending)},
            )
        restored = len(pending)
        attempt = 0
        while pending:
            if self._bus.store_epoch != epoch:
                return  # lost again meanwhile: start over on the new one
            attempt += 1
            for key, restore in pending.items():
                await self._bus.js_publish(
                    subjects.PODS_RESTORE,
                    codec.encode(restore),
                    msg_id=f"restore.{epoch}.{key}.{attempt}",
                )
            waited = 0.0
            while pending and waited < REPUBLISH_S:
                await self._clock.sleep(0.2)
                waited += 0.2
                recorded = set(await self._bus.kv_keys(subjects.KV_ASSIGNMENTS))
                still_bound = {
                    subjects.assignment_key(p.node, p.metadata.uid) for p in self._bound_pods()
                }
                pending = {k: r for k, r in pending.items() if k in still_bound - recorded}
        await self._bus.kv_put(
            subjects.KV_META,
            subjects.META_RESTORED,
            codec.encode(
                StoreRestored(
                    epoch=epoch,
                    restored_at=self._clock.now(),
                    pods=restored,
                    binder=self._identity,
                )
            ),
        )
        self._metrics.restores.labels(outcome="restored").inc(restored)
        log.info("the NATS store holds every bound placement", extra={"epoch": epoch})
