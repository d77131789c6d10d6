"""``tessera placer``: settings and entry point of the placer service."""

from __future__ import annotations

from typing import Annotated

import msgspec

from shared.config import Settings
from shared.runtime.command import ServiceCommand


class PlacerSettings(Settings, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Placer settings."""

    profile: Annotated[str, msgspec.Meta(description="placement profile name")] = "tessera"
    placer_id: Annotated[
        str, msgspec.Meta(description="identity written on decisions; empty = hostname")
    ] = ""


SERVICE = ServiceCommand(
    name="placer",
    summary="decide node and GPUs for pending pods",
    description="The placer consumes pending pods, inventory and node facts, runs the pure "
    "placement core and commits each decision to the ledger before publishing it.",
    settings=PlacerSettings,
    main=None,
)
