"""The fake reader: ``--fake-gpus`` shorthand, ``--fake-spec`` files, scripted load and events."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.inventory.fake import (
    FakeEvent,
    FakeGpuGroup,
    FakeReader,
    FakeSpec,
    FakeSpecError,
    load_fake_spec,
    parse_fake_gpus,
)
from services.inventory.reader import GpuFault, HealthEvent
from shared.messages.inventory import GpuLink, GpuProcess


@pytest.mark.parametrize(
    ("text", "groups"),
    [
        pytest.param("4xA100-80GB", [("A100-80GB", 81920, 4)], id="one-group"),
        pytest.param(
            "2xA100-SXM4-80GB,1xT4-16GB",
            [("A100-SXM4-80GB", 81920, 2), ("T4-16GB", 16384, 1)],
            id="two-groups",
        ),
        pytest.param(" 2 x H100-80GiB ", [("H100-80GiB", 81920, 2)], id="spaces-and-gib"),
        pytest.param("1xL4-24G", [("L4-24G", 24576, 1)], id="g-suffix"),
        pytest.param("3XTEST-512MB", [("TEST-512MB", 512, 3)], id="mib-and-capital-x"),
    ],
)
def test_shorthand(text: str, groups: list[tuple[str, int, int]]) -> None:
    spec = parse_fake_gpus(text)
    assert [(g.model, g.memory_mib, g.count) for g in spec.gpus] == groups


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("A100-80GB", "cannot read 'A100-80GB'", id="no-count"),
        pytest.param("4xA100", "cannot read '4xA100'", id="no-memory"),
        pytest.param("4xA100-80TB", "cannot read '4xA100-80TB'", id="unknown-unit"),
        pytest.param("0xA100-80GB", "needs a count and memory above 0", id="zero-count"),
        pytest.param(" , ", "--fake-gpus is empty", id="empty"),
    ],
)
def test_shorthand_errors(text: str, message: str) -> None:
    with pytest.raises(FakeSpecError, match=message):
        parse_fake_gpus(text)


SPEC_TOML = """
driver_version = "550.54.15"
[[gpus]]
model = "A100-SXM4-80GB"
memory_mib = 81920
count = 2
nvlinks = 12
utilization_pct = [10, 80]
memory_used_mib = [1024, 90000]
[[gpus]]
model = "T4-16GB"
memory_mib = 16384
numa_node = 1
[[events]]
gpu = 1
at_read = 2
xid = 79
[[events]]
gpu = 2
at_read = 3
kind = "vanish"
"""

SPEC = FakeSpec(
    driver_version="550.54.15",
    gpus=(
        FakeGpuGroup(
            model="A100-SXM4-80GB",
            memory_mib=81920,
            count=2,
            nvlinks=12,
            utilization_pct=(10, 80),
            memory_used_mib=(1024, 90000),
        ),
        FakeGpuGroup(model="T4-16GB", memory_mib=16384, numa_node=1),
    ),
    events=(FakeEvent(gpu=1, at_read=2, xid=79), FakeEvent(gpu=2, at_read=3, kind="vanish")),
)


@pytest.mark.parametrize(
    ("name", "text"),
    [
        pytest.param("spec.toml", SPEC_TOML, id="toml"),
        pytest.param(
            "spec.json",
            """{"driver_version": "550.54.15", "gpus": [
            {"model": "A100-SXM4-80GB", "memory_mib": 81920, "count": 2, "nvlinks": 12,
             "utilization_pct": [10, 80], "memory_used_mib": [1024, 90000]},
            {"model": "T4-16GB", "memory_mib": 16384, "numa_node": 1}],
            "events": [{"gpu": 1, "at_read": 2, "xid": 79},
                       {"gpu": 2, "at_read": 3, "kind": "vanish"}]}""",
            id="json",
        ),
    ],
)
def test_spec_files(tmp_path: Path, name: str, text: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    assert load_fake_spec(path) == SPEC


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param(
            "[[gpus]]\nmodel = 'X'\n",
            r"Object missing required field `memory_mib`",
            id="missing-field",
        ),
        pytest.param(
            "[[gpus]]\nmodel = 'X'\nmemory_mib = 1\ncolour = 'red'\n",
            r"unknown field `colour`",
            id="unknown-field",
        ),
        pytest.param(
            "[[gpus]]\nmodel = 'X'\nmemory_mib = 0\n",
            r"Expected `int` >= 1 - at `\$.gpus\[0\].memory_mib`",
            id="zero-memory",
        ),
        pytest.param("gpus = [", r"--fake-spec .*spec.toml: Invalid value", id="not-toml"),
    ],
)
def test_spec_file_errors(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "spec.toml"
    path.write_text(text)
    with pytest.raises(FakeSpecError, match=message):
        load_fake_spec(path)


def test_missing_spec_file(tmp_path: Path) -> None:
    with pytest.raises(FakeSpecError, match=r"cannot read .*nope.toml: No such file"):
        load_fake_spec(tmp_path / "nope.toml")


def test_event_for_a_gpu_the_spec_lacks() -> None:
    spec = FakeSpec(
        gpus=(FakeGpuGroup(model="X", memory_mib=1),), events=(FakeEvent(gpu=3, at_read=1),)
    )
    with pytest.raises(FakeSpecError, match="event for gpu 3, but the spec has 1 GPUs"):
        FakeReader(spec, node="n1")


def test_uuids_are_stable_per_node_and_distinct_across_nodes() -> None:
    spec = parse_fake_gpus("2xA100-80GB")
    first, again, other = (FakeReader(spec, node=n).uuids for n in ("n1", "n1", "n2"))
    assert first == again
    assert len(set(first) | set(other)) == 4
    assert all(uuid.startswith("GPU-") for uuid in first)


async def test_scripted_load_events_and_vanishing() -> None:
    reader = FakeReader(SPEC, node="n1")
    a, b, t4 = reader.uuids
    await reader.open()
    first = await reader.read()
    assert [
        (g.uuid, g.utilization_pct, g.memory_used_mib, g.memory_free_mib) for g in first.gpus
    ] == [(a, 10, 1024, 80896), (b, 10, 1024, 80896), (t4, 0, 0, 16384)]
    assert first.gpus[0].links == (
        GpuLink(peer_uuid=b, level="single", nvlinks=12),
        GpuLink(peer_uuid=t4, level="system", nvlinks=0),
    )
    assert first.gpus[2].numa_node == 1
    assert first.driver_version == "550.54.15"
    assert await reader.wait_event(0.01) is None

    second = await reader.read()  # used memory is capped at the GPU's memory
    assert [(g.utilization_pct, g.memory_used_mib, g.memory_free_mib) for g in second.gpus[:2]] == [
        (80, 81920, 0),
        (80, 81920, 0),
    ]
    assert await reader.wait_event(1.0) == HealthEvent(uuid=b, kind="xid", code=79)

    third = await reader.read()
    assert [g.uuid for g in third.gpus] == [a, b]
    await reader.close()


async def test_direct_control() -> None:
    reader = FakeReader(parse_fake_gpus("2xA100-80GB"), node="n1")
    a, b = reader.uuids
    reader.set_load(
        0,
        utilization_pct=100,
        memory_used_mib=5000,
        processes=(GpuProcess(pid=3, used_memory_mib=5000),),
    )
    reader.set_lost(1)
    reading = await reader.read()
    gpu = reading.gpus[0]
    assert (
        gpu.utilization_pct,
        gpu.memory_used_mib,
        gpu.temperature_c,
        gpu.power_w,
        gpu.processes,
    ) == (100, 5000, 75, 400.0, (GpuProcess(pid=3, used_memory_mib=5000),))
    assert reading.faults == (GpuFault(index=1, uuid=b, reason="GPU is lost"),)
    reader.restore(1)
    reader.inject(0, kind="ecc_double_bit")
    assert [g.uuid for g in (await reader.read()).gpus] == [a, b]
    assert await reader.wait_event(1.0) == HealthEvent(uuid=a, kind="ecc_double_bit", code=0)
