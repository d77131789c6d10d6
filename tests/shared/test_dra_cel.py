"""Kubernetes DRA CEL selectors on Tessera's devices: what matches, and what is an explained
refusal instead of a guess."""

from __future__ import annotations

import pytest

from shared.dra.cel import SelectorProblem, compile_selector, select
from shared.dra.devices import DeviceDescription, Version, describe
from shared.messages.inventory import GpuTelemetry


def a100(**changes: object) -> DeviceDescription:
    gpu = GpuTelemetry(
        uuid="GPU-a100-0",
        index=3,
        model="A100-80GB",
        memory_total_mib=81920,
        memory_used_mib=0,
        memory_free_mib=81920,
        numa_node=1,
        pci_bus_id="00000000:3B:00.0",
        pcie_root="pci0000:3a",
    )
    device = describe(gpu)
    attributes = {**device.attributes, "gpu.tessera.dev/driverVersion": Version(text="550.54.15")}
    attributes.update({k: v for k, v in changes.items() if isinstance(v, str | int | Version)})
    return DeviceDescription(name=device.name, attributes=attributes, capacity=device.capacity)


T = 'device.attributes["gpu.tessera.dev"]'
C = 'device.capacity["gpu.tessera.dev"]'


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ('device.driver == "gpu.tessera.dev"', True),
        ('device.driver == "example.com"', False),
        (f'{T}.model == "A100-80GB"', True),
        (f'{T}.model.startsWith("H100")', False),
        (f'{T}.model.matches("^A100")', True),
        (f'{T}.model.lowerAscii() == "a100-80gb"', True),
        (f"{T}.index == 3", True),
        (f"{T}.memoryMiB >= 40000", True),
        (f'{T}.uuid in ["GPU-a100-0", "GPU-x"]', True),
        ('device.attributes["resource.kubernetes.io"].numaNode == 1', True),
        ('device.attributes["resource.kubernetes.io"].pciBusID == "0000:3b:00.0"', True),
        ('device.attributes["resource.kubernetes.io"].pcieRoot == "pci0000:3a"', True),
        (f'{C}.memory.compareTo(quantity("40Gi")) >= 0', True),
        (f'{C}.memory.compareTo(quantity("80Gi")) == 0', True),
        (f'{C}.memory.isGreaterThan(quantity("100Gi"))', False),
        (f'{C}.memory.isLessThan(quantity("81921Mi"))', True),
        (f'{C}.memory == quantity("81920Mi")', True),
        (f"{C}.compute.asInteger() == 100", True),
        (f'{C}.memory.sub(quantity("40Gi")).isGreaterThan(quantity("39Gi"))', True),
        (f"{C}.compute.add(1).isInteger() && {C}.compute.sign() == 1", True),
        ('quantity("1") == quantity("1000m")', True),
        ('isQuantity("8Gi") && !isQuantity("eight")', True),
        (f'{T}.driverVersion.isGreaterThan(semver("550.0.0"))', True),
        (f"{T}.driverVersion.major() == 550 && {T}.driverVersion.minor() == 54", True),
        (f'{T}.driverVersion.compareTo(semver("550.54.15")) == 0', True),
        ('semver("1.0.0-alpha").isLessThan(semver("1.0.0"))', True),
        ('semver("1.0.0-alpha.2").isGreaterThan(semver("1.0.0-alpha.10"))', False),
        ('isSemver("1.2.3") && !isSemver("1.2")', True),
        ('has(device.attributes["other.example.com"].model)', False),
        (f"has({T}.model) && !has({T}.nvlink)", True),
        ('"model" in device.attributes["gpu.tessera.dev"]', True),
        ("device.allowMultipleAllocations", True),
        (f"[{T}.index].exists(i, i > 2)", True),
    ],
)
def test_selectors_match_as_kubernetes_evaluates_them(expression: str, expected: bool) -> None:
    assert select((expression,), a100()) is expected


@pytest.mark.parametrize(
    ("expression", "problem"),
    [
        (f"{T}.model ==", "is not valid CEL"),
        ("cel.bind(x, 1, x == 1)", "does not implement bind"),
        (f'{T}.model.split("-")[0] == "A100"', "does not implement split"),
        (f"{T}.nvlink == 2", "cannot evaluate: no such member in mapping: 'nvlink'"),
        ('device.attributes["other.example.com"].model == "x"', "no such member"),
        (f"{T}.model", "evaluates to string, not bool"),
        (f"{T}.index", "evaluates to int, not bool"),
        ('quantity("eight") == quantity("8")', "'eight' is not a quantity"),
        (f'{C}.memory.compareTo(semver("1.0.0")) == 0', "cannot compare Quantity with Semver"),
        ('semver("1.2") == semver("1.2.0")', "'1.2' is not a semantic version"),
        ('quantity("1.5").asInteger() == 1', "is not an integer"),
        (f"{T}.model > 3", "cannot evaluate"),
    ],
)
def test_what_cannot_be_evaluated_is_explained(expression: str, problem: str) -> None:
    verdict = select((expression,), a100())
    assert isinstance(verdict, SelectorProblem), verdict
    assert verdict.expression == expression
    assert problem in verdict.problem, verdict.problem


def test_every_selector_must_hold_and_the_first_problem_is_the_answer() -> None:
    device = a100()
    assert select((), device) is True
    assert select(('device.driver == "gpu.tessera.dev"', f"{T}.index == 3"), device) is True
    assert select(('device.driver == "gpu.tessera.dev"', f"{T}.index == 4"), device) is False
    verdict = select((f"{T}.index == 4", f"{T}.nvlink == 1"), device)
    assert verdict is False  # the first selector already rules the device out
    verdict = select((f"{T}.nvlink == 1", f"{T}.index == 4"), device)
    assert isinstance(verdict, SelectorProblem) and "nvlink" in verdict.problem


def test_compiled_selectors_are_shared_and_reusable() -> None:
    expression = f'{T}.model == "A100-80GB"'
    first = compile_selector(expression)
    assert first is compile_selector(expression)
    assert not isinstance(first, SelectorProblem)
    assert first.matches(a100()) is True
    assert first.matches(a100(**{"gpu.tessera.dev/model": "H100"})) is False
