"""The service runtime end to end: dead letters, health/readiness/metrics over HTTP, clean stops."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from shared import codec, subjects
from shared.config import Settings
from shared.messages.deadletter import DeadLetter
from shared.messages.pods import PodPending
from shared.runtime.bus import Bus, BusUnavailableError, Delivery
from shared.runtime.command import run_event_loop
from shared.runtime.edge import REASON_HEADER, Edge
from shared.runtime.health import Readiness
from shared.runtime.lifecycle import Body, Hosted, ServiceContext, run_service
from shared.runtime.metrics import EdgeMetrics, LoopLag
from shared.runtime.nats import NatsBus
from shared.runtime.tasks import cancel_and_wait, finish
from tests.harness.clock import FakeClock
from tests.harness.nats import NatsServer
from tests.shared.echo_service import ECHO_SUBJECT, echo_body

ROOT = Path(__file__).resolve().parents[2]


async def _collect(bus: NatsBus, subject: str) -> asyncio.Queue[Delivery]:
    queue: asyncio.Queue[Delivery] = asyncio.Queue()

    async def handler(delivery: Delivery) -> None:
        await queue.put(delivery)

    await bus.subscribe(subject, handler)
    return queue


@contextlib.asynccontextmanager
async def running_echo(
    nats_server: NatsServer, body: Body = echo_body
) -> AsyncIterator[tuple[int, asyncio.Event, Readiness]]:
    """Run the echo service (or ``body``) in this process, until ready; yields (http port, stop
    event, readiness)."""
    stop = asyncio.Event()
    readiness = Readiness()
    settings = Settings(
        nats_url=nats_server.url, http_host="127.0.0.1", http_port=0, log_format="text"
    )
    task = asyncio.create_task(
        run_service(name="echo", settings=settings, body=body, stop=stop, readiness=readiness)
    )
    try:
        for _ in range(200):
            if readiness.ready:
                break
            await asyncio.sleep(0.02)
        assert readiness.ready, readiness.report()
        port = _port_of(readiness)
        yield port, stop, readiness
    finally:
        stop.set()
        assert await asyncio.wait_for(task, timeout=10) == 0


def _port_of(readiness: Readiness) -> int:
    port = getattr(readiness, "http_port", None)
    assert isinstance(port, int)
    return port


async def test_malformed_message_is_dead_lettered_and_service_keeps_serving(
    nats_server: NatsServer, bus: NatsBus
) -> None:
    letters = await _collect(bus, subjects.deadletter("pods"))
    echoes = await _collect(bus, ECHO_SUBJECT)
    async with running_echo(nats_server) as (port, _, _):
        await bus.publish(subjects.PODS_PENDING, b'{"uid": 17, "namespace": "ml"}')
        letter_delivery = await asyncio.wait_for(letters.get(), timeout=5)
        letter = codec.decode(letter_delivery.data, DeadLetter)
        assert letter.family == "pods"
        assert letter.subject == subjects.PODS_PENDING
        assert letter.service == "echo"
        assert "Expected `str`, got `int` - at `$.uid`" in letter.reason
        assert letter.payload == '{"uid": 17, "namespace": "ml"}'
        assert letter_delivery.headers[REASON_HEADER] == letter.reason

        # Binary garbage is kept too, base64-encoded.
        await bus.publish(subjects.PODS_PENDING, b"\xff\xfe\x00")
        binary = codec.decode((await asyncio.wait_for(letters.get(), timeout=5)).data, DeadLetter)
        assert (binary.payload, binary.payload_encoding) == ("//4A", "base64")

        # The service is still alive, still serving, and still processing good input.
        good = PodPending(uid="uid-ok", namespace="ml", name="p", containers=())
        await bus.publish(subjects.PODS_PENDING, codec.encode(good))
        assert (await asyncio.wait_for(echoes.get(), timeout=5)).data == b"uid-ok"
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/healthz") as response:
                assert response.status == 200
            async with http.get(f"http://127.0.0.1:{port}/metrics") as response:
                metrics = await response.text()
        assert re.search(
            r'tessera_messages_rejected_total\{family="pods",kind="decode"\} 2\.0', metrics
        )
        assert re.search(r'tessera_deadletters_published_total\{family="pods"\} 2\.0', metrics)
        assert re.search(r'tessera_messages_received_total\{family="pods"\} 3\.0', metrics)


async def test_readiness_reports_failing_checks_with_reasons(nats_server: NatsServer) -> None:
    async with running_echo(nats_server) as (port, _, readiness):
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/readyz") as response:
                assert response.status == 200
                body = await response.json()
            assert body["ready"] is True
            assert body["checks"]["nats"] == {"ready": True, "reason": ""}

            readiness.set("reader", False, "NVML not initialised")
            async with http.get(f"http://127.0.0.1:{port}/readyz") as response:
                assert response.status == 503
                body = await response.json()
            assert body["checks"]["reader"] == {"ready": False, "reason": "NVML not initialised"}


async def test_not_ready_until_nats_is_reachable() -> None:
    """With no server, /healthz answers but /readyz says why it is not ready."""
    stop = asyncio.Event()
    readiness = Readiness()
    attempts = 0

    async def refuse(url: str, name: str) -> Bus:
        nonlocal attempts
        attempts += 1
        raise ConnectionRefusedError("connection refused")

    settings = Settings(http_host="127.0.0.1", http_port=0, log_format="text")
    task = asyncio.create_task(
        run_service(
            name="lonely",
            settings=settings,
            body=echo_body,
            stop=stop,
            readiness=readiness,
            connect=refuse,
        )
    )
    for _ in range(200):
        if getattr(readiness, "http_port", None) and attempts:
            break
        await asyncio.sleep(0.02)
    port = _port_of(readiness)
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{port}/healthz") as response:
            assert response.status == 200
        reason = await _nats_reason_once_tried(http, port)
    assert reason == (
        "cannot reach NATS: connection refused by 127.0.0.1:4222 (is nats-server running "
        "there?); retrying in 0.5 s"
    )
    stop.set()
    assert await asyncio.wait_for(task, timeout=10) == 0


async def _nats_reason_once_tried(http: aiohttp.ClientSession, port: int) -> str:
    """The ``nats`` check's reason on /readyz once it is no longer the initial "connecting"."""
    for _ in range(500):
        async with http.get(f"http://127.0.0.1:{port}/readyz") as response:
            assert response.status == 503
            reason = str((await response.json())["checks"]["nats"]["reason"])
        if reason != "connecting":
            return reason
        await asyncio.sleep(0.02)
    raise AssertionError("/readyz kept saying 'connecting'")


@pytest.mark.parametrize(
    ("url", "cause"),
    [
        pytest.param(
            "nats://127.0.0.1:{port}", "connection refused by 127.0.0.1:{port}", id="refused"
        ),
        pytest.param(
            "nats://tessera-no-such-host.invalid:4222",
            "DNS cannot resolve 'tessera-no-such-host.invalid'",
            id="dns",
        ),
        # A cluster's servers, none up (a comma-separated URL once crashed the retry loop).
        pytest.param(
            "nats://127.0.0.1:{port},nats://127.0.0.1:{port}",
            "connection refused by 127.0.0.1:{port}, 127.0.0.1:{port}",
            id="cluster",
        ),
    ],
)
async def test_an_unreachable_nats_is_logged_and_shown_with_its_cause(
    url: str, cause: str, capfd: pytest.CaptureFixture[str]
) -> None:
    """The real connector: the cause of each failed attempt is logged (once per back-off step)
    and is what /readyz says, instead of a silent "connecting"."""
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    url, cause = url.format(port=closed), cause.format(port=closed)
    stop = asyncio.Event()
    readiness = Readiness()
    settings = Settings(nats_url=url, http_host="127.0.0.1", http_port=0, log_format="json")
    task = asyncio.create_task(
        run_service(
            name="lonely", settings=settings, body=echo_body, stop=stop, readiness=readiness
        )
    )
    for _ in range(200):
        if getattr(readiness, "http_port", None):
            break
        await asyncio.sleep(0.02)
    async with aiohttp.ClientSession() as http:
        reason = await _nats_reason_once_tried(http, _port_of(readiness))
    assert reason.startswith(f"cannot reach NATS: {cause}"), reason
    assert reason.endswith("; retrying in 0.5 s")
    stop.set()
    assert await asyncio.wait_for(task, timeout=10) == 0
    logged = [
        json.loads(line) for line in capfd.readouterr().err.splitlines() if line.startswith("{")
    ]
    warnings = [entry for entry in logged if entry.get("cause", "").startswith(cause)]
    assert warnings, logged
    assert warnings[0]["msg"].startswith(f"cannot reach NATS: {cause}")
    assert warnings[0]["retry_s"] == 0.5


async def test_failing_body_exits_non_zero(nats_server: NatsServer) -> None:
    async def broken(_: object) -> None:
        raise RuntimeError("bug")

    settings = Settings(
        nats_url=nats_server.url, http_host="127.0.0.1", http_port=0, log_format="text"
    )
    assert (
        await asyncio.wait_for(
            run_service(name="broken", settings=settings, body=broken, stop=asyncio.Event()),
            timeout=10,
        )
        == 1
    )


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_signal_stops_a_real_service_process_cleanly(
    nats_server: NatsServer, bus: NatsBus, signum: signal.Signals
) -> None:
    echoes = await _collect(bus, ECHO_SUBJECT)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.shared.echo_service",
        "--nats-url",
        nats_server.url,
        cwd=ROOT,
        stderr=subprocess.PIPE,
    )
    try:
        # Wait until it processes a message: then it is fully up.
        good = codec.encode(PodPending(uid="u1", namespace="n", name="p", containers=()))
        for _ in range(100):
            await bus.publish(subjects.PODS_PENDING, good)
            try:
                await asyncio.wait_for(echoes.get(), timeout=0.2)
                break
            except TimeoutError:
                continue
        process.send_signal(signum)
        assert await asyncio.wait_for(process.wait(), timeout=10) == 0
        assert process.stderr is not None
        log = (await process.stderr.read()).decode()
        assert "service stopped" in log
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


@pytest.mark.parametrize(
    ("stuck", "said"),
    [
        # The body swallows every cancel: past its grace its tasks' stacks are logged.
        ("ignoring", ["service body still running 1 s after stop", "stuck_on_stop_body"]),
        # The body blocks the event loop: only the watchdog thread can say where.
        ("blocking", ["Timeout (0:00:02)!", "stuck_on_stop_body"]),
    ],
)
async def test_a_stop_stuck_past_its_deadline_exits_saying_where_it_was_stuck(
    nats_server: NatsServer, stuck: str, said: list[str]
) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.shared.echo_service",
        "--nats-url",
        nats_server.url,
        "--stuck-on-stop",
        stuck,
        cwd=ROOT,
        stderr=subprocess.PIPE,
    )
    try:
        assert process.stderr is not None
        while b"stuck body running" not in await process.stderr.readline():
            pass
        process.send_signal(signal.SIGTERM)
        # Not the 25 s default: this process was given a 2 s deadline.
        assert await asyncio.wait_for(process.wait(), timeout=15) == 1
        log = (await process.stderr.read()).decode()
        for text in said:
            assert text in log, log
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_stop_is_not_lost_when_the_body_swallows_a_cancellation(
    nats_server: NatsServer,
) -> None:
    """A library may swallow one CancelledError (nats-py's wait_for on 3.11); stop still wins."""
    swallowed = 0

    async def stubborn(_: object) -> None:
        nonlocal swallowed
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                swallowed += 1
                if swallowed == 1:
                    continue  # the first cancellation is lost, as in the library bug
                raise

    stop = asyncio.Event()
    settings = Settings(
        nats_url=nats_server.url, http_host="127.0.0.1", http_port=0, log_format="text"
    )
    readiness = Readiness()
    task = asyncio.create_task(
        run_service(
            name="stubborn", settings=settings, body=stubborn, stop=stop, readiness=readiness
        )
    )
    for _ in range(200):
        if readiness.ready:
            break
        await asyncio.sleep(0.02)
    stop.set()
    assert await asyncio.wait_for(task, timeout=5) == 0
    assert swallowed == 2


async def test_stop_reaches_a_child_task_that_lost_its_cancel(nats_server: NatsServer) -> None:
    """A TaskGroup passes the body's cancel to each child once; a child that loses it inside a
    library (nats-py's ``next_msg`` on 3.11) must still be stopped: the placer's stuck stop."""
    losses = 0
    child_stopped = asyncio.Event()

    async def loses_one_cancel() -> None:
        nonlocal losses
        try:
            while True:
                try:
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:
                    losses += 1
                    if losses == 1:
                        continue  # lost, as in wait_for: the task runs on, still "cancelling"
                    raise
        finally:
            child_stopped.set()

    async def body(context: ServiceContext) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(loses_one_cancel())
            group.create_task(asyncio.Event().wait())

    async with running_echo(nats_server, body):
        pass  # running_echo stops it and asserts a clean exit within 10 s
    assert child_stopped.is_set()
    assert losses == 2


async def test_a_cleanup_run_by_finish_ends_before_its_caller_returns(
    nats_server: NatsServer,
) -> None:
    """The binder's stop closed its HTTP client while the shielded Lease release still ran."""
    steps: list[str] = []

    async def cleanup() -> None:
        steps.append("cleanup started")
        await asyncio.sleep(0.5)  # several of the lifecycle's 0.1 s re-cancels land meanwhile
        steps.append("cleanup done")

    async def body(context: ServiceContext) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            try:
                await finish(cleanup())
            finally:
                steps.append("client closed")

    async with running_echo(nats_server, body):
        pass
    assert steps == ["cleanup started", "cleanup done", "client closed"]


async def test_a_service_stopped_by_its_host_leaves_sigterm_to_the_host(
    nats_server: NatsServer,
) -> None:
    """A test (or any host) passing its own stop keeps its SIGTERM handling: an in-process
    service once took SIGTERM over, and a hung test run could not be stopped with it."""
    before = signal.getsignal(signal.SIGTERM)
    async with running_echo(nats_server):
        assert signal.getsignal(signal.SIGTERM) == before
    assert signal.getsignal(signal.SIGTERM) == before


async def test_stop_interrupts_a_connect_that_hangs() -> None:
    stop = asyncio.Event()
    readiness = Readiness()
    connecting = asyncio.Event()

    async def hang(url: str, name: str) -> Bus:
        connecting.set()
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    settings = Settings(http_host="127.0.0.1", http_port=0, log_format="text")
    task = asyncio.create_task(
        run_service(
            name="hung",
            settings=settings,
            body=echo_body,
            stop=stop,
            readiness=readiness,
            connect=hang,
        )
    )
    await asyncio.wait_for(connecting.wait(), timeout=5)
    stop.set()
    assert await asyncio.wait_for(task, timeout=5) == 0


class _DownBus:
    """A bus whose every publish fails as while NATS is down (only publish is used by reject)."""

    async def publish(self, subject: str, data: bytes, **_: object) -> None:
        raise BusUnavailableError("not connected to NATS; nothing was sent")


async def test_a_dead_letter_that_cannot_be_published_is_counted_never_raised() -> None:
    registry = CollectorRegistry()
    edge = Edge(
        bus=_DownBus(),  # type: ignore[arg-type]
        metrics=EdgeMetrics.create(registry),
        clock=FakeClock(),
        service="test",
    )
    await edge.reject(
        Delivery(subject=subjects.PODS_PENDING, data=b"garbage"),
        family="pods",
        reason="bad",
        kind="decode",
    )
    sample = registry.get_sample_value
    assert sample("tessera_deadletters_failed_total", {"family": "pods"}) == 1
    assert sample("tessera_messages_rejected_total", {"family": "pods", "kind": "decode"}) == 1
    assert sample("tessera_deadletters_published_total", {"family": "pods"}) is None


async def test_metrics_show_the_nats_connection_and_the_process(nats_server: NatsServer) -> None:
    async with running_echo(nats_server) as (port, _, _):
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/metrics") as response:
                metrics = await response.text()
    for line in (
        "tessera_nats_connected 1.0",
        'tessera_nats_connection_state{state="connected"} 1.0',
        'tessera_nats_connection_state{state="reconnecting"} 0.0',
        "tessera_nats_disconnects_total 0.0",
        "tessera_nats_authorization_failures_total 0.0",
    ):
        assert line in metrics
    for family in ("process_resident_memory_bytes", "process_cpu_seconds_total", "python_info"):
        assert re.search(rf"^{family}(\{{.*\}})? \S+$", metrics, re.MULTILINE), family


async def loop_lag_buckets(http: aiohttp.ClientSession, port: int) -> dict[str, float]:
    """The ``tessera_event_loop_lag_seconds`` buckets a service's /metrics shows."""
    async with http.get(f"http://127.0.0.1:{port}/metrics") as response:
        metrics = await response.text()
    return {
        match.group(1): float(match.group(2))
        for match in re.finditer(
            r'^tessera_event_loop_lag_seconds_bucket\{le="([^"]+)"\} (\S+)$', metrics, re.MULTILINE
        )
    }


def stopped_seen(samples: dict[str, float]) -> bool:
    """Whether a sample later than 0.25 s is among ``samples`` (the tests stop the loop 0.6 s)."""
    return samples.get("+Inf", 0.0) - samples.get("0.25", 0.0) >= 1


async def test_a_stopped_event_loop_shows_in_the_loop_lag_metric(nats_server: NatsServer) -> None:
    """A full garbage collection or a long computation stops everything a service does; the
    loop-lag histogram is where an operator sees it (a placer's collections once set its p99)."""

    async def blocking(context: ServiceContext) -> None:
        await asyncio.sleep(0.3)  # a sample or more taken while the loop runs freely
        time.sleep(0.6)  # noqa: ASYNC251 (the loop stopped on purpose: what is measured)
        await asyncio.Event().wait()

    async with running_echo(nats_server, blocking) as (port, _, _):
        async with aiohttp.ClientSession() as http:
            for _ in range(100):
                samples = await loop_lag_buckets(http, port)
                if stopped_seen(samples):
                    break
                await asyncio.sleep(0.1)
    assert stopped_seen(samples), f"the 0.6 s stop was not seen: {samples}"
    assert samples["0.25"] >= 1, "the samples of a free loop are there too"


async def test_services_one_process_hosts_share_one_loop_lag_sampler(
    nats_server: NatsServer,
) -> None:
    """``tessera.up.agents`` runs many services on one loop: the host's one sampler observes
    into each service's histogram, and no service starts a sampler of its own."""
    stop = asyncio.Event()
    sampler = LoopLag()
    readiness = [Readiness(), Readiness()]
    settings = Settings(
        nats_url=nats_server.url, http_host="127.0.0.1", http_port=0, log_format="text"
    )

    async def body(context: ServiceContext) -> None:
        context.readiness.set("loaded", True)
        await asyncio.Event().wait()

    runs = [
        asyncio.create_task(
            run_service(
                name="echo",
                settings=settings,
                body=body,
                readiness=ready,
                hosted=Hosted(stop=stop, agent=f"echo/{n}", loop_lag=sampler),
            )
        )
        for n, ready in enumerate(readiness)
    ]
    sampling = asyncio.create_task(sampler.run(), name="host-loop-lag")
    try:
        for _ in range(200):
            if all(ready.ready for ready in readiness):
                break
            await asyncio.sleep(0.02)
        assert all(ready.ready for ready in readiness)
        samplers = [t.get_name() for t in asyncio.all_tasks() if t.get_name().endswith("lag")]
        assert samplers == ["host-loop-lag"]
        await asyncio.sleep(0.3)
        time.sleep(0.6)  # noqa: ASYNC251 (the loop stopped on purpose: what is measured)
        async with aiohttp.ClientSession() as http:
            for _ in range(100):
                seen = [await loop_lag_buckets(http, _port_of(ready)) for ready in readiness]
                if all(stopped_seen(samples) for samples in seen):
                    break
                await asyncio.sleep(0.1)
        assert all(stopped_seen(samples) for samples in seen), seen
    finally:
        stop.set()
        assert await asyncio.wait_for(asyncio.gather(*runs), timeout=10) == [0, 0]
        await cancel_and_wait(sampling)


async def test_not_ready_before_the_body_has_registered_its_own_checks(
    nats_server: NatsServer,
) -> None:
    # Regression: /readyz said ready between the NATS connection and the body's first step
    # (only the NATS check existed yet); a device plugin test's Allocate came in that moment.
    seen_at_start: list[bool] = []

    async def body(context: ServiceContext) -> None:
        seen_at_start.append(context.readiness.ready)
        context.readiness.set("loaded", True)
        await asyncio.Event().wait()  # until the stop cancels it

    async with running_echo(nats_server, body) as (_, _, readiness):
        assert readiness.report()["loaded"] == (True, "")
    assert seen_at_start == [False]


@pytest.mark.parametrize(
    ("environ", "loop_module"),
    [
        pytest.param({}, "uvloop", id="default"),
        pytest.param({"TESSERA_EVENT_LOOP": "uvloop"}, "uvloop", id="uvloop"),
        pytest.param({"TESSERA_EVENT_LOOP": "asyncio"}, "asyncio", id="asyncio"),
    ],
)
def test_services_run_on_uvloop_unless_told_otherwise(
    environ: dict[str, str], loop_module: str
) -> None:
    async def which_loop() -> str:
        return type(asyncio.get_running_loop()).__module__.split(".")[0]

    assert run_event_loop(which_loop(), environ=environ) == loop_module
