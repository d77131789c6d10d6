"""Run a service: logging, HTTP health, the bus, the service body in one TaskGroup, clean stop.

``run_service`` is what every ``tessera <service>`` command calls after loading its settings::

    return await run_service(name="placer", settings=settings, body=placer_body)

Order of events: the NATS credentials and TLS files are read (a bad one is a configuration error);
logging is configured with every secret scrubbed; ``/healthz`` starts answering (``/readyz`` says
503 until the bus is up; a port already in use stops the service with one line naming
``--http-port``); the bus connects, retrying until it succeeds or a signal arrives; the body runs.
SIGTERM or SIGINT cancels the body, drains the bus (in-flight messages are finished, un-acked
JetStream messages return to the server for redelivery) and stops the HTTP server.

Exit codes: 0 after a signal; 1 when the body failed, the NATS client closed for good or the stop
got stuck past its deadline (every thread's stack is dumped to stderr first); 2 when
the HTTP port cannot be bound; :data:`EXIT_NATS_REFUSED` when the first connection was refused for
its credentials or TLS (retrying cannot help: fix the secret, the pod restarts).
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import io
import logging
import signal
import typing
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Final

from prometheus_client import CollectorRegistry

from shared import permissions
from shared.clock import Clock, SystemClock
from shared.config import (
    NatsSecurity,
    NodeSettings,
    Settings,
    nats_security,
    option,
    redact_url,
    url_secrets,
)
from shared.runtime.bus import (
    NODE_WATCH_HEARTBEAT_S,
    WATCH_HEARTBEAT_S,
    WRITE_COALESCE_S,
    Bus,
    ConnectionMonitor,
    ConnectionStatus,
)
from shared.runtime.command import EXIT_CONFIG_ERROR
from shared.runtime.edge import Edge
from shared.runtime.health import HealthServer, HttpRoutes, Readiness
from shared.runtime.logs import AGENT, Redactor, configure_logging
from shared.runtime.metrics import (
    EdgeMetrics,
    LoopLag,
    loop_lag_histogram,
    register_runtime_metrics,
)
from shared.runtime.nats import DEFAULT_INBOX_PREFIX, NatsBus, NatsRefusedError, unreachable_reason
from shared.runtime.tasks import TaskOwners, cancel_and_wait, owned_context

log = logging.getLogger(__name__)

EXIT_NATS_REFUSED: Final = 5
"""The first NATS connection was refused for its credentials or TLS."""

STOP_GRACE_S: Final = 10.0
"""After a stop, how long the body has to finish before its tasks' stacks are logged."""

STOP_DEADLINE_S: Final = 25.0
"""After a signal, the process exits within this however it is stuck (a body past its grace,
a hung drain, a blocked event loop), dumping every thread's stack first: below Kubernetes'
default 30 s grace, so the stack is in the pod's log rather than lost to a SIGKILL."""

Connect = Callable[[str, str], Coroutine[Any, Any, Bus]]
"""(url, client name) -> a connected Bus; raises OSError-like errors when it cannot, and
:class:`NatsRefusedError` when retrying cannot help."""


@dataclass(frozen=True)
class BusIdentity:
    """How a service connects to NATS: what its identity's permissions (``shared.permissions``)
    allow, and how often its watches hear from an idle server."""

    inbox_prefix: str = DEFAULT_INBOX_PREFIX
    update_topology: bool = True
    """Whether it may change an existing stream's or bucket's configuration."""
    create_epoch: bool = True
    """Whether it may give a new store its epoch (``shared.permissions.creates_store``)."""
    watch_heartbeat_s: float = WATCH_HEARTBEAT_S
    write_coalesce_s: float = 0.0
    """How long a write to the socket waits for the publishes after it (``shared.runtime.bus.
    WRITE_COALESCE_S``)."""


async def connect_nats(
    url: str,
    name: str,
    security: NatsSecurity | None = None,
    *,
    replicas: int = 1,
    identity: BusIdentity = BusIdentity(),
) -> Bus:
    """The real connector: NATS with JetStream streams and KV buckets ensured."""
    return await NatsBus.connect(
        url,
        name=name,
        security=security,
        replicas=replicas,
        inbox_prefix=identity.inbox_prefix,
        update_topology=identity.update_topology,
        create_epoch=identity.create_epoch,
        watch_heartbeat_s=identity.watch_heartbeat_s,
        write_coalesce_s=identity.write_coalesce_s,
    )


def bus_identity(name: str, settings: Settings) -> BusIdentity:
    """How service ``name`` connects (see :class:`BusIdentity`). Names that are not a Tessera
    role get nats-py's defaults; the per-node roles watch with a slower heartbeat
    (``shared.runtime.bus.NODE_WATCH_HEARTBEAT_S``) and write at once, the others gather their
    writes (``WRITE_COALESCE_S``)."""
    if not permissions.is_role(name):
        return BusIdentity()
    role = typing.cast(permissions.Role, name)
    node = None
    per_node = role in permissions.NODE_ROLES
    if per_node and isinstance(settings, NodeSettings) and settings.node:
        node = settings.node
    return BusIdentity(
        inbox_prefix=permissions.inbox_prefix(role, node),
        update_topology=permissions.may_update_topology(role),
        create_epoch=permissions.creates_store(role),
        watch_heartbeat_s=NODE_WATCH_HEARTBEAT_S if per_node else WATCH_HEARTBEAT_S,
        write_coalesce_s=0.0 if per_node else WRITE_COALESCE_S,
    )


@dataclass(frozen=True)
class Hosted:
    """One of several services a process hosts (``tessera.up.agents``): the host owns stopping
    and logging, and each hosted service's log lines carry its ``agent`` name."""

    stop: asyncio.Event
    agent: str
    loop_lag: LoopLag | None = None
    """The host's one sampler of the loop's lag, which every hosted service's histogram joins
    (None: each service samples the loop itself)."""


class BusClosedError(Exception):
    """The NATS client closed for good (the server refused it while connected)."""


@dataclass(frozen=True)
class ServiceContext:
    """What a service body gets: its ports and the shared machinery, all passed in."""

    name: str
    bus: Bus
    edge: Edge
    clock: Clock
    registry: CollectorRegistry
    readiness: Readiness
    http_port: int
    routes: HttpRoutes = field(default_factory=HttpRoutes)
    """Extra GET endpoints the body serves on ``http_port`` beside /healthz, /readyz, /metrics."""


Body = Callable[[ServiceContext], Coroutine[Any, Any, None]]


async def _connect_until_stopped(
    connect: Connect,
    url: str,
    name: str,
    stop: asyncio.Event,
    clock: Clock,
    readiness: Readiness,
) -> Bus | None:
    """The connected bus, or None when a stop came first. NatsRefusedError is not retried.

    Each failed attempt (one per back-off step) is logged with its cause (connection refused,
    DNS, timeout, network) and put in ``/readyz`` (the ``nats`` check of ``readiness``)."""
    delay = 0.5
    while not stop.is_set():
        attempt = asyncio.create_task(connect(url, name))
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait({attempt, stopped}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if not attempt.done():  # a stop arrived while connecting: give up the attempt
            await cancel_and_wait(attempt)
            return None
        try:
            return attempt.result()
        except NatsRefusedError:
            raise
        except Exception as error:  # any failure to reach the server is retried
            cause = unreachable_reason(error, url)
            readiness.set("nats", False, f"cannot reach NATS: {cause}; retrying in {delay:g} s")
            log.warning(
                f"cannot reach NATS: {cause}; retrying",
                extra={"url": redact_url(url), "cause": cause, "retry_s": delay},
            )
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay):
                await stop.wait()
        delay = min(delay * 2, 10.0)
    return None


async def run_service(
    *,
    name: str,
    settings: Settings,
    body: Body,
    clock: Clock | None = None,
    connect: Connect | None = None,
    stop: asyncio.Event | None = None,
    registry: CollectorRegistry | None = None,
    readiness: Readiness | None = None,
    routes: HttpRoutes | None = None,
    stop_grace_s: float = STOP_GRACE_S,
    stop_deadline_s: float = STOP_DEADLINE_S,
    hosted: Hosted | None = None,
) -> int:
    """Run ``body`` until it returns, fails, or a signal (or ``stop``) ends it; return exit code.

    After a stop the body has ``stop_grace_s`` to finish (then its tasks' stacks are logged);
    after a signal the process exits within ``stop_deadline_s`` whatever is stuck.

    ``stop``: given, the caller owns stopping (a test, a host running several services) and no
    signal handler is installed; absent, SIGTERM and SIGINT stop the service. ``hosted``: one
    of several services in this process (its stop and its log lines' agent name; the host
    configured the logs).

    ``routes``: GET endpoints served beside /healthz, /readyz and /metrics from the start, before
    NATS is reached (the body may add more through ``ServiceContext.routes``).

    Raises:
        ConfigError: a NATS credential or TLS file cannot be used (before anything starts).
    """
    security = nats_security(settings)
    redact = Redactor((*security.secrets, *url_secrets(settings.nats_url)))
    if hosted is None:
        configure_logging(
            service=name, level=settings.log_level, fmt=settings.log_format, redact=redact
        )
    else:
        AGENT.set(hosted.agent)
        stop = hosted.stop
    if connect is None:
        identity = bus_identity(name, settings)

        async def connect_securely(url: str, client_name: str) -> Bus:
            return await connect_nats(
                url,
                client_name,
                security,
                replicas=settings.nats_replicas,
                identity=identity,
            )

        connect = connect_securely
    clock = clock or SystemClock()
    handle_signals = stop is None
    stop = stop or asyncio.Event()
    registry = registry or CollectorRegistry()
    readiness = readiness or Readiness()
    readiness.set("nats", False, "connecting")
    bus: Bus | None = None

    def nats_status() -> ConnectionStatus | None:
        return bus.connection_status() if isinstance(bus, ConnectionMonitor) else None

    register_runtime_metrics(registry, nats_status)
    lag = loop_lag_histogram(registry)

    routes = routes or HttpRoutes()
    health = HealthServer(
        readiness=readiness, registry=registry, service=name, redact=redact, routes=routes
    )
    try:
        port = await health.start(settings.http_host, settings.http_port)
    except OSError as error:
        log.error(
            f"cannot serve /healthz, /readyz and /metrics on {settings.http_host}:"
            f"{settings.http_port} ({option('http_port')}): {error.strerror or error}"
        )
        await health.stop()
        return EXIT_CONFIG_ERROR
    readiness.http_port = port
    log.info(
        "service starting", extra={"http_port": port, "nats_url": redact_url(settings.nats_url)}
    )

    loop = asyncio.get_running_loop()
    # The host's sampler when it has one, else one of this service's own.
    sampler = hosted.loop_lag if hosted is not None else None
    lag_watch = None
    if sampler is None:
        sampler = LoopLag()
        lag_watch = asyncio.create_task(sampler.run(), name=f"{name}-loop-lag")
    sampler.add(lag)
    signals = (signal.SIGTERM, signal.SIGINT) if handle_signals else ()
    for signum in signals:
        loop.add_signal_handler(signum, _stop_on, signal.Signals(signum), stop, stop_deadline_s)
    failed = False
    try:
        try:
            bus = await _connect_until_stopped(
                connect, settings.nats_url, f"tessera-{name}", stop, clock, readiness
            )
        except NatsRefusedError as error:
            readiness.set("nats", False, str(error))
            log.error(
                f"NATS refused this service: {error}; check the --nats-* credential and TLS "
                "settings (exiting: retrying cannot help)"
            )
            return EXIT_NATS_REFUSED
        if bus is None:
            return 0
        readiness.probe("nats", _nats_probe(bus))
        # Not ready before the body has registered its own checks (its first step does): with
        # only the NATS check, /readyz said ready a moment before the device plugin had loaded
        # anything (a test's Allocate came in that moment).
        readiness.set("started", False, "starting the service")
        context = ServiceContext(
            name=name,
            bus=bus,
            edge=Edge(bus=bus, metrics=EdgeMetrics.create(registry), clock=clock, service=name),
            clock=clock,
            registry=registry,
            readiness=readiness,
            http_port=port,
            routes=routes,
        )
        failed = await _run_body(body, context, stop, stop_grace_s)
    finally:
        for signum in signals:
            loop.remove_signal_handler(signum)
        if bus is not None:
            await bus.drain()
        await health.stop()
        sampler.discard(lag)
        if lag_watch is not None:
            await cancel_and_wait(lag_watch)
        log.info("service stopped")
    return 1 if failed else 0


def _stop_on(signum: signal.Signals, stop: asyncio.Event, deadline_s: float) -> None:
    if not stop.is_set():
        log.info("stopping", extra={"signal": signum.name})
        # A C-level watchdog thread: it fires even when the event loop itself is blocked.
        faulthandler.dump_traceback_later(deadline_s, exit=True)
    stop.set()


def _nats_probe(bus: Bus) -> Callable[[], tuple[bool, str]]:
    if isinstance(bus, ConnectionMonitor):
        monitor = bus

        def monitored() -> tuple[bool, str]:
            status = monitor.connection_status()
            return status.connected, status.reason

        return monitored
    return lambda: (bus.connected, "" if bus.connected else "disconnected; reconnecting")


async def _fail_when_closed(monitor: ConnectionMonitor) -> None:
    reason = await monitor.wait_closed()
    raise BusClosedError(f"the NATS client closed for good: {reason}")


async def _run_body(
    body: Body, context: ServiceContext, stop: asyncio.Event, grace_s: float
) -> bool:
    """Run the body in a TaskGroup beside a stop watcher; True when the body failed."""
    failed = False
    owner = _BodyTasks(context.name)
    owners = TaskOwners.of(asyncio.get_running_loop())
    try:
        async with asyncio.TaskGroup() as group:
            work = group.create_task(
                body(context), name=f"{context.name}-body", context=owned_context(owner)
            )
            watchers = [
                group.create_task(
                    _cancel_when_stopped(work, stop, grace_s, lambda: owners.lost_cancels(owner)),
                    name=f"{context.name}-stop",
                )
            ]
            if isinstance(context.bus, ConnectionMonitor):
                watchers.append(
                    group.create_task(
                        _fail_when_closed(context.bus), name=f"{context.name}-nats-closed"
                    )
                )
            work.add_done_callback(lambda _: [watcher.cancel() for watcher in watchers])
            await asyncio.sleep(0)  # the body's first step runs (tasks start in order)
            context.readiness.set("started", True)
    except* BusClosedError as closed:  # not a bug: one line says why
        for reason in closed.exceptions:
            log.error(f"service stopping: {reason}")
        failed = True
    except* Exception as errors:
        for error in errors.exceptions:
            log.error("service failed", exc_info=error)
        failed = True
    return failed


class _BodyTasks:
    """The owner of every task a service's body creates (see ``shared.runtime.tasks``)."""

    def __init__(self, service: str) -> None:
        self.service = service

    def __repr__(self) -> str:
        return f"<tasks of {self.service}>"


class StopTimeoutError(Exception):
    """The body did not finish within the grace period after a stop was asked."""


async def _cancel_when_stopped(
    work: asyncio.Task[None],
    stop: asyncio.Event,
    grace_s: float,
    lost_cancels: Callable[[], list[asyncio.Task[Any]]],
) -> None:
    """Cancel ``work`` once ``stop`` is set, and keep cancelling until it has finished.

    One cancel is not always enough on Python 3.11: a library's internal ``asyncio.wait_for``
    that completes at the same moment swallows the cancellation, and the task runs on; a
    TaskGroup passes the body's cancel to its children once. So each step also cancels again
    every task of the body that was asked to stop but still runs (``lost_cancels``).
    """
    await stop.wait()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace_s
    while not work.done():
        if loop.time() > deadline:
            # Say where it is stuck now: the TaskGroup waits for the body before reporting.
            stacks = io.StringIO()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.print_stack(limit=8, file=stacks)
            message = f"service body still running {grace_s:.0f} s after stop"
            log.error(f"{message}; its tasks:\n{stacks.getvalue()}")
            raise StopTimeoutError(message)
        work.cancel()
        for task in lost_cancels():
            task.cancel()
        await asyncio.wait({work}, timeout=0.1)
