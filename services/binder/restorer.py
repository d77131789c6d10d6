"""The leader restores what is bound into a NATS store that lost it (docs/design.md §12).

NATS holds working state; the Kubernetes API holds what is bound. Whenever the store's epoch
(``shared.messages.epoch``) has no :class:`StoreRestored` yet (a new, empty store after NATS lost
its own; or a first start), the leading binder publishes a ``PodRestore`` (``restore.py``) for
every bound Tessera pod whose assignment record the store lacks, waits until a placer has
recorded each of them (publishing again what is not), then writes ``StoreRestored`` for the
epoch. Placers decide nothing new before it, so no running pod's GPUs are given to another. A
new epoch also republishes every pending pod and node's facts (the streams lost them too).

No placement is published unchecked: first each node's device plugin is asked what it granted
(``tessera.grants.<node>``), and the node's placements are checked together against that
(``restorecheck.py``): one the annotation misstates is restored as the plugin granted it, one
that would over-commit a GPU and that the plugin cannot vouch for is not booked. Each such
outcome is an Event on the pod (``RestoreCorrected``, ``RestoreRefused``, ``RestoreOverfull``),
a count in ``tessera_binder_restores_total{outcome}`` and a log line.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Final

from services.binder.events import EventRecorder
from services.binder.metrics import BinderMetrics
from services.binder.rules import describe
from services.binder.rules.restorecheck import Checked, check_node
from services.binder.rules.restoreplan import restore_of
from shared import codec, subjects
from shared.clock import Clock
from shared.kubeobjects import Pod
from shared.messages.epoch import StoreRestored
from shared.messages.grants import GrantsRequest, NodeGrants
from shared.messages.pods import PodRestore
from shared.runtime.bus import Bus

log = logging.getLogger(__name__)

CHECK_S: Final = 1.0
"""How often the leader looks whether the store's epoch is restored."""
REPUBLISH_S: Final = 10.0
"""A restore not recorded this long after it was published is published again."""
GRANTS_TIMEOUT_S: Final = 2.0
"""How long a node's device plugin has to say what it granted."""
GRANTS_AT_ONCE: Final = 100
"""Nodes' plugins asked at the same time."""
REPORTS: Final = {
    "corrected": ("RestoreCorrected", "Its placement was restored as its device plugin granted it"),
    "overcommit": ("RestoreRefused", "Its placement was not restored"),
    "overfull": ("RestoreOverfull", "Its placement was restored on an over-full GPU"),
}
"""Outcome -> (Event reason, what happened)."""


class StoreRestorer:
    """Keeps the store's epoch restored while this binder leads (see the module docstring)."""

    def __init__(
        self,
        *,
        bus: Bus,
        clock: Clock,
        identity: str,
        metrics: BinderMetrics,
        recorder: EventRecorder,
        bound_pods: Callable[[], Iterable[Pod]],
        republish: Callable[[], None],
    ) -> None:
        self._bus = bus
        self._recorder = recorder
        self._clock = clock
        self._identity = identity
        self._metrics = metrics
        self._bound_pods = bound_pods
        self._republish = republish
        self._epoch = ""
        self._done = ""
        """The store epoch last found restored (by this binder or the one before)."""

    def restored(self) -> bool:
        """Whether the store in use is restored: until then a binder must not bind, or a pod
        held at the ambiguity gate behind a bound pod whose record the loss took would pass
        it (and the device plugin serve the bound pod's Allocate from the other's record)."""
        return bool(self._done) and self._done == self._bus.store_epoch

    async def run(self) -> None:
        """Restore each epoch that is not restored yet, forever (cancelled with leadership)."""
        while True:
            await self.check()
            await self._clock.sleep(CHECK_S)

    async def check(self) -> None:
        """Restore the store in use unless it is restored already."""
        epoch = self._bus.store_epoch
        if not epoch:
            return
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
            self._done = epoch
        except Exception as error:  # NATS away: tried again at the next check
            log.warning(
                "cannot restore the NATS store yet",
                extra={"epoch": epoch, "error": f"{type(error).__name__}: {error}"},
            )

    async def _granted(self, node: str) -> NodeGrants | None:
        """What ``node``'s device plugin says it granted; None when it does not answer."""
        question = codec.encode(GrantsRequest(node=node))
        try:
            reply = await self._bus.request(
                subjects.grants(node), question, timeout=GRANTS_TIMEOUT_S
            )
            return codec.decode(reply, NodeGrants)
        except Exception as error:  # no plugin there, NATS away, an answer that does not read
            log.warning(
                "the device plugin did not say what it granted; its node's placements are "
                "restored as their annotations say",
                extra={"node": node, "error": f"{type(error).__name__}: {error}"},
            )
            return None

    def _report(self, pod: Pod, verdict: Checked) -> None:
        """Count, log and tell on the pod what the check found (nothing for ``restored``)."""
        if verdict.outcome == "restored":
            return
        self._metrics.restores.labels(outcome=verdict.outcome).inc()
        reason, what = REPORTS[verdict.outcome]
        note = f"{what} after NATS lost its store: {'; '.join(verdict.problems)}"
        log.warning(
            f"restore checked: {what.lower()}",
            extra={
                "pod": pod.metadata.key,
                "outcome": verdict.outcome,
                "problems": verdict.problems,
            },
        )
        meta = pod.metadata
        self._recorder.emit(
            regarding=describe.regarding_pod(
                namespace=meta.namespace, name=meta.name, uid=meta.uid
            ),
            event_type="Warning",
            reason=reason,
            action="Restoring",
            note=note,
        )

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
        by_node: dict[str, list[tuple[Pod, PodRestore]]] = defaultdict(list)
        for pod in self._bound_pods():
            restore = restore_of(pod, store_epoch=epoch)
            if isinstance(restore, str):
                self._metrics.restores.labels(outcome="refused").inc()
                log.warning(
                    "a bound pod's placement cannot be restored",
                    extra={"pod": pod.metadata.key, "reason": restore},
                )
                continue
            by_node[restore.node].append((pod, restore))
        pending: dict[str, PodRestore] = {}
        lacking = [
            node
            for node, placed in sorted(by_node.items())
            if {subjects.assignment_key(node, r.pod.uid) for _, r in placed} - recorded
        ]
        answers: dict[str, NodeGrants | None] = {}
        for start in range(0, len(lacking), GRANTS_AT_ONCE):  # the nodes' plugins, concurrently
            asked = lacking[start : start + GRANTS_AT_ONCE]
            answers.update(
                zip(asked, await asyncio.gather(*map(self._granted, asked)), strict=True)
            )
        for node in lacking:
            placed = by_node[node]
            checked = check_node([r for _, r in placed], answers[node])
            for (pod, _), verdict in zip(placed, checked, strict=True):
                key = subjects.assignment_key(node, verdict.pod_uid)
                if key in recorded:
                    continue  # the store holds it: it only counted in the check
                self._report(pod, verdict)
                if verdict.restore is not None:
                    pending[key] = verdict.restore
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
