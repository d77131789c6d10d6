"""Pure: what GPUs the cluster has, as the admission webhook knows it (docs/design.md §13).

Each node's inventory (KV ``tessera-inventory``, keyed by node token) says its GPUs; the webhook
keeps each node's GPUs as (model, memory MiB) only, which is all :func:`shared.capacity.never_fits`
needs to refuse a pod no node could ever hold. An inventory is believed as every reader believes
it (``shared.validation.inventory_problem``: the node of its key, bounded values); one that is not
is ignored and the node keeps what it had. A node's GPUs stay until its inventory is deleted,
stale or not: a GPU gone for now may come back, and the webhook refuses only what could never
fit, so knowing too much is the safe side. Until every inventory has been read once
(:attr:`ClusterGpus.synced`) nothing is judged against it.
"""

from __future__ import annotations

from shared import codec, subjects
from shared.capacity import NodeGpus
from shared.messages.inventory import NodeInventory
from shared.validation import inventory_problem


def node_gpus(inventory: NodeInventory) -> NodeGpus:
    return tuple(sorted((gpu.model, gpu.memory_total_mib) for gpu in inventory.gpus))


class ClusterGpus:
    """Every node's GPUs, from the inventories (see the module docstring)."""

    def __init__(self) -> None:
        self._nodes: dict[str, NodeGpus] = {}
        self.synced = False
        """Every inventory present was read once (the watch's initial values are done)."""

    def apply(self, key: str, value: bytes | None, *, now: float) -> str:
        """Take one KV change of node token ``key`` (``value`` None: deleted); why it was
        ignored, or empty."""
        if value is None:
            self._nodes.pop(key, None)
            return ""
        try:
            inventory = codec.decode(value, NodeInventory)
        except codec.DecodeError as error:
            return f"inventory at {key} does not decode: {error}"
        problem = inventory_problem(inventory, node=subjects.node_from_token(key), now=now)
        if problem:
            return f"inventory at {key}: {problem}"
        self._nodes[key] = node_gpus(inventory)
        return ""

    def restart(self) -> None:
        """A new watch delivers every value again: judge nothing until it has."""
        self._nodes.clear()
        self.synced = False

    def nodes(self) -> frozenset[NodeGpus]:
        """The distinct GPU sets of the known nodes (empty until synced: judge nothing)."""
        return frozenset(self._nodes.values()) if self.synced else frozenset()

    def __len__(self) -> int:
        return len(self._nodes)
