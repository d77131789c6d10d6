"""Structured logging on the standard library: one JSON object per line (or readable text).

Fields passed with ``extra={...}`` become top-level keys, so ``log.warning("rejected message",
extra={"family": "pods", "reason": r})`` prints ``{"level": "warning", "msg": "rejected message",
"family": "pods", "reason": ...}``.

A process hosting several services (``tessera.up.agents``, for large simulated clusters) names
the one a line comes from in ``agent`` (:data:`AGENT`, set in each hosted service's task).
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
from collections.abc import Iterable
from typing import Any

from shared.config import REDACTED

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}


AGENT: contextvars.ContextVar[str] = contextvars.ContextVar("tessera_log_agent", default="")
"""The hosted service a log line comes from, when one process hosts several ("" otherwise)."""


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    fields = {k: v for k, v in record.__dict__.items() if k not in _STANDARD}
    agent = AGENT.get()
    return {"agent": agent, **fields} if agent else fields


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON line with its extra fields."""

    def __init__(self, service: str) -> None:
        super().__init__()
        self._service = service

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "service": self._service,
            "logger": record.name,
            "msg": record.getMessage(),
            **_fields(record),
        }
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


class TextFormatter(logging.Formatter):
    """Human-readable lines with ``key=value`` extras."""

    def format(self, record: logging.LogRecord) -> str:
        extras = " ".join(f"{k}={v}" for k, v in _fields(record).items())
        base = f"{record.levelname.lower():7} {record.name}: {record.getMessage()}"
        text = f"{base} {extras}" if extras else base
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


class Redactor:
    """Replaces every known secret in a text by ``***`` (also in its JSON-escaped form)."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        forms: set[str] = set()
        for secret in secrets:
            if secret:
                forms.add(secret)
                forms.add(json.dumps(secret)[1:-1])
        # Longest first, so a secret containing another is replaced whole.
        self._forms = sorted(forms, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for form in self._forms:
            if form in text:
                text = text.replace(form, REDACTED)
        return text


class RedactingFormatter(logging.Formatter):
    """Formats with ``inner``, then scrubs secrets from the whole line (message, fields and
    traceback alike): nothing a library puts in an error can carry a password out."""

    def __init__(self, inner: logging.Formatter, redact: Redactor) -> None:
        super().__init__()
        self._inner = inner
        self._redact = redact

    def format(self, record: logging.LogRecord) -> str:
        return self._redact(self._inner.format(record))


def configure_logging(
    *, service: str, level: str, fmt: str, redact: Redactor | None = None
) -> None:
    """Send every log record to stderr in ``fmt`` (``json`` or ``text``) at ``level``, with the
    secrets ``redact`` knows scrubbed."""
    handler = logging.StreamHandler(sys.stderr)
    inner: logging.Formatter = JsonFormatter(service) if fmt == "json" else TextFormatter()
    handler.setFormatter(RedactingFormatter(inner, redact or Redactor()))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
