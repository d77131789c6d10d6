"""DRA selectors judged GPU by GPU: a claim's CEL selectors that read more than the model.

A selector that reads only a GPU's model gives the same answer on every GPU of that model, so it
is judged with the model, shape by shape (``PodRequest.allows_model``). One that reads anything
else (``uuid``, ``index``, ``memoryMiB``, the NUMA node, PCI bus or PCIe root, the ``memory``
and ``compute`` capacities) is judged here, on each GPU of a node as the
device Tessera publishes for it (``shared.dra.devices``), as Kubernetes' allocator judges a
device: the selectors in order, the first that is false or cannot be evaluated ends it
(``selectorsMatch`` in ``k8s.io/dynamic-resource-allocation/structured``). A selector that
cannot be evaluated on a GPU makes the node a refusal with that reason, never a guess.

A selector that reads only the model and cannot be evaluated on some model
(:func:`model_problem`) is a refusal of the nodes with GPUs of that model, with that reason.

Pure and cached: a selector's answer depends only on the values it reads (``cel.reads``), so
it is evaluated once per distinct set of them (two NUMA nodes, one memory size: a handful of
evaluations for a thousand nodes, where cel-python takes some 200 us for one), and a GPU's
verdict is kept by its attributes and the selectors (a burst of identical claims asks the same
of the same GPUs again and again).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from fractions import Fraction

from services.placer.core.model import GpuState, model_device, model_selectors
from shared.dra import cel
from shared.dra.devices import (
    AttributeValue,
    DeviceDescription,
    device_name,
    gpu_attributes,
    gpu_device,
)

Verdict = str | cel.SelectorProblem | None
"""Of one GPU: None when it meets every selector, else the first selector it does not meet, or
why one cannot be evaluated on it."""


Values = tuple[tuple[str, object], ...]
r"""A device's values a selector reads (:func:`cel.reads`): fully qualified name -> value, by
``attributes/``\ or ``capacity/`` name, sorted; what is absent left out."""


def _values(expression: str, device: DeviceDescription) -> Values:
    """What of ``device`` ``expression`` reads: all its attributes and capacities when the
    selector reads more than values named in full."""
    paths = cel.reads(expression)
    found: list[tuple[str, object]] = []
    if paths is None:
        found += [(f"attributes/{k}", v) for k, v in device.attributes.items()]
        found += [(f"capacity/{k}", v) for k, v in device.capacity.items()]
        return tuple(sorted(found, key=lambda kv: kv[0]))
    for path in sorted(paths):
        if path[1] in ("attributes", "capacity"):
            name = f"{path[2]}/{path[3]}"
            table: Mapping[str, object] = (
                device.attributes if path[1] == "attributes" else device.capacity
            )
            if name in table:
                found.append((f"{path[1]}/{name}", table[name]))
    return tuple(found)


@functools.lru_cache(maxsize=65_536)
def _judged(expression: str, values: Values) -> bool | cel.SelectorProblem:
    """``expression`` on a device of ``values`` alone: what it reads decides it, so two GPUs
    with the same values there (a NUMA node, a memory size) share one evaluation. cel-python
    takes some 200 us for one; a 1,000-node cluster has 8,000 GPUs."""
    selector = cel.compile_selector(expression)
    if isinstance(selector, cel.SelectorProblem):
        return selector
    attributes: dict[str, AttributeValue] = {}
    capacity: dict[str, Fraction] = {}
    for key, value in values:
        kind, _, name = key.partition("/")
        if kind == "attributes":
            attributes[name] = value  # type: ignore[assignment]
        else:
            capacity[name] = value  # type: ignore[assignment]
    device = DeviceDescription(name=device_name(0), attributes=attributes, capacity=capacity)
    return selector.matches(device)


@functools.lru_cache(maxsize=131_072)
def _verdict(
    selectors: tuple[str, ...],
    uuid: str,
    model: str,
    index: int,
    memory_mib: int,
    numa_node: int,
    pci_bus_id: str,
    pcie_root: str,
) -> Verdict:
    found = gpu_attributes(
        uuid=uuid,
        model=model,
        index=index,
        memory_mib=memory_mib,
        numa_node=numa_node,
        nvml_bus_id=pci_bus_id,
        pcie_root=pcie_root,
    )
    device = gpu_device(found, index=index, memory_mib=memory_mib)
    for expression in selectors:
        outcome = _judged(expression, _values(expression, device))
        if outcome is not True:
            return outcome if isinstance(outcome, cel.SelectorProblem) else expression
    return None


def verdict(selectors: tuple[str, ...], gpu: GpuState) -> Verdict:
    """Whether ``gpu`` meets every one of ``selectors`` (see :data:`Verdict`)."""
    return _verdict(
        selectors,
        gpu.uuid,
        gpu.model,
        gpu.index,
        gpu.memory_total_mib,
        gpu.numa_node,
        gpu.pci_bus_id,
        gpu.pcie_root,
    )


def admitted(selectors: tuple[str, ...], gpus: Sequence[GpuState]) -> list[bool]:
    """For each of ``gpus``, whether it meets every one of ``selectors``."""
    return [verdict(selectors, gpu) is None for gpu in gpus]


@functools.lru_cache(maxsize=4096)
def model_problem(selectors: tuple[str, ...], model: str) -> cel.SelectorProblem | None:
    """Why a selector of ``selectors`` that reads only the model cannot be evaluated on a GPU
    of ``model`` (a bad regular expression, a function on the wrong type), in order as
    Kubernetes runs them; None when each can. The shape path admits no such GPU; this names
    why."""
    found = cel.select(model_selectors(selectors), model_device(model))
    return found if isinstance(found, cel.SelectorProblem) else None


def _gpus(n: int) -> str:
    return f"{n} GPU{'s' if n != 1 else ''}"


def unmet(selectors: tuple[str, ...], gpus: Sequence[GpuState], needed: int) -> str | None:
    """Why fewer than ``needed`` of ``gpus`` meet ``selectors`` (which selector they did not
    meet, or why one cannot be evaluated); None when enough do."""
    verdicts = [verdict(selectors, gpu) for gpu in gpus]
    problem = next((v for v in verdicts if isinstance(v, cel.SelectorProblem)), None)
    if problem is not None:
        return str(problem)
    meeting = verdicts.count(None)
    if meeting >= needed:
        return None
    failed: dict[str, int] = {}
    for found in verdicts:
        if isinstance(found, str):
            failed[found] = failed.get(found, 0) + 1
    ranked = sorted(failed.items(), key=lambda kv: (-kv[1], selectors.index(kv[0])))
    if not gpus:
        return "no GPUs to judge the selectors on"
    if meeting == 0 and len(ranked) == 1:
        return f"no GPU meets selector {ranked[0][0]!r}"
    detail = ", ".join(f"{expression!r} on {_gpus(n)}" for expression, n in ranked)
    if meeting == 0:
        return f"no GPU meets every selector (not met: {detail})"
    verb = "meets" if meeting == 1 else "meet"
    return (
        f"{_gpus(meeting)} of {len(gpus)} {verb} the selectors, {needed} needed (not met: {detail})"
    )
