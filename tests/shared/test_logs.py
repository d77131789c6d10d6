"""Structured logs: one JSON object per line with extra fields at the top level."""

from __future__ import annotations

import ast
import json
import logging
from pathlib import Path

from shared.runtime.logs import JsonFormatter, TextFormatter


def _record(**extra: object) -> logging.LogRecord:
    record = logging.LogRecord(
        "tessera.test", logging.WARNING, __file__, 1, "rejected %s", ("x",), None
    )
    record.__dict__.update(extra)
    return record


def test_json_lines_carry_service_level_message_and_extras() -> None:
    line = JsonFormatter("placer").format(_record(family="pods", reason="bad uid"))
    parsed = json.loads(line)
    assert parsed["service"] == "placer"
    assert parsed["level"] == "warning"
    assert parsed["msg"] == "rejected x"
    assert parsed["family"] == "pods"
    assert parsed["reason"] == "bad uid"
    assert "\n" not in line


def test_text_lines_are_readable() -> None:
    line = TextFormatter().format(_record(family="pods"))
    assert line == "warning tessera.test: rejected x family=pods"


def test_no_log_call_names_an_attribute_of_the_log_record_in_its_extra() -> None:
    """``logging`` refuses an ``extra`` key a LogRecord has (``created``, ``message``, ...) with a
    KeyError raised where the call is, instead of logging: a warning in an error path turned
    into a crash of that path (``restore_topology`` failed after it had created the lost
    streams; a refused Kubernetes Event failed the work that wrote it)."""
    reserved = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}
    root = Path(__file__).resolve().parents[2]
    clashes = []
    for folder in ("services", "shared", "tessera"):
        for path in sorted((root / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if not (isinstance(node, ast.keyword) and node.arg == "extra"):
                    continue
                if isinstance(node.value, ast.Dict):
                    keys = [k.value for k in node.value.keys if isinstance(k, ast.Constant)]
                    clashes += [
                        f"{path.relative_to(root)}:{node.lineno} {key}"
                        for key in keys
                        if key in reserved
                    ]
    assert clashes == []
