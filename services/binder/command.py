"""``tessera binder``: settings and entry point of the binder service."""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from typing import Annotated

import msgspec

from services.binder.config import BinderConfig, default_identity, pod_namespace
from shared.config import ConfigError, Settings
from shared.runtime.command import ServiceCommand

JITTER = 1.2
"""client-go's leader election jitter factor: the renew deadline must exceed 1.2 retry periods."""


class BinderSettings(Settings, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Binder settings."""

    kubeconfig: Annotated[
        str,
        msgspec.Meta(
            description="kubeconfig file; empty = the in-cluster service account when in a pod, "
            "else KUBECONFIG or ~/.kube/config"
        ),
    ] = ""
    scheduler_name: Annotated[
        str,
        msgspec.Meta(min_length=1, description="pods with this spec.schedulerName are Tessera's"),
    ] = "tessera"
    extender_scheduler_names: Annotated[
        tuple[str, ...],
        msgspec.Meta(
            description="extender mode: pods with one of these spec.schedulerName values that "
            "ask for tessera.dev/* resources are scheduled by kube-scheduler calling the "
            "placer's extender; the binder binds them and gives their GPUs back when they go "
            "(empty = no extender mode)"
        ),
    ] = ("default-scheduler",)
    leader_elect: Annotated[
        bool,
        msgspec.Meta(description="elect one writing binder through a Lease (run 2+ replicas)"),
    ] = True
    lease_name: Annotated[
        str, msgspec.Meta(min_length=1, description="name of the coordination.k8s.io Lease")
    ] = "tessera-binder"
    lease_namespace: Annotated[
        str,
        msgspec.Meta(
            description="namespace of the Lease; empty = the binder's own (POD_NAMESPACE or the "
            "service account's), else default"
        ),
    ] = ""
    lease_duration_s: Annotated[
        float,
        msgspec.Meta(gt=0, description="how long a standby waits on an unrenewed lease"),
    ] = 15.0
    renew_deadline_s: Annotated[
        float,
        msgspec.Meta(gt=0, description="the leader stops writing when it cannot renew this long"),
    ] = 10.0
    retry_period_s: Annotated[
        float, msgspec.Meta(gt=0, description="how often leader and standbys try the lease")
    ] = 2.0
    identity: Annotated[
        str,
        msgspec.Meta(description="holder identity in the Lease; empty = hostname + random suffix"),
    ] = ""
    api_timeout_s: Annotated[
        float, msgspec.Meta(gt=0, description="timeout of each Kubernetes API call")
    ] = 10.0
    gate_timeout_s: Annotated[
        float,
        msgspec.Meta(
            gt=0,
            description="how long a pod waits at the ambiguity gate for the earlier pod it waits "
            "on to move (be allocated, or make way for the next) before its placement fails back "
            "to the placer; a queue that moves never times out",
        ),
    ] = 30.0
    node_facts_refresh_s: Annotated[
        float,
        msgspec.Meta(
            gt=0,
            description="publish a node's facts at most this often while only Tessera's own "
            "pods change what is requested on it (the placer counts those from its bookings); "
            "other changes are published at once",
        ),
    ] = 5.0
    allocation_warning_s: Annotated[
        float,
        msgspec.Meta(
            gt=0, description="warn (Event) on a pod bound this long and not yet allocated"
        ),
    ] = 60.0
    watch_timeout_s: Annotated[
        int,
        msgspec.Meta(ge=1, description="the API server ends each watch after this long (resumed)"),
    ] = 300
    max_in_flight: Annotated[
        int,
        msgspec.Meta(ge=1, description="binds (and other messages) handled at once, each"),
    ] = 256
    dra: Annotated[
        bool,
        msgspec.Meta(
            description="DRA mode (resource.k8s.io/v1, Kubernetes 1.34+): follow ResourceClaims, "
            "allocate gpu.tessera.dev claims of the pods it binds, and publish ResourceSlices "
            "for nodes labelled tessera.dev/gpu-api=dra"
        ),
    ] = False


def build_config(settings: BinderSettings, *, environ: Mapping[str, str]) -> BinderConfig:
    """Check the settings together and derive the binder's configuration; ConfigError if not."""
    if settings.scheduler_name in settings.extender_scheduler_names:
        raise ConfigError(
            f"--extender-scheduler-names must not name --scheduler-name "
            f"({settings.scheduler_name}): Tessera schedules those pods itself"
        )
    if settings.leader_elect:
        if settings.lease_duration_s <= settings.renew_deadline_s:
            raise ConfigError(
                f"--lease-duration-s ({settings.lease_duration_s:g}) must be greater than "
                f"--renew-deadline-s ({settings.renew_deadline_s:g})"
            )
        if settings.renew_deadline_s <= JITTER * settings.retry_period_s:
            raise ConfigError(
                f"--renew-deadline-s ({settings.renew_deadline_s:g}) must be greater than "
                f"{JITTER} x --retry-period-s ({settings.retry_period_s:g})"
            )
    return BinderConfig(
        scheduler_name=settings.scheduler_name,
        extender_scheduler_names=settings.extender_scheduler_names,
        leader_elect=settings.leader_elect,
        lease_name=settings.lease_name,
        lease_namespace=settings.lease_namespace or pod_namespace(environ),
        lease_duration_s=settings.lease_duration_s,
        renew_deadline_s=settings.renew_deadline_s,
        retry_period_s=settings.retry_period_s,
        identity=settings.identity or default_identity(),
        gate_timeout_s=settings.gate_timeout_s,
        node_facts_refresh_s=settings.node_facts_refresh_s,
        allocation_warning_s=settings.allocation_warning_s,
        max_in_flight=settings.max_in_flight,
        dra=settings.dra,
    )


async def main(settings: BinderSettings) -> int:
    """Run the binder until SIGTERM; the exit code."""
    # Imported here so that `tessera --help` and the other services do not load the client.
    from services.binder.kube import KubeGateway, load_configuration, new_configuration
    from services.binder.service import run_binder
    from shared.clock import SystemClock
    from shared.runtime.lifecycle import run_service

    config = build_config(settings, environ=os.environ)
    configuration = new_configuration()
    await load_configuration(configuration, kubeconfig=settings.kubeconfig, environ=os.environ)
    clock = SystemClock()
    connect = functools.partial(
        KubeGateway.create,
        configuration,
        clock=clock,
        timeout_s=settings.api_timeout_s,
        watch_timeout_s=settings.watch_timeout_s,
    )
    return await run_service(
        name="binder",
        settings=settings,
        clock=clock,
        body=functools.partial(run_binder, config=config, connect=connect),
    )


SERVICE = ServiceCommand(
    name="binder",
    summary="watch pods and nodes, bind decided pods, explain Pending ones",
    description="The binder is Tessera's only Kubernetes client: it publishes pending and "
    "deleted pods and node facts to NATS, binds pods the placer decided (after the ambiguity "
    "gate), writes PodScheduled=False with the counted reasons for rejected ones, marks "
    "allocated pods, and elects one writing replica through a Lease.",
    settings=BinderSettings,
    main=main,
)
