"""Reconciliation on becoming leader: finish what a previous leader left half done.

For each assignment record (:func:`~services.binder.plan.repair` decides): a record whose pod is
gone -> ``PodDeleted`` (the record withdrawn first when its GPUs were never allocated); a
``reserved`` record whose pod is already bound there -> ``bound``; a ``bound`` record whose pod
is not bound yet -> bound now (both by handling the record's decision again). Runs beside the
consumers; a step that fails (API or NATS away) is tried again until it succeeds, and one whose
decision message is being handled right now is left to it.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
from collections.abc import Awaitable, Callable

from services.binder.plan import decision_of, repair
from services.binder.sync import PodRef
from shared.clock import Clock
from shared.kubeobjects import Pod
from shared.messages.placement import PlacementDecision
from shared.runtime.consumer import AlreadyHandlingError, retry_delay
from shared.runtime.records import RecordMirror
from shared.runtime.tasks import checkpoint

log = logging.getLogger(__name__)

MAX_STEPS_AT_ONCE = 32


async def reconcile(
    *,
    records: RecordMirror,
    pod_of: Callable[[str], Pod | None],
    end_pod: Callable[[str, PodRef], Awaitable[object]],
    bind: Callable[[PlacementDecision], Awaitable[None]],
    clock: Clock,
) -> None:
    """Repair every record that needs it (see the module docstring), each until done."""
    work: list[Callable[[], Awaitable[object]]] = []
    for view in records.views():
        record = view.record
        action = repair(record, pod_of(record.pod_uid))
        if action == "deleted":
            ref = PodRef(record.namespace, record.name, record.node)
            work.append(functools.partial(end_pod, record.pod_uid, ref))
        elif action == "bind":
            work.append(functools.partial(bind, decision_of(record)))
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
                except AlreadyHandlingError:
                    return  # its decision message is being handled right now
                except Exception as error:
                    log.warning(
                        "reconcile step failed; will retry",
                        extra={"error": repr(error), "attempt": attempt},
                    )
            await clock.sleep(retry_delay(attempt))
            checkpoint()

    await asyncio.gather(*(until_done(step) for step in work))
