"""Settings of ``tessera dashboard`` (option = field name with ``-``; env ``TESSERA_<FIELD>``)."""

from __future__ import annotations

from typing import Annotated

import msgspec

from shared.config import Settings


class DashboardSettings(Settings, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Dashboard settings."""

    http_port: Annotated[
        int,
        msgspec.Meta(
            ge=0,
            le=65535,
            description="port of the page, the JSON API (/api/v1/...), /healthz, /readyz and "
            "/metrics; 0 = any free port (logged in the 'service starting' line)",
        ),
    ] = 8080
    push_interval_s: Annotated[
        float,
        msgspec.Meta(
            gt=0,
            le=10,
            description="open pages get at most one live update per this many seconds (a burst "
            "of changes becomes one update)",
        ),
    ] = 0.25
    inventory_stale_s: Annotated[
        float,
        msgspec.Meta(
            gt=0, description="a node whose latest inventory is older than this is shown stale"
        ),
    ] = 60.0
    stats_stale_s: Annotated[
        float,
        msgspec.Meta(
            gt=0,
            description="placer statistics (fragmentation) older than this are shown stale",
        ),
    ] = 120.0
    pending_rows: Annotated[
        int,
        msgspec.Meta(
            ge=1,
            description="Pending pods the page lists, oldest first (the count, the reasons and "
            "/api/v1/pods/pending cover all of them)",
        ),
    ] = 500
