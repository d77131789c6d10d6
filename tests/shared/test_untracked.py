"""The values a service keeps by the thousand are invisible to the garbage collector.

A full collection stops the event loop while it scans every tracked object, and a placer keeps
every node's state and every pod's claim, record and booking: with them tracked, its pauses grew
to 30-40 ms within 3,000 pods and set the decision latency's p99 (``benchmarks/RESULTS.md``,
"Placer service"). These types are frozen and hold only values (numbers, strings, tuples, other
such structs), so no reference cycle can run through them, which is what ``gc=False`` requires.
"""

from __future__ import annotations

import gc
import importlib
import pkgutil
from collections.abc import Iterator

import msgspec
import pytest

import shared.messages
from services.binder.rules import objects
from services.placer.core import facts, model, quota, shape
from services.placer.core.plugins.fed_fgd import FedFragmentation
from services.placer.core.profiles import DEFAULT_TYPICAL_TASKS
from services.placer.rules import mix
from shared import kubeobjects
from shared.messages.assignments import RecordView
from shared.messages.base import Message


def every_message_type() -> Iterator[type[Message]]:
    for info in pkgutil.iter_modules(shared.messages.__path__):
        importlib.import_module(f"{shared.messages.__name__}.{info.name}")
    pending = [Message]
    while pending:
        cls = pending.pop()
        yield cls
        pending.extend(cls.__subclasses__())


def structs_of(module: object) -> list[type[msgspec.Struct]]:
    return [
        value
        for value in vars(module).values()
        if isinstance(value, type)
        and issubclass(value, msgspec.Struct)
        and value.__module__ == getattr(module, "__name__", None)
    ]


KEPT = [
    *every_message_type(),
    RecordView,
    *structs_of(model),
    *structs_of(shape),
    *structs_of(facts),
    mix.TaskSpec,
    quota.Usage,
    *structs_of(kubeobjects),
    *structs_of(objects),
]


def test_the_types_are_found() -> None:
    assert len(KEPT) > 60
    assert model.NodeState in KEPT and shape.NodeShape in KEPT and kubeobjects.Pod in KEPT
    assert facts.PodFacts in KEPT and facts.ShareAsk in KEPT


@pytest.mark.parametrize("struct", KEPT, ids=lambda cls: f"{cls.__module__}.{cls.__name__}")
def test_a_kept_type_is_frozen_and_untracked(struct: type[msgspec.Struct]) -> None:
    config = struct.__struct_config__
    assert config.frozen, "gc=False is safe only for values nobody can make point back at them"
    assert config.gc is False, "every instance would be scanned at each full collection"


def test_a_tuple_of_untracked_structs_leaves_the_collectors_view() -> None:
    """What a node state holds (tuples of GPU states) stops being scanned once collected."""
    gpus = tuple(
        model.GpuState(index=i, uuid=f"GPU-{i}", model="A100", memory_total_mib=81920)
        for i in range(8)
    )
    assert not any(gc.is_tracked(g) for g in gpus)
    gc.collect()
    assert not gc.is_tracked(gpus)


def test_the_fragmentation_memos_keys_leave_the_collectors_view() -> None:
    """A placer memoises up to 500,000 node states' fragmentation; keyed by a frozenset of GPU
    models, every key stayed tracked (12,276 of a placer's 51,387 tracked objects in a burst)."""
    fed = FedFragmentation(DEFAULT_TYPICAL_TASKS)
    for free in ((1000, 500, 250, 0), (900, 900, 100, 100)):
        fed.node(frozenset({"A100-SXM4-80GB"}), 64_000, 512_000, free)
    gc.collect()
    gc.collect()  # a tuple is let go once what it holds was; the key may come before its parts
    keys = list(fed._fed_memo)
    assert len(keys) == 2
    assert not any(gc.is_tracked(key) for key in keys)
