"""``tessera binder``: settings and entry point of the binder service."""

from __future__ import annotations

from typing import Annotated

import msgspec

from shared.config import Settings
from shared.runtime.command import ServiceCommand


class BinderSettings(Settings, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Binder settings."""

    kubeconfig: Annotated[
        str, msgspec.Meta(description="kubeconfig file; empty = in-cluster service account")
    ] = ""
    scheduler_name: Annotated[
        str, msgspec.Meta(description="pods with this spec.schedulerName are Tessera's")
    ] = "tessera"


SERVICE = ServiceCommand(
    name="binder",
    summary="watch pods and nodes, bind decided pods, explain Pending ones",
    description="The binder is Tessera's only Kubernetes client: it publishes pending and "
    "deleted pods and node facts to NATS, binds pods the placer decided, and writes "
    "PodScheduled=False with the counted reasons for rejected ones.",
    settings=BinderSettings,
    main=None,
)
