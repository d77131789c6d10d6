"""``tessera dashboard``: entry point of the read-only web dashboard."""

from __future__ import annotations

from services.dashboard.service import run_dashboard
from services.dashboard.settings import DashboardSettings
from shared.runtime.command import ServiceCommand


async def main(settings: DashboardSettings) -> int:
    """Entry point of ``tessera dashboard``; returns the process exit code."""
    return await run_dashboard(settings)


SERVICE = ServiceCommand(
    name="dashboard",
    summary="serve a live web page of every GPU's slices and every Pending pod",
    description="The dashboard watches the inventory, node facts, assignment records and placer "
    "statistics KV buckets and listens for rejections and deletions on NATS, and serves one live "
    "page (updates pushed by server-sent events) and a JSON API: GET /api/v1/cluster, "
    "/api/v1/pods/pending, /api/v1/events. Read-only; it needs no Kubernetes access. Open the URL "
    "of the 'dashboard page' log line (the port is in 'service starting'). Exit codes: 0 after "
    "SIGTERM, 1 when the service failed, 2 configuration error, 5 NATS refused the credentials.",
    settings=DashboardSettings,
    main=main,
)
