"""``tessera placer``: settings and entry point of the placer service."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import msgspec

from services.placer.config import (
    ConfigFileError,
    is_builtin_profile,
    known_profiles,
    parse_profile,
    parse_tenancy,
)
from services.placer.rules import mix
from shared.config import ConfigError, Settings
from shared.runtime.command import ServiceCommand

if TYPE_CHECKING:
    from services.placer.service import PlacerConfig


class PlacerSettings(Settings, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Placer settings."""

    profile: Annotated[
        str,
        msgspec.Meta(
            description=f"placement profile: a built-in name ({known_profiles()}) or the path "
            "of a TOML or JSON profile file"
        ),
    ] = "tessera"
    placer_id: Annotated[
        str,
        msgspec.Meta(description="identity written on decisions and bookings; empty = host-pid"),
    ] = ""
    tenancy_file: Annotated[
        str,
        msgspec.Meta(
            description="JSON or TOML file of resource groups, permissions and quotas (seed "
            "001), watched and applied live; a bad version is refused and the last good kept; "
            "empty = no groups, no quotas"
        ),
    ] = ""
    reserve_timeout_s: Annotated[
        float,
        msgspec.Meta(
            gt=0,
            description="a reserved placement the binder has not bound within this many "
            "seconds is released and the pod placed again",
        ),
    ] = 120.0
    release_retention_s: Annotated[
        float,
        msgspec.Meta(
            gt=0,
            description="released assignment records and deleted pods' claims are purged after "
            "this many seconds",
        ),
    ] = 3600.0
    inventory_stale_s: Annotated[
        float,
        msgspec.Meta(
            gt=0,
            description="a node whose GPU inventory is older than this (heartbeat missed) is "
            "not placed on",
        ),
    ] = 30.0
    max_commit_retries: Annotated[
        int,
        msgspec.Meta(
            ge=0,
            description="times a pod is decided again after its node changed under the commit, "
            "before its message is handed back for later",
        ),
    ] = 8
    task_mix_window: Annotated[
        int,
        msgspec.Meta(
            ge=1,
            description="newest placed pods the typical task mix (FGD, tessera profile) is "
            "learned from",
        ),
    ] = mix.WINDOW
    ack_wait_s: Annotated[
        float,
        msgspec.Meta(
            gt=0,
            description="pod messages of a replica that stopped answering go to another replica "
            "after this many seconds",
        ),
    ] = 30.0
    extender_port: Annotated[
        int,
        msgspec.Meta(
            ge=0,
            le=65535,
            description="serve kube-scheduler's scheduler extender (POST filter, prioritize, "
            "bind) on this port, for clusters that keep kube-scheduler; 0 = off",
        ),
    ] = 0
    extender_bind_timeout_s: Annotated[
        float,
        msgspec.Meta(
            gt=0,
            description="the extender answers bind (the pod bound, or why not) within this many "
            "seconds: keep it below the httpTimeout of kube-scheduler's extender config (5 s "
            "by default)",
        ),
    ] = 4.0
    reconcile_interval_s: Annotated[
        float,
        msgspec.Meta(
            gt=0,
            description="seconds between two passes repairing half-done commits and releases "
            "(also run at start)",
        ),
    ] = 30.0
    pools: Annotated[
        int,
        msgspec.Meta(
            ge=1,
            le=1024,
            description="split the nodes into this many pools, each held by one replica at a "
            "time (leases in KV), so that replicas add capacity: a replica decides pods on its "
            "own pools' nodes and on others' only when none of its own fits; give every replica "
            "the same number (the number of replicas is a good one); 1 = every replica decides "
            "on every node; not with --extender-port",
        ),
    ] = 1
    pool_lease_s: Annotated[
        float,
        msgspec.Meta(
            gt=0,
            description="a pool whose holder has not renewed its lease for this many seconds "
            "(killed, cut off) is taken over by another replica; renewed every third of it",
        ),
    ] = 3.0
    burst_spread: Annotated[
        bool,
        msgspec.Meta(
            description="while a burst is handed off, decide a pod that would wait at the "
            "binder's gate (behind pods queued on its node with as many GPU shares on other "
            "slices) onto another node: the burst reaches Allocate on many nodes at once, "
            "faster, on more nodes than the profile alone would choose (benchmarks/RESULTS.md, "
            "issue 22); --no-burst-spread places by the profile alone",
        ),
    ] = True


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as error:
        raise ConfigError(f"cannot read the {what} {path}: {error.strerror}") from None


def build_config(settings: PlacerSettings) -> PlacerConfig:
    """Check the settings together (profile and tenancy files included); ConfigError if not."""
    from services.placer.service import PlacerConfig

    profile = settings.profile
    if not is_builtin_profile(profile) and not Path(profile).is_file():
        raise ConfigError(
            f"--profile {profile!r} is neither a built-in profile ({known_profiles()}) nor a file"
        )
    tenancy_file = settings.tenancy_file
    try:
        spec = (
            profile
            if is_builtin_profile(profile)
            else parse_profile(_read(profile, "profile file"), source=profile)
        )
        tenancy = (
            parse_tenancy(_read(tenancy_file, "tenancy file"), source=tenancy_file)
            if tenancy_file
            else None
        )
    except ConfigFileError as error:
        raise ConfigError(str(error)) from None
    if settings.pools > 1 and settings.extender_port:
        raise ConfigError(
            "--pools above 1 cannot go with --extender-port: kube-scheduler chooses any node, "
            "so the extender's replicas must each decide on every node"
        )
    return PlacerConfig(
        placer_id=settings.placer_id or f"{os.uname().nodename}-{os.getpid()}",
        profile=spec,
        tenancy_file=settings.tenancy_file,
        tenancy=tenancy,
        reserve_timeout_s=settings.reserve_timeout_s,
        release_retention_s=settings.release_retention_s,
        inventory_stale_s=settings.inventory_stale_s,
        max_commit_retries=settings.max_commit_retries,
        task_mix_window=settings.task_mix_window,
        ack_wait_s=settings.ack_wait_s,
        reconcile_interval_s=settings.reconcile_interval_s,
        extender_port=settings.extender_port,
        extender_host=settings.http_host,
        extender_bind_timeout_s=settings.extender_bind_timeout_s,
        pools=settings.pools,
        pool_lease_s=settings.pool_lease_s,
        burst_spread=settings.burst_spread,
        claims_with_bookings=settings.nats_replicas > 1,
    )


async def main(settings: PlacerSettings) -> int:
    """Run the placer until SIGTERM; the exit code."""
    from services.placer.extender import listen
    from services.placer.service import run_placer
    from shared.runtime.lifecycle import run_service

    config = build_config(settings)
    listener = listen(config.extender_host, config.extender_port) if config.extender_port else None
    try:
        return await run_service(
            name="placer",
            settings=settings,
            body=functools.partial(run_placer, config=config, extender_listener=listener),
        )
    finally:
        if listener is not None:
            listener.close()


SERVICE = ServiceCommand(
    name="placer",
    summary="decide node and GPUs for pending pods",
    description="The placer consumes pending and deleted pods (a durable consumer every replica "
    "shares), keeps inventory, node facts, the ledger and assignment records current from KV, "
    "runs the pure placement core and commits each decision by a write guarded on the node's "
    "bookings before publishing it; run as many replicas as needed. GET /v1/pods/<uid> on "
    "--http-port explains one pod. With --extender-port it also serves kube-scheduler's "
    "scheduler extender (filter, prioritize, bind) for clusters that keep kube-scheduler.",
    settings=PlacerSettings,
    main=main,
)
