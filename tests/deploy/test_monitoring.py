"""Tessera's alerts and Grafana dashboard: the rules checked and unit-tested by promtool, the
dashboard built by its generator (and up to date), valid, and both shipped by the chart.

That every metric they read is exported by a running service is checked on a live system in
tests/up/test_operator.py, with :func:`metric_names`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema
import pytest
import yaml

from tests.deploy.chart import (
    CHART_DIR,
    PROMETHEUS_RULE_API,
    REPO_ROOT,
    named,
    of_kind,
    render,
)

RULES = CHART_DIR / "files" / "prometheus-rules.yaml"
DASHBOARD = CHART_DIR / "files" / "grafana-dashboard.json"
RULES_TEST = Path(__file__).parent / "monitoring" / "rules-test.yaml"
GENERATOR = REPO_ROOT / "deploy" / "monitoring" / "grafana_dashboard.py"
SCHEMA = json.loads((Path(__file__).parent / "schemas" / "grafana-dashboard.json").read_text())
ALERTS = {
    "TesseraGpuMemoryNearlyExhausted",
    "TesseraPodsPendingTooLong",
    "TesseraNodeInventoryStale",
    "TesseraDevicePluginNotReady",
    "TesseraBinderWithoutLeader",
    "TesseraPodWorkNotStored",
}
_METRIC = re.compile(r"\btessera_[a-z0-9_]+\b")


def metric_names(expr: str) -> set[str]:
    """The Tessera metric names a PromQL expression reads."""
    return set(_METRIC.findall(expr))


def rule_expressions() -> list[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule["expr"] for group in groups for rule in group["rules"]]


def dashboard_expressions() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [target["expr"] for panel in panels for target in panel.get("targets", [])]


def promtool() -> str:
    """The promtool the tests run; fails (never skips) with the way out when it is missing."""
    found = os.environ.get("TESSERA_PROMTOOL") or shutil.which("promtool")
    if found is None:
        pytest.fail(
            "promtool not found: run `bash scripts/tools` (scripts/test does) to install Debian's "
            "prometheus package, or point TESSERA_PROMTOOL at a promtool binary"
        )
    return found


def test_promtool_checks_the_rules() -> None:
    done = subprocess.run(
        [promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in done.stdout
    alerts = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    assert alerts == ALERTS


def test_promtool_unit_tests_fire_each_alert_when_and_only_when_due(tmp_path: Path) -> None:
    tests = yaml.safe_load(RULES_TEST.read_text())
    tests["rule_files"] = [str(RULES)]
    tested = {t["alertname"] for case in tests["tests"] for t in case["alert_rule_test"]}
    assert tested == ALERTS, "every alert has a unit test"
    test_file = tmp_path / "rules-test.yaml"
    test_file.write_text(yaml.safe_dump(tests))
    done = subprocess.run(
        [promtool(), "test", "rules", str(test_file)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_broken_rule_is_caught(tmp_path: Path) -> None:
    """The check above can fail: promtool refuses a rule that does not parse."""
    broken = tmp_path / "broken.yaml"
    broken.write_text(RULES.read_text().replace("> 900", "> > 900"))
    done = subprocess.run(
        [promtool(), "check", "rules", str(broken)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0


def test_the_chart_ships_the_rules_as_a_prometheus_rule_when_the_cluster_can_hold_one() -> None:
    with_api = render({}, [PROMETHEUS_RULE_API])
    (rule,) = of_kind(with_api, "PrometheusRule")
    assert rule["spec"] == yaml.safe_load(RULES.read_text())
    assert of_kind(render({}), "PrometheusRule") == []
    labelled = render({"monitoring": {"prometheusRule": {"enabled": True, "labels": {"r": "x"}}}})
    assert of_kind(labelled, "PrometheusRule")[0]["metadata"]["labels"]["r"] == "x"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("grafana_dashboard", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_grafana_dashboard_is_what_its_generator_builds() -> None:
    assert DASHBOARD.read_text() == _generator().render(), (
        "stale: run `.venv/bin/python deploy/monitoring/grafana_dashboard.py`"
    )


def test_the_grafana_dashboard_is_valid() -> None:
    board: dict[str, Any] = json.loads(DASHBOARD.read_text())
    problems = [
        f"{'.'.join(map(str, e.path))}: {e.message}"
        for e in jsonschema.Draft7Validator(SCHEMA).iter_errors(board)
    ]
    assert not problems, "\n".join(problems)
    panels = board["panels"]
    assert len({p["id"] for p in panels}) == len(panels), "panel ids are unique"
    taken: set[tuple[int, int]] = set()
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        cells = {
            (grid["x"] + dx, grid["y"] + dy) for dx in range(grid["w"]) for dy in range(grid["h"])
        }
        assert not cells & taken, f"{panel['title']} overlaps another panel"
        taken |= cells
    assert all(metric_names(e) for e in dashboard_expressions()), "every query reads Tessera"


def test_the_schema_refuses_what_grafana_would_not_draw() -> None:
    """The validation above can fail: a panel without a grid position or of an unknown type."""
    board = json.loads(DASHBOARD.read_text())
    del board["panels"][1]["gridPos"]
    board["panels"][2]["type"] = "graph-of-the-future"
    errors = list(jsonschema.Draft7Validator(SCHEMA).iter_errors(board))
    assert len(errors) >= 2


def test_the_chart_ships_the_grafana_dashboard_for_the_sidecar() -> None:
    objects = render({})
    config_map = named(objects, "ConfigMap", "tessera-grafana-dashboard")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads(config_map["data"]["tessera-gpu-allocation.json"])
    assert shipped == json.loads(DASHBOARD.read_text())
    off = render({"monitoring": {"grafanaDashboard": {"enabled": False}}})
    assert not [c for c in of_kind(off, "ConfigMap") if "grafana" in c["metadata"]["name"]]
