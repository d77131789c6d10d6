"""``docs/design.md`` names only what the code defines, and what cites it cites a real section.

The product contract is prose, so nothing else would notice it naming a resource, annotation,
environment variable, subject, bucket or option the code renamed or never had. Each kind of name
is found in the page by its pattern and looked up where the code defines it: the pod-facing
names in ``shared/annotations.py`` (and the device plugin's and the DRA side's constants), the
container environment as the device plugin builds it, subjects, streams and buckets in
``shared/subjects.py``, settings and options in the ``tessera`` command's own parsers.
"""

from __future__ import annotations

import argparse
import importlib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

from services.binder.rules import draslices
from services.deviceplugin.rules import allocate
from services.deviceplugin.rules.allocate import ResponseOptions, slice_environment
from shared import annotations as names
from shared import subjects
from shared.config import CONFIG_FILE_ENV, ProcessSettings, env_var
from shared.dra import devices
from shared.messages.base import GpuSlice
from shared.runtime.command import ServiceCommand
from tessera.cli import ENTRIES, build_parser

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"
SECTIONS = range(1, 15)
"""The upstream brief's sections, whose numbers the page keeps so that citations stay valid."""


def _text() -> str:
    return DESIGN.read_text(encoding="utf-8")


def _code_spans(text: str) -> list[str]:
    """Inline code, whitespace joined (a span may wrap); fence lines left out so they pair."""
    unfenced = "\n".join(line for line in text.splitlines() if not line.startswith("```"))
    return [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", unfenced)]


def _constants(*modules: ModuleType) -> set[str]:
    return {
        value for module in modules for value in vars(module).values() if isinstance(value, str)
    }


# --- where each kind of name is defined ---------------------------------------------------------


def pod_facing_names() -> set[str]:
    return _constants(names, allocate, draslices, devices)


def container_environment() -> set[str]:
    gpu = GpuSlice(uuid="GPU-0", index=0, memory_mib=1024, cores=10)
    found: set[str] = set()
    for options in (
        ResponseOptions(isolation="mps", compat=frozenset({"volcano", "aliyun"})),
        ResponseOptions(isolation="hami-core"),
    ):
        envs, _ = slice_environment([gpu], [8192], options=options, pod_memory_mib=1024)
        # One variable per GPU position (``CUDA_DEVICE_MEMORY_LIMIT_0``), as the page writes it.
        found |= {re.sub(r"_0$", "_<i>", name) for name in envs}
    return found


def _service_settings() -> list[type[ProcessSettings]]:
    found = []
    for entry in ENTRIES:
        module, attribute = entry.target.split(":")
        command = getattr(importlib.import_module(module), attribute)
        if isinstance(command, ServiceCommand):
            found.append(command.settings)
    return found


def environment_names() -> set[str]:
    settings = {env_var(field) for cls in _service_settings() for field in cls.__struct_fields__}
    return container_environment() | settings | {CONFIG_FILE_ENV} | set(subjects.STREAMS)


def subject_names() -> set[str]:
    per_node = (subjects.inventory, subjects.grants, subjects.nodes, subjects.bindings)
    return (
        {name for name in _constants(subjects) if name.startswith(f"{subjects.ROOT}.")}
        | {build("<node>") for build in (*per_node, subjects.bound)}
        | {subjects.deadletter("<family>")}
    )


def bucket_names() -> set[str]:
    return set(subjects.KV_BUCKETS)


@dataclass(frozen=True)
class Kind:
    name: str
    pattern: re.Pattern[str]
    defined: Callable[[], set[str]]

    def named(self, text: str) -> set[str]:
        return set(self.pattern.findall(text))


KINDS = (
    Kind(
        "resources, annotations, labels, driver",
        re.compile(r"(?<![\w.-])(gpu\.tessera\.dev(?:/[a-z0-9-]+)?|tessera\.dev/[a-z0-9-]+)"),
        pod_facing_names,
    ),
    Kind(
        "environment variables and streams",
        re.compile(
            r"(?<![\w.])((?:NVIDIA|TESSERA|CUDA|VOLCANO|ALIYUN|LD)_[A-Z0-9][A-Z0-9_]*(?:<i>)?)"
        ),
        environment_names,
    ),
    Kind(
        "subjects",
        re.compile(r"(?<![\w./-])(tessera\.(?!dev\b)[a-z][a-z<>*.]*[a-z>*])"),
        subject_names,
    ),
    Kind(
        "KV buckets",
        re.compile(r"(?<![\w./-])(tessera-[a-z]+(?:-[a-z]+)*)(?![\w/-])"),
        bucket_names,
    ),
)


@pytest.mark.parametrize("kind", KINDS, ids=lambda kind: kind.name)
def test_every_name_the_design_gives_is_defined_in_the_code(kind: Kind) -> None:
    named = kind.named(_text())
    assert named, f"docs/design.md names no {kind.name}: the pattern no longer finds them"
    assert sorted(named - kind.defined()) == []


def _options() -> dict[str, set[str]]:
    """Each ``tessera`` command's option strings, by command."""
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {
        name: {option for action in sub._actions for option in action.option_strings}
        for name, sub in commands.choices.items()
    }


def _unknown_options(spans: Iterable[str], options: dict[str, set[str]]) -> list[str]:
    every = set().union(*options.values())
    unknown = []
    for span in spans:
        words = span.split()
        flags = re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", span)
        if words[0].startswith("benchmarks/"):
            script = (ROOT / words[0]).read_text(encoding="utf-8")
            unknown += [f"{span}: {flag}" for flag in flags if f'"{flag}"' not in script]
        elif words[0] == "tessera" and len(words) > 1 and words[1] in options:
            unknown += [f"{span}: {flag}" for flag in flags if flag not in options[words[1]]]
        else:
            unknown += [f"{span}: {flag}" for flag in flags if flag not in every]
    return unknown


def test_every_option_the_design_gives_is_one_its_command_takes() -> None:
    spans = [span for span in _code_spans(_text()) if "--" in span]
    assert spans, "docs/design.md names no option: the pattern no longer finds them"
    assert _unknown_options(spans, _options()) == []


def test_the_design_keeps_the_briefs_section_numbers() -> None:
    headings = re.findall(r"^## (\d+)\. ", _text(), flags=re.MULTILINE)
    assert [int(n) for n in headings] == list(SECTIONS)


def _citing_files() -> Iterable[Path]:
    for top in ("shared", "services", "tessera", "tests", "deploy", "benchmarks", "docs"):
        for path in (ROOT / top).rglob("*"):
            if path.suffix in {".py", ".md", ".yaml", ".toml"} and path.is_file():
                yield path
    yield from (ROOT / "README.md", ROOT / "pyproject.toml")


def test_every_citation_of_the_design_names_a_section_it_has() -> None:
    cited = {
        f"{path.relative_to(ROOT)}: §{number}"
        for path in _citing_files()
        for number in re.findall(
            r"docs/design\.md\W{0,4}§\s*(\d+)", path.read_text(encoding="utf-8", errors="replace")
        )
        if int(number) not in SECTIONS
    }
    assert sorted(cited) == []


def test_only_the_design_page_names_the_upstream_brief() -> None:
    """A clone has no ``../shared/DESIGN.md``: the code cites ``docs/design.md`` instead."""
    brief = re.compile(r"DESIGN(?:\.md| section| §|'s)")
    citing = sorted(
        str(path.relative_to(ROOT))
        for path in _citing_files()
        if path not in (DESIGN, Path(__file__).resolve())
        and brief.search(path.read_text(encoding="utf-8", errors="replace"))
    )
    assert citing == []
