"""Answers to the placer's extender asking for the pod kube-scheduler binds
(``tessera.extender.pods``, a queue group of every binder: read-only, so standbys answer too).

The pod comes from the informer, else from the API server (the informer may lag behind
kube-scheduler, which saw the pod first); which answer it gets is
:func:`~services.binder.extender.lookup_reply`, its namespace selectors resolved from the namespace
informer as for every pod the binder publishes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import Final

from services.binder.config import BinderConfig
from services.binder.extender import lookup_reply
from services.binder.gateway import ClusterGateway
from services.binder.informer import Informer
from shared import codec, subjects
from shared.clock import Clock
from shared.kubeobjects import Pod
from shared.messages.extender import PodLookup, PodLookupReply
from shared.runtime.bus import Bus, Delivery
from shared.runtime.consumer import RETRY_S
from shared.runtime.edge import Edge

log = logging.getLogger(__name__)

LOOKUP_QUEUE: Final = "tessera-binder"


class PodLookups:
    """The binder's side of the extender's pod lookups."""

    def __init__(
        self,
        *,
        config: BinderConfig,
        gateway: ClusterGateway,
        pods: Informer[Pod],
        namespaces: Callable[[], Mapping[str, Mapping[str, str]] | None],
        bus: Bus,
        edge: Edge,
        clock: Clock,
    ) -> None:
        self._config = config
        self._gateway = gateway
        self._pods = pods
        self._namespaces = namespaces
        """Every namespace's labels, None until the namespace informer listed them."""
        self._bus = bus
        self._edge = edge
        self._clock = clock

    async def answer(self) -> None:
        """Answer the placer's extender until cancelled (any binder, leader or standby)."""
        while True:
            try:
                subscription = await self._bus.subscribe(
                    subjects.EXTENDER_PODS, self._on_lookup, queue=LOOKUP_QUEUE
                )
                break
            except Exception as error:  # NATS away: try again shortly
                log.warning("cannot answer pod lookups yet", extra={"error": repr(error)})
                await self._clock.sleep(RETRY_S)
        try:
            await asyncio.Event().wait()
        finally:
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()

    async def _on_lookup(self, delivery: Delivery) -> None:
        lookup = await self._edge.accept(delivery, PodLookup, family="extender")
        if lookup is None or not delivery.reply:
            return
        try:
            reply = lookup_reply(
                lookup,
                await self._find_pod(lookup),
                namespaces=self._namespaces(),
                scheduler_name=self._config.scheduler_name,
                extender_scheduler_names=self._config.extender_scheduler_names,
            )
        except Exception as error:  # the API away: the extender answers kube-scheduler with it
            reply = PodLookupReply(uid=lookup.uid, error=f"cannot read the pod: {error}")
        with contextlib.suppress(Exception):  # the extender times out and says so
            await self._bus.publish(delivery.reply, codec.encode(reply))

    async def _find_pod(self, lookup: PodLookup) -> Pod | None:
        """The pod from the informer, else from the API server (the informer may lag behind
        kube-scheduler, which saw the pod first)."""
        pod = self._pods.get(f"{lookup.namespace}/{lookup.name}")
        if pod is not None and pod.metadata.uid == lookup.uid:
            return pod
        return await self._gateway.read_pod(lookup.namespace, lookup.name)
