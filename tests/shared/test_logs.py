"""Structured logs: one JSON object per line with extra fields at the top level."""

from __future__ import annotations

import json
import logging

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
