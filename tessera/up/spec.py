"""Pure: what ``tessera up --nodes N --gpus ...`` means, as a list of :class:`NodePlan`.

``--gpus`` is a comma-separated list of node entries. Without names the entries are dealt to the
``--nodes`` nodes in turn (``node-1`` gets the first, ``node-2`` the second, ... cycling), so
``--nodes 6 --gpus 8xA100-80GB,4xT4`` makes three A100 nodes and three T4 nodes. With names
(``NAME=ENTRY``), each entry is exactly one node and ``--nodes`` must be left out or match.

An entry is its GPUs, then options after ``:``::

    8xA100-80GB                     8 GPUs of one model; memory from the model name's suffix
    4xT4                            a known model alone takes its usual memory (T4: 16 GB)
    2xA100-80GB+2xT4                several models on one node
    cpu                             no GPUs (no inventory, no device plugin)
    2xT4:mode=memory-units          options: mode (logical | memory-units), isolation
    4xA100-80GB:isolation=mps:cpu=32:memory=256Gi     (none | mps | hami-core), cpu, memory

Errors are :class:`SpecError` with a message that names the entry and what is allowed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Final

from shared import annotations as names
from shared.dra.devices import DRA_API, NODE_API_LABEL

DEFAULT_NODES: Final = 5
DEFAULT_GPUS: Final = "4xA100-80GB,4xH100-80GB,8xT4,4xL4,cpu"

MODES: Final = ("logical", "memory-units")
ISOLATIONS: Final = ("none", "mps", "hami-core")
KNOWN_MEMORY_GB: Final[dict[str, int]] = {
    "A100": 80,
    "H100": 80,
    "H200": 141,
    "B200": 180,
    "A10": 24,
    "A30": 24,
    "A40": 48,
    "L4": 24,
    "L40": 48,
    "L40S": 48,
    "T4": 16,
    "V100": 32,
    "P100": 16,
    "A6000": 48,
}
_GROUP: Final = re.compile(r"^(\d+)[xX]([A-Za-z0-9][A-Za-z0-9._]*?)(?:-(\d+)(GB|GiB|G|MB|MiB|M))?$")
_NAME: Final = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_QUANTITY: Final = re.compile(r"^\d+(\.\d+)?(m|k|Ki|Mi|Gi|Ti|M|G|T)?$")


class SpecError(ValueError):
    """A ``--gpus`` / ``--nodes`` combination that cannot be built."""


@dataclass(frozen=True)
class GpuGroup:
    count: int
    model: str
    memory_mib: int

    @property
    def fake_spec(self) -> str:
        """This group as ``tessera inventory --fake-gpus`` reads it."""
        return f"{self.count}x{self.model}-{self.memory_mib}MiB"


APIS: Final = ("device-plugin", DRA_API)


@dataclass(frozen=True)
class NodePlan:
    """One simulated node: its GPUs and how its device plugin runs."""

    name: str
    gpus: tuple[GpuGroup, ...] = ()
    mode: str = "logical"
    isolation: str = "none"
    cpu: str = "64"
    memory: str = "512Gi"
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def dra(self) -> bool:
        """Its GPUs offered through DRA (``api=dra``): labelled so, its plugin serving DRA."""
        return self.labels.get(NODE_API_LABEL) == DRA_API

    @property
    def gpu_count(self) -> int:
        return sum(g.count for g in self.gpus)

    @property
    def fake_gpus(self) -> str:
        return ",".join(g.fake_spec for g in self.gpus)

    @property
    def resource(self) -> str:
        return names.GPU if self.mode == "logical" else names.GPU_MEMORY

    def describe(self) -> str:
        if not self.gpus:
            return "no GPU"
        models = "+".join(f"{g.count}x{g.model}" for g in self.gpus)
        extras = [self.mode] if self.mode != "logical" else []
        if self.isolation != "none":
            extras.append(self.isolation)
        return models + (f" ({', '.join(extras)})" if extras else "")


def _group(text: str, entry: str) -> GpuGroup:
    match = _GROUP.match(text.strip())
    if match is None:
        raise SpecError(
            f"--gpus entry {entry!r}: {text!r} is not COUNTxMODEL or COUNTxMODEL-MEMORY "
            "(e.g. 4xT4, 8xA100-80GB)"
        )
    count, model, amount, unit = match.groups()
    if not 1 <= int(count) <= 64:
        raise SpecError(f"--gpus entry {entry!r}: {count} GPUs; use 1..64 per model and node")
    if amount is None:
        known = KNOWN_MEMORY_GB.get(model.upper())
        if known is None:
            raise SpecError(
                f"--gpus entry {entry!r}: the memory of {model!r} is not known; write it, "
                f"e.g. {count}x{model}-24GB (known: {', '.join(KNOWN_MEMORY_GB)})"
            )
        memory_mib, label = known * 1024, f"{model}-{known}GB"
    else:
        memory_mib = int(amount) * (1024 if unit.upper().startswith("G") else 1)
        label = f"{model}-{amount}{unit}"
    if memory_mib <= 0:
        raise SpecError(f"--gpus entry {entry!r}: GPU memory must be positive")
    return GpuGroup(count=int(count), model=label, memory_mib=memory_mib)


def _entry(text: str, name: str) -> NodePlan:
    gpus_text, *options = [part.strip() for part in text.split(":")]
    gpus: tuple[GpuGroup, ...] = ()
    if gpus_text.lower() not in ("cpu", "none", "0"):
        gpus = tuple(_group(part, text) for part in gpus_text.split("+"))
    values: dict[str, str] = {}
    for option in options:
        key, separator, value = option.partition("=")
        if not separator or key not in ("mode", "isolation", "cpu", "memory", "api"):
            raise SpecError(
                f"--gpus entry {text!r}: option {option!r}; use mode=, isolation=, cpu=, "
                "memory=, api="
            )
        values[key] = value
    mode = values.get("mode", "logical")
    isolation = values.get("isolation", "none")
    if mode not in MODES:
        raise SpecError(f"--gpus entry {text!r}: mode {mode!r}; use {' or '.join(MODES)}")
    if isolation not in ISOLATIONS:
        raise SpecError(f"--gpus entry {text!r}: isolation {isolation!r}; use {ISOLATIONS}")
    for key in ("cpu", "memory"):
        if key in values and not _QUANTITY.match(values[key]):
            raise SpecError(f"--gpus entry {text!r}: {key}={values[key]!r} is not a quantity")
    if not gpus and ("mode" in values or "isolation" in values):
        raise SpecError(f"--gpus entry {text!r}: mode and isolation need GPUs")
    api = values.get("api", "device-plugin")
    if api not in APIS:
        raise SpecError(f"--gpus entry {text!r}: api {api!r}; use {' or '.join(APIS)}")
    return NodePlan(
        name=name,
        gpus=gpus,
        mode=mode,
        isolation=isolation,
        cpu=values.get("cpu", "64"),
        memory=values.get("memory", "512Gi"),
        labels={NODE_API_LABEL: DRA_API} if api == DRA_API else {},
    )


POOL_MIN_NODES: Final = 32
"""The fewest nodes a default node pool gets: a replica decides on its own pool first, and a
pool of a few nodes is a poor bin for a near-full cluster (two pools on the 5 demo nodes left up
to five of its 40 pods Pending that one pool runs)."""


def default_pools(placers: int, nodes: int) -> int:
    """The placers' ``--pools`` when none is given: one pool per placer once every pool gets
    :data:`POOL_MIN_NODES` nodes, else 1 (every placer decides on every node)."""
    return placers if nodes >= POOL_MIN_NODES * placers else 1


def plan_nodes(gpus: str = DEFAULT_GPUS, nodes: int | None = None) -> list[NodePlan]:
    """The nodes of ``--nodes``/``--gpus`` (see the module docstring)."""
    entries = [e.strip() for e in gpus.split(",") if e.strip()]
    if not entries:
        raise SpecError("--gpus is empty; give at least one node entry (e.g. 4xA100-80GB)")
    named = ["=" in e.split(":")[0] for e in entries]
    if any(named):
        if not all(named):
            raise SpecError("--gpus: name every entry (NAME=ENTRY) or none")
        if nodes is not None and nodes != len(entries):
            raise SpecError(f"--nodes {nodes} but --gpus names {len(entries)} nodes")
        plans = []
        for entry in entries:
            name, _, rest = entry.partition("=")
            name = name.strip()
            if not _NAME.match(name) or len(name) > 63:
                raise SpecError(f"--gpus: node name {name!r} is not a DNS label")
            plans.append(_entry(rest, name))
        if len({p.name for p in plans}) != len(plans):
            raise SpecError("--gpus: a node name is used twice")
        return plans
    count = DEFAULT_NODES if nodes is None else nodes
    if not 1 <= count <= 1000:
        raise SpecError(f"--nodes {count}: use 1..1000")
    width = len(str(count))
    parsed = [_entry(entry, "") for entry in entries]
    return [replace(parsed[i % len(parsed)], name=f"node-{i + 1:0{width}d}") for i in range(count)]


def in_dra_mode(plan: NodePlan) -> NodePlan:
    """``plan`` with its GPUs offered through DRA (``tessera up --dra``)."""
    if not plan.gpus:
        return plan
    return replace(plan, labels={**plan.labels, NODE_API_LABEL: DRA_API})
