"""Placements given back: pods deleted or gone before binding, bindings that failed, placements
not bound within the reserve timeout; and the purge of what was released long ago. Each is
acked only once durable and is idempotent (the protocol has why)."""

from __future__ import annotations

import contextlib

from services.placer.shell.context import Shell, log
from services.placer.shell.held import Held, Outcome
from services.placer.shell.waiting import WaitingPods
from shared import subjects
from shared.messages.bindings import BindingResult
from shared.runtime.bus import Delivery
from shared.runtime.follow import deliveries


class Releases:
    """Gives placements back (see the module docstring)."""

    def __init__(self, *, shell: Shell, held: Held, waiting: WaitingPods) -> None:
        self._shell = shell
        self._held = held
        self._waiting = waiting
        self._releasing: set[str] = set()

    async def consume_bindings(self) -> None:
        shell = self._shell
        bindings = deliveries(
            shell.bus,
            clock=shell.clock,
            stream=subjects.STREAM_BINDINGS,
            durable=subjects.DURABLE_PLACER_BINDINGS,
            subject=subjects.BINDINGS_ALL,
            ack_wait=shell.config.ack_wait_s,
        )
        async with contextlib.aclosing(bindings):
            async for delivery in bindings:
                result = await shell.edge.accept(delivery, BindingResult, family="bindings")
                if result is not None:
                    shell.tasks.spawn(
                        self._on_binding(result, delivery), f"binding-{result.pod_uid}"
                    )

    async def _on_binding(self, result: BindingResult, delivery: Delivery) -> None:
        try:
            if result.outcome == "gone":
                await self.release_deleted(
                    result.pod_uid, cause="gone", reason=result.reason or "pod gone before binding"
                )
            elif result.outcome == "failed":
                await self.release_requeue(
                    result.pod_uid,
                    result.node,
                    cause="failed",
                    reason=result.reason or "binding failed",
                    only_reserved=False,
                    reported_at=result.at,
                )
        except Exception as error:
            log.warning(
                "cannot act on a binding result yet; it comes back",
                extra={"pod_uid": result.pod_uid, "error": f"{type(error).__name__}: {error}"},
            )
            with contextlib.suppress(Exception):
                await delivery.nak(1.0)
            return
        await self._held.ack([delivery])

    async def release_deleted(self, pod_uid: str, *, cause: str, reason: str) -> None:
        """The pod is gone (deleted, or the binder found it gone): give everything back."""
        shell, held = self._shell, self._held
        given_back = await shell.protocol.release_deleted(pod_uid, reason=reason)
        item = held.items.get(pod_uid)
        if item is not None and item.stage != "committing":
            del held.items[pod_uid]
            held.waiting.pop(pod_uid, None)
            held.queue.remove(pod_uid)
            held.resolve(
                item,
                Outcome(pod_uid=pod_uid, outcome="deleted", message=reason, at=shell.clock.now()),
            )
            await held.ack(item.deliveries)
        self._waiting.unpost(pod_uid)
        shell.metrics.releases.labels(cause=cause).inc()
        held.remember(
            Outcome(pod_uid=pod_uid, outcome="deleted", message=reason, at=shell.clock.now())
        )
        log.info(
            "pod released",
            extra={
                "pod_uid": pod_uid,
                "cause": cause,
                "nodes": sorted({b.node for b in given_back}),
            },
        )

    async def release_requeue(
        self,
        pod_uid: str,
        node: str,
        *,
        cause: str,
        reason: str,
        only_reserved: bool,
        reported_at: float = 0.0,
    ) -> bool:
        """Give the placement on ``node`` back and place the pod again (see the protocol)."""
        released = await self._shell.protocol.release_requeue(
            pod_uid, node, reason=reason, only_reserved=only_reserved, reported_at=reported_at
        )
        if released:
            self._shell.metrics.releases.labels(cause=cause).inc()
            log.info(
                "pod released to be placed again",
                extra={"pod_uid": pod_uid, "node": node, "cause": cause, "reason": reason},
            )
        return released

    async def timeout_loop(self) -> None:
        """Release placements the binder did not bind within the reserve timeout: a placed claim
        whose commit has no record ``bound`` (or further) on its node yet."""
        shell = self._shell
        timeout_s = shell.config.reserve_timeout_s
        period = max(0.5, min(5.0, timeout_s / 4))
        while True:
            await shell.clock.sleep(period)
            if not shell.current:  # records of a lost store are not this store's to release
                continue
            now = shell.clock.now()
            view = shell.view
            for uid, claim in list(view.claims.items()):
                booking = claim.booking
                if claim.state != "placed" or booking is None:
                    continue
                key = subjects.assignment_key(booking.node, uid)
                record = view.records.get(key)
                bound = (
                    record is not None
                    and record.commit == booking.commit
                    and record.state in ("bound", "allocated")
                )
                if bound or now - booking.decided_at < timeout_s or key in self._releasing:
                    continue
                self._releasing.add(key)
                shell.tasks.spawn(self._time_out(key, uid, booking.node), "timeout")

    async def _time_out(self, key: str, pod_uid: str, node: str) -> None:
        try:
            await self.release_requeue(
                pod_uid,
                node,
                cause="timeout",
                reason=f"not bound within {self._shell.config.reserve_timeout_s:g} s",
                only_reserved=True,
            )
        except Exception as error:
            log.warning(
                "reserve timeout release failed; tried again",
                extra={"pod_uid": pod_uid, "error": f"{type(error).__name__}: {error}"},
            )
        finally:
            self._releasing.discard(key)

    async def purge_loop(self) -> None:
        """Delete released records and deleted pods' claims after the retention period."""
        shell = self._shell
        retention_s = shell.config.release_retention_s
        period = max(1.0, min(60.0, retention_s / 4))
        while True:
            await shell.clock.sleep(period)
            try:
                await self.purge(retention_s=retention_s)
            except Exception as error:
                log.warning("purge failed; tried again", extra={"error": str(error)})

    async def purge(self, *, retention_s: float) -> int:
        """Delete released records and deleted pods' claims older than ``retention_s``."""
        shell = self._shell
        store, view = shell.store, shell.view
        now = shell.clock.now()
        purged = 0
        for record in list(view.records.values()):
            age = now - (record.released_at or now)
            expired = record.state == "released" and age >= retention_s
            if expired and await store.delete_if(store.records, record.key, record.revision):
                shell.metrics.purged.labels(entry="record").inc()
                purged += 1
        for uid, claim in list(view.claims.items()):
            if claim.state == "deleted" and now - claim.updated_at >= retention_s:
                revision = view.claim_revisions.get(uid, 0)
                key = subjects.claim_key(uid)
                if revision and await store.delete_if(store.claims, key, revision):
                    shell.metrics.purged.labels(entry="claim").inc()
                    purged += 1
        return purged
