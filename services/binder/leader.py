"""Leader election on a coordination.k8s.io/v1 Lease, as client-go's leaderelection does it.

Timings (client-go's defaults): lease duration 15 s, renew deadline 10 s, retry period 2 s.

- A candidate reads the Lease every retry period. It takes the Lease when there is none
  (create; 409 = someone else was faster), when it is free (no holder), or when the holder has not
  renewed it for a whole lease duration *as observed locally* (the time the candidate last saw the
  Lease change, by its own monotonic clock: clocks of different machines never get compared).
  Taking and renewing are replaces at the Lease's resourceVersion, so two candidates can never
  both win (409 Conflict for the slower).
- The leader renews every retry period. It counts as leader only while its last successful renew
  is younger than the renew deadline (shorter than the lease duration), so a leader that cannot
  renew stops writing before any standby may take over. :meth:`LeaderElector.is_leader` is that
  fence: every write the binder makes checks it.
- A leader that stops cleanly releases the Lease (no holder, 1 s duration), so a standby takes
  over at its next retry instead of a lease duration later.

A standby takes over at most one lease duration (plus one retry period, to notice) after the
leader's last renew.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable

from services.binder.gateway import ApiUnavailableError, Body, ClusterGateway
from services.binder.rules.objects import Lease, LeaseSpec
from shared import annotations as names
from shared.clock import Clock
from shared.runtime.tasks import checkpoint

log = logging.getLogger(__name__)

JITTER = 1.2
"""client-go's JitterFactor: retries of a candidate are spread over 1..1.2 retry periods."""


class LeaderElector:
    """Takes, holds and gives up one Lease."""

    def __init__(
        self,
        *,
        gateway: ClusterGateway,
        clock: Clock,
        namespace: str,
        name: str,
        identity: str,
        lease_duration_s: float,
        renew_deadline_s: float,
        retry_period_s: float,
        on_change: Callable[[bool], None] = lambda _: None,
    ) -> None:
        self._gateway = gateway
        self._clock = clock
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self._duration_s = lease_duration_s
        self._deadline_s = renew_deadline_s
        self._retry_s = retry_period_s
        self._on_change = on_change
        self._observed: LeaseSpec | None = None
        self._observed_at = 0.0
        self._renewed_at: float | None = None
        self._leading = False
        self.holder = ""
        """Who holds the Lease, as last seen."""
        self.transitions = asyncio.Event()
        """Set whenever leadership is gained or lost (cleared by whoever waits on it)."""

    def is_leader(self) -> bool:
        """True while the last successful renew is younger than the renew deadline."""
        return (
            self._leading
            and self._renewed_at is not None
            and self._clock.monotonic() - self._renewed_at < self._deadline_s
        )

    async def run(self) -> None:
        """Campaign, lead, and campaign again after losing the Lease, forever."""
        while True:
            await self._campaign()
            await self._lead()

    async def _campaign(self) -> None:
        while not await self._try_acquire_or_renew():
            await self._clock.sleep(self._retry_s * random.uniform(1.0, JITTER))
            checkpoint()
        self._set_leading(True)
        log.info(
            "became the leader",
            extra={"lease": f"{self.namespace}/{self.name}", "identity": self.identity},
        )

    async def _lead(self) -> None:
        while True:
            await self._clock.sleep(self._retry_s)
            checkpoint()
            if await self._try_acquire_or_renew():
                continue
            renewed = self._renewed_at or 0.0
            if self._clock.monotonic() - renewed >= self._deadline_s or (
                self.holder and self.holder != self.identity
            ):
                self._set_leading(False)
                log.warning(
                    "lost the leader lease; stopped writing",
                    extra={"lease": f"{self.namespace}/{self.name}", "holder": self.holder},
                )
                return

    def _set_leading(self, leading: bool) -> None:
        if leading == self._leading:
            return
        self._leading = leading
        self.transitions.set()
        self._on_change(leading)

    async def _try_acquire_or_renew(self) -> bool:
        now_wall = names.time_value(self._clock.now())
        now = self._clock.monotonic()
        try:
            lease = await self._gateway.read_lease(self.namespace, self.name)
            if lease is None:
                body = self._body(None, acquire_time=now_wall, renew_time=now_wall, transitions=0)
                answer = await self._gateway.create_lease(self.namespace, body)
                if answer.ok:
                    self._took(now)
                    return True
                return False
            spec = lease.spec
            if spec != self._observed:
                self._observed, self._observed_at = spec, now
            self.holder = spec.holder_identity or ""
            held_by_other = bool(self.holder) and self.holder != self.identity
            duration = spec.lease_duration_seconds or int(self._duration_s)
            if held_by_other and self._observed_at + duration > now:
                return False
            mine = self.holder == self.identity
            body = self._body(
                lease,
                acquire_time=(spec.acquire_time or now_wall) if mine else now_wall,
                renew_time=now_wall,
                transitions=(spec.lease_transitions or 0) + (0 if mine else 1),
            )
            answer = await self._gateway.replace_lease(self.namespace, self.name, body)
        except ApiUnavailableError as error:
            log.info("lease not renewed", extra={"error": str(error)})
            return False
        if not answer.ok:
            return False
        self._took(now)
        return True

    def _took(self, now: float) -> None:
        self._renewed_at = now
        self.holder = self.identity

    def _body(
        self, lease: Lease | None, *, acquire_time: str, renew_time: str, transitions: int
    ) -> Body:
        metadata: Body = {"name": self.name, "namespace": self.namespace}
        if lease is not None:
            metadata["resourceVersion"] = lease.metadata.resource_version
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": max(1, round(self._duration_s)),
                "acquireTime": acquire_time,
                "renewTime": renew_time,
                "leaseTransitions": transitions,
            },
        }

    async def release(self) -> None:
        """Give the Lease up (if held), so that a standby takes over at its next retry."""
        if not self._leading:
            return
        self._set_leading(False)
        try:
            lease = await self._gateway.read_lease(self.namespace, self.name)
            if lease is None or lease.spec.holder_identity != self.identity:
                return
            now = names.time_value(self._clock.now())
            body = self._body(
                lease,
                acquire_time=now,
                renew_time=now,
                transitions=lease.spec.lease_transitions or 0,
            )
            body["spec"]["holderIdentity"] = ""
            body["spec"]["leaseDurationSeconds"] = 1
            answer = await self._gateway.replace_lease(self.namespace, self.name, body)
            log.info("released the leader lease", extra={"released": answer.ok})
        except ApiUnavailableError as error:
            log.warning("could not release the leader lease", extra={"error": str(error)})
