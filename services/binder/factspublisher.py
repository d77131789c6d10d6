"""The leader's publisher of each node's facts (``NodeFacts``: subject + KV), on change.

:meth:`NodeFactsPublisher.sync` derives a node's facts (``nodefacts.node_facts``) from its Node
object, the CPU and memory its pods request and its pods that are not Tessera's, all three kept by
:class:`~services.binder.sync.ClusterSync`'s informers, and publishes them when they changed. A
change only in what Tessera's own pods request is held back until the node's next refresh
(``node_facts_refresh_s``: the placer's view does not depend on it); a node gone from the
informer has facts saying so published once. Every write is fenced by the Lease (``fence``).
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable

from services.binder.informer import Informer
from services.binder.metrics import BinderMetrics
from services.binder.rules.neighbours import NodePods
from services.binder.rules.nodefacts import (
    Requested,
    gone_facts,
    node_facts,
    only_tessera_moved,
    same_facts,
)
from services.binder.rules.objects import Node
from shared import codec, subjects
from shared.clock import Clock
from shared.messages.nodes import NodeFacts
from shared.runtime.bus import Bus

log = logging.getLogger(__name__)


class NodeFactsPublisher:
    """See the module docstring. ``requeue`` marks a node dirty for the node workers, ``later``
    does so after a delay."""

    def __init__(
        self,
        *,
        bus: Bus,
        clock: Clock,
        metrics: BinderMetrics,
        fence: Callable[[str], None],
        refresh_s: float,
        nodes: Informer[Node],
        requested_on: Callable[[str], Requested],
        neighbours: NodePods,
        requeue: Callable[[str], None],
        later: Callable[[float, Callable[[str], None], str], None],
        with_claims: Callable[[NodeFacts], NodeFacts] = lambda facts: facts,
    ) -> None:
        self._bus = bus
        self._with_claims = with_claims
        """Adds what claims no placement holds take on a node (``draforeign.ForeignClaims``)."""
        self._clock = clock
        self._metrics = metrics
        self._fence = fence
        self._refresh_s = refresh_s
        self._nodes = nodes
        self._requested_on = requested_on
        self._neighbours = neighbours
        self._requeue = requeue
        self._later = later
        self._published_facts: dict[str, NodeFacts] = {}
        self._facts_published_at: dict[str, float] = {}
        """When (monotonic) each node's facts were last published."""
        self._facts_held: set[str] = set()
        """Nodes with a change held back until their next refresh."""

    async def relist_published_nodes(self) -> None:
        """Mark dirty the nodes whose facts are published, those gone meanwhile included."""
        try:
            for key in await self._bus.kv_keys(subjects.KV_NODES):
                self._requeue(subjects.node_from_token(key))  # facts of nodes gone meanwhile
        except Exception as error:  # NATS away: the node watch will publish as nodes change
            log.warning("cannot list published node facts", extra={"error": repr(error)})

    def resync(self) -> None:
        """Publish every node's facts again when next synced."""
        self._published_facts.clear()

    async def sync(self, name: str) -> None:
        """Publish node ``name``'s facts if they changed (the node worker's job)."""
        node = self._nodes.get(name)
        if node is None:
            entry = await self._bus.kv_get(subjects.KV_NODES, subjects.node_token(name))
            known = self._published_facts.pop(name, None)
            self._facts_published_at.pop(name, None)
            if entry is None and known is None:
                return
            if entry is not None and known is None:
                with contextlib.suppress(codec.DecodeError):
                    if codec.decode(entry.value, NodeFacts).deleted:
                        return
            await self._publish_facts(gone_facts(name, now=self._clock.now()))
            return
        facts = self._with_claims(
            node_facts(
                node,
                self._requested_on(name),
                pods=self._neighbours.on(name),
                now=self._clock.now(),
            )
        )
        published = self._published_facts.get(name)
        if same_facts(published, facts):
            return
        if published is not None and only_tessera_moved(published, facts):
            wait = (
                self._facts_published_at.get(name, -math.inf)
                + self._refresh_s
                - self._clock.monotonic()
            )
            if wait > 0:
                if name not in self._facts_held:
                    self._facts_held.add(name)
                    self._metrics.node_facts_deferred.inc()
                    self._later(wait, self._refresh_facts, name)
                return
        await self._publish_facts(facts)
        self._published_facts[name] = facts
        self._facts_published_at[name] = self._clock.monotonic()

    def _refresh_facts(self, name: str) -> None:
        self._facts_held.discard(name)
        self._requeue(name)

    async def _publish_facts(self, facts: NodeFacts) -> None:
        self._fence("publish NodeFacts")
        data = codec.encode(facts)
        await self._bus.kv_put(subjects.KV_NODES, subjects.node_token(facts.node), data)
        await self._bus.publish(subjects.nodes(facts.node), data)
        self._metrics.node_facts.inc()
