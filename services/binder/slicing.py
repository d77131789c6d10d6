"""The binder's ResourceSlice publisher for nodes in DRA mode: list the node's slices, plan
(``draslices.plan_slices``), write. The plan is pure; this shell only lists and writes.

A write the API refuses with 409 (another writer changed a slice since it was listed, or one it
creates exists already) lists again and plans again, a few times; any other refusal is returned
as the outcome (logged by the caller), never raised: slices are written again at the node's next
inventory change.
"""

from __future__ import annotations

import logging
from typing import Final, Protocol

from services.binder.gateway import Answer
from services.binder.rules.draslices import Body, SliceChanges, plan_slices
from shared.dra.devices import DRIVER, MemoryPolicy
from shared.messages.inventory import NodeInventory

log = logging.getLogger(__name__)

CONFLICT_TRIES: Final = 3


class SliceApi(Protocol):
    """The ResourceSlice calls the publisher makes (``kube.KubeGateway`` has them)."""

    async def list_slices(self, *, node: str, driver: str) -> list[Body]: ...

    async def create_slice(self, body: Body) -> Answer: ...

    async def replace_slice(self, name: str, body: Body) -> Answer: ...

    async def delete_slice(self, name: str) -> Answer: ...


class SlicePublisher:
    """Keeps each DRA node's slices what its inventory says."""

    def __init__(self, *, api: SliceApi, policy: MemoryPolicy) -> None:
        self._api = api
        self._policy = policy

    async def publish(self, node: str, inventory: NodeInventory | None) -> Answer:
        """Make the node's slices the planned ones (no inventory: none). The last answer that
        was not a success, or 200 when everything was written (or nothing had to be)."""
        answer = Answer(code=200)
        for _ in range(CONFLICT_TRIES):
            existing = await self._api.list_slices(node=node, driver=DRIVER)
            changes = plan_slices(node, inventory, existing, policy=self._policy)
            answer = await self._write(changes)
            if answer.code != 409:
                break
        if not answer.ok:
            log.warning(
                "cannot publish the node's ResourceSlices",
                extra={"node": node, "code": answer.code, "error": answer.message},
            )
        return answer

    async def _write(self, changes: SliceChanges) -> Answer:
        # Deletions last: a reader sees the new generation before the old slices go.
        for body in changes.create:
            answer = await self._api.create_slice(body)
            if not answer.ok:
                return answer
        for body in changes.replace:
            answer = await self._api.replace_slice(str(body["metadata"]["name"]), body)
            if not answer.ok:
                return answer
        for name in changes.delete:
            answer = await self._api.delete_slice(name)
            if not answer.ok and answer.code != 404:
                return answer
        return Answer(code=200)
