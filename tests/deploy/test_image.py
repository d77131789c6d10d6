"""The Dockerfile: no image can be built here (no Docker daemon), so its text is checked against
what the chart and the package expect of the image."""

from __future__ import annotations

import fnmatch
import re
import shlex
import tomllib

import yaml

from tests.deploy.chart import CHART_DIR, REPO_ROOT, containers, render

DOCKERFILE = (REPO_ROOT / "Dockerfile").read_text()
INSTRUCTIONS = [
    re.split(r"\s+", line.strip(), maxsplit=1)
    for line in re.sub(r"\\\n", " ", DOCKERFILE).splitlines()
    if line.strip() and not line.lstrip().startswith("#")
]


def instructions(name: str) -> list[str]:
    return [rest for keyword, rest in INSTRUCTIONS if keyword == name]


def test_multi_stage_on_slim_python_3_11() -> None:
    (default_base,) = [a for a in instructions("ARG") if a.startswith("PYTHON_IMAGE=")]
    assert default_base == "PYTHON_IMAGE=python:3.11-slim"
    stages = instructions("FROM")
    assert len(stages) == 2
    assert all(stage.startswith("${PYTHON_IMAGE}") for stage in stages)
    (copied,) = [c for c in instructions("COPY") if c.startswith("--from=")]
    assert copied == "--from=build /opt/tessera /opt/tessera"


def test_runs_the_tessera_console_script_as_the_charts_non_root_user() -> None:
    scripts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    (entrypoint,) = instructions("ENTRYPOINT")
    assert yaml.safe_load(entrypoint) == ["tessera"]
    assert "tessera" in scripts
    (user,) = instructions("USER")
    uid, _, gid = user.partition(":")
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    assert int(uid) == values["podSecurityContext"]["runAsUser"] > 0
    assert int(gid) == values["podSecurityContext"]["runAsGroup"]


def test_chart_runs_every_tessera_service_through_that_entrypoint() -> None:
    image = f"tessera:{yaml.safe_load((CHART_DIR / 'Chart.yaml').read_text())['appVersion']}"
    for container in containers(render({"dashboard": {"enabled": True}})):
        if container.spec["image"] == image:
            assert "command" not in container.spec, container.where  # the entrypoint runs
            assert container.args()[0] == container.spec["name"]


def test_build_context_holds_what_the_build_copies() -> None:
    patterns = [
        line.strip()
        for line in (REPO_ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]

    def ignored(path: str) -> bool:
        result = False
        for pattern in patterns:
            negated = pattern.startswith("!")
            bare = pattern.removeprefix("!").rstrip("/")
            if fnmatch.fnmatch(path, bare) or path.startswith(bare + "/"):
                result = not negated
        return result

    for copy in instructions("COPY"):
        if copy.startswith("--from="):
            continue
        *sources, _target = shlex.split(copy)
        for source in sources:
            assert (REPO_ROOT / source).exists(), source
            assert not ignored(source), f"{source} is excluded by .dockerignore"
    for heavy in (".venv", ".git", ".tools", "tests", "benchmarks", "deploy"):
        assert ignored(heavy), heavy
