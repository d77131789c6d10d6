"""Pods in: the one durable consumer every replica shares (pending, deleted and restored pods),
each message accepted at the edge, held, queued to be decided, or acted on."""

from __future__ import annotations

import asyncio
import contextlib

from services.placer.rules import translate
from services.placer.shell.context import MAX_IN_FLIGHT, Shell, log
from services.placer.shell.held import Held, HeldPod
from services.placer.shell.releases import Releases
from shared import subjects
from shared.messages.pods import PodDeleted, PodPending, PodRestore
from shared.runtime.bus import Delivery
from shared.runtime.follow import FETCH_BATCH, deliveries

MAX_HELD = 100_000
"""The pod consumer's ``max_ack_pending``: pods held (deciding or waiting) across replicas."""
RESTORE_WAIT_S = 5.0
"""How long a restore waits for the view to hold the new store before it is put back (nak)."""


class Intake:
    """Takes pod messages from JetStream (see the module docstring)."""

    def __init__(
        self,
        *,
        shell: Shell,
        held: Held,
        releases: Releases,
        holding: asyncio.Event | None = None,
    ) -> None:
        self._shell = shell
        self._held = held
        self._releases = releases
        self._holding = holding
        """With node pools: set while this replica holds one; a standby takes no pods."""

    async def consume_pods(self) -> None:
        shell = self._shell
        pods = deliveries(
            shell.bus,
            clock=shell.clock,
            stream=subjects.STREAM_PODS,
            durable=subjects.DURABLE_PLACER_PODS,
            subject=subjects.PODS_ALL,
            ack_wait=shell.config.ack_wait_s,
            max_ack_pending=MAX_HELD,
            room=self._room,
        )
        async with contextlib.aclosing(pods):
            async for delivery in pods:
                if delivery.subject == subjects.PODS_DELETED:
                    deleted = await shell.edge.accept(delivery, PodDeleted, family="pods")
                    if deleted is not None:
                        shell.tasks.spawn(
                            self._on_deleted(deleted, delivery), f"deleted-{deleted.uid}"
                        )
                elif delivery.subject == subjects.PODS_PENDING:
                    pod = await shell.edge.accept(delivery, PodPending, family="pods")
                    if pod is not None:
                        await self._on_pending(pod, delivery)
                elif delivery.subject == subjects.PODS_RESTORE:
                    restore = await shell.edge.accept(delivery, PodRestore, family="pods")
                    if restore is not None:
                        shell.tasks.spawn(
                            self._restore(restore, delivery), f"restore-{restore.pod.uid}"
                        )
                else:
                    await shell.edge.reject(
                        delivery,
                        family="pods",
                        reason=f"no pod message is published on {delivery.subject}",
                        kind="subject",
                    )

    async def _room(self) -> int:
        """How many pod messages to fetch now: none while too many are held undecided, nor
        while this replica holds no node pool (a standby, with pools)."""
        if self._holding is not None:
            await self._holding.wait()
        held = self._held
        while len(held.items) - len(held.waiting) >= 4 * MAX_IN_FLIGHT:
            self._shell.work.set()
            await asyncio.sleep(0.005)
        return FETCH_BATCH

    async def _on_pending(self, pod: PodPending, delivery: Delivery) -> None:
        held = self._held
        item = held.items.get(pod.uid)
        if item is not None:  # another message of a pod already held here
            item.deliveries.append(delivery)
            if item.stage == "waiting":  # it may have changed: try it again now
                item.pod, item.request = pod, translate.pod_request(pod)
                held.enqueue(item)
            return
        claim = self._shell.view.claim(pod.uid)
        if claim is not None and claim.state == "deleted":
            self._shell.metrics.decisions.labels(outcome="duplicate").inc()
            await held.ack([delivery])
            return
        item = HeldPod(
            pod=pod,
            request=translate.pod_request(pod),
            deliveries=[delivery],
            received=self._shell.clock.monotonic(),
        )
        held.items[pod.uid] = item
        held.enqueue(item)

    async def _restore(self, restore: PodRestore, delivery: Delivery) -> None:
        """Book, claim and record a bound pod's placement the store lost (docs/design.md §12)."""
        shell = self._shell
        if restore.epoch != shell.bus.store_epoch:  # meant for a store that is gone too
            shell.metrics.restores.labels(outcome="other-store").inc()
            await self._held.ack([delivery])
            return
        # Booked and claimed on the view: one still holding the lost store's entries would find
        # the pod booked and claimed already, and write neither (``Shell.current``).
        if not await shell.until_current(RESTORE_WAIT_S):
            log.info(
                "a restore waits for the view to hold the new store",
                extra={"pod_uid": restore.pod.uid, "epoch": restore.epoch},
            )
            with contextlib.suppress(Exception):
                await delivery.nak(1.0)
            return
        try:
            outcome = await shell.protocol.restore(restore)
        except Exception as error:  # NATS trouble: it comes back
            log.warning(
                "cannot restore a placement yet",
                extra={"pod_uid": restore.pod.uid, "error": f"{type(error).__name__}: {error}"},
            )
            with contextlib.suppress(Exception):
                await delivery.nak(1.0)
            return
        shell.metrics.restores.labels(outcome=outcome).inc()
        log.info(
            "placement restored",
            extra={
                "pod": f"{restore.pod.namespace}/{restore.pod.name}",
                "pod_uid": restore.pod.uid,
                "node": restore.node,
                "state": restore.state,
                "outcome": outcome,
            },
        )
        await self._held.ack([delivery])

    async def _on_deleted(self, deleted: PodDeleted, delivery: Delivery) -> None:
        try:
            await self._releases.release_deleted(deleted.uid, cause="deleted", reason="pod deleted")
        except Exception as error:
            log.warning(
                "release of a deleted pod failed; it comes back",
                extra={"pod_uid": deleted.uid, "error": f"{type(error).__name__}: {error}"},
            )
            with contextlib.suppress(Exception):
                await delivery.nak(1.0)
            return
        await self._held.ack([delivery])
