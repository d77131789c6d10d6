"""Fixtures for extender-mode tests: real placers serving the extender, a real binder against the
Kubernetes API test double, a real nats-server; requests shaped exactly as kube-scheduler sends
them (``golden/``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp

from tests.binder.conftest import api, kubeconfig, start_binder  # noqa: F401  (fixtures)
from tests.placer.conftest import start_placer  # noqa: F401  (fixture)

GOLDEN = Path(__file__).parent / "golden"


def golden(name: str) -> Any:
    return json.loads((GOLDEN / f"{name}.json").read_text())


async def post(port: int, verb: str, body: Any) -> tuple[int, Any]:
    """POST ``body`` (JSON, or raw bytes) to the extender as kube-scheduler does."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"http://127.0.0.1:{port}/{verb}",
            data=data,
            headers={"Content-Type": "application/json"},
        ) as response,
    ):
        return response.status, json.loads(await response.read())
