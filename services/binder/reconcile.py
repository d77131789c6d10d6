"""Reconciliation on becoming leader: finish what a previous leader left half done.

Every placed claim is looked at again (:meth:`~services.binder.binding.PlacementBinder.reconcile`:
a previous leader may have stopped anywhere between a record's write and its Binding), every
allocated record's pod marked (:meth:`~services.binder.reporting.Reporter.reconcile`), and for
each assignment record whose pod is gone (:func:`~services.binder.rules.plan.repair`)
``PodDeleted`` is
published, the record withdrawn first when its GPUs were never allocated. Runs beside the leader's
other work; a step that fails (API or NATS away) is tried again until it succeeds.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
from collections.abc import Awaitable, Callable

from services.binder.rules.plan import repair
from services.binder.sync import PodRef
from shared.clock import Clock
from shared.kubeobjects import Pod
from shared.runtime.consumer import retry_delay
from shared.runtime.records import RecordMirror
from shared.runtime.tasks import checkpoint

log = logging.getLogger(__name__)

MAX_STEPS_AT_ONCE = 32


async def reconcile(
    *,
    records: RecordMirror,
    pod_of: Callable[[str], Pod | None],
    end_pod: Callable[[str, PodRef], Awaitable[object]],
    clock: Clock,
) -> None:
    """Publish ``PodDeleted`` for every record whose pod is gone, each until done."""
    work: list[Callable[[], Awaitable[object]]] = []
    for view in records.views():
        record = view.record
        if repair(record, pod_of(record.pod_uid)) == "deleted":
            ref = PodRef(record.namespace, record.name, record.node)
            work.append(functools.partial(end_pod, record.pod_uid, ref))
    if not work:
        return
    log.info("reconciling assignment records", extra={"actions": len(work)})
    limit = asyncio.Semaphore(MAX_STEPS_AT_ONCE)

    async def until_done(step: Callable[[], Awaitable[object]]) -> None:
        for attempt in itertools.count(1):
            async with limit:
                try:
                    await step()
                    return
                except Exception as error:
                    log.warning(
                        "reconcile step failed; will retry",
                        extra={"error": repr(error), "attempt": attempt},
                    )
            await clock.sleep(retry_delay(attempt))
            checkpoint()

    await asyncio.gather(*(until_done(step) for step in work))
