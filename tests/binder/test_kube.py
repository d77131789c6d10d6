"""The kubernetes-asyncio gateway against the API test double: configuration, paging,
retries of transient failures, answers as data, and watches."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from services.binder.gateway import ApiUnavailableError, WatchExpiredError
from services.binder.kube import (
    KubeGateway,
    RetryPolicy,
    environment_proxy,
    load_configuration,
    new_configuration,
)
from services.binder.metrics import BinderMetrics
from services.binder.rules.objects import Node
from shared.clock import SystemClock
from shared.config import ConfigError
from shared.kubeobjects import Pod
from tessera.devcluster.apiserver import ApiServer
from tessera.devcluster.resources import NODE, POD
from tests.binder.builders import node, pod


@contextlib.asynccontextmanager
async def gateway_for(
    kubeconfig: Path, *, timeout_s: float = 5.0, attempts: int = 3
) -> AsyncIterator[tuple[KubeGateway, BinderMetrics]]:
    configuration = new_configuration()
    await load_configuration(configuration, kubeconfig=str(kubeconfig), environ={})
    metrics = BinderMetrics.create(CollectorRegistry())
    gateway = KubeGateway.create(
        configuration,
        metrics,
        clock=SystemClock(),
        timeout_s=timeout_s,
        watch_timeout_s=2,
        retry=RetryPolicy(attempts=attempts, initial_s=0.02, max_s=0.1),
    )
    try:
        yield gateway, metrics
    finally:
        await gateway.close()


def errors(metrics: BinderMetrics, verb: str, code: str) -> float:
    return float(metrics.api_errors.labels(verb=verb, code=code)._value.get())


async def test_configuration_sources_and_their_errors(tmp_path: Path, kubeconfig: Path) -> None:
    configuration = new_configuration()
    assert await load_configuration(configuration, kubeconfig=str(kubeconfig), environ={}) == (
        f"kubeconfig {kubeconfig}"
    )
    assert (
        await load_configuration(
            new_configuration(), kubeconfig="", environ={"KUBECONFIG": str(kubeconfig)}
        )
        == f"kubeconfig {kubeconfig}"
    )
    with pytest.raises(ConfigError, match="no Kubernetes API to talk to"):
        await load_configuration(
            new_configuration(), kubeconfig="", environ={"HOME": str(tmp_path)}
        )
    broken = tmp_path / "broken"
    broken.write_text("clusters: [")
    with pytest.raises(ConfigError, match=f"cannot load Kubernetes configuration from {broken}"):
        await load_configuration(new_configuration(), kubeconfig=str(broken), environ={})
    with pytest.raises(ConfigError, match="cannot load Kubernetes configuration"):
        await load_configuration(
            new_configuration(),
            kubeconfig="",
            environ={"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"},
        )


async def test_lists_every_page(api: ApiServer, kubeconfig: Path) -> None:
    for i in range(520):
        api.create(POD, pod(f"p{i:03d}", node="gpu-1" if i % 2 else None))
    async with gateway_for(kubeconfig) as (gateway, _):
        listing = await gateway.list_objects(Pod)
        bound = await gateway.list_objects(Pod, field_selector="spec.nodeName!=")
    assert len(listing.items) == 520 and len(bound.items) == 260
    assert listing.resource_version == str(api.store.revision)
    assert api.requests[("list", "pods")] == 3, "two pages of 500, then one"


async def test_transient_failures_are_retried_and_counted(api: ApiServer, kubeconfig: Path) -> None:
    api.create(NODE, node("n1"))
    api.faults.add(verb="list", resource="nodes", status=503, times=2)
    async with gateway_for(kubeconfig) as (gateway, metrics):
        listing = await gateway.list_objects(Node)
        assert [n.metadata.name for n in listing.items] == ["n1"]
        assert errors(metrics, "list nodes", "503") == 2
        api.faults.add(verb="list", resource="nodes", status=500, times=None)
        with pytest.raises(
            ApiUnavailableError,
            match="HTTP 500 InternalError: injected fault "
            r"\(after 3 attempts\)",
        ):
            await gateway.list_objects(Node)


async def test_a_call_that_hangs_times_out_and_is_retried(api: ApiServer, kubeconfig: Path) -> None:
    api.create(POD, pod("p"))
    # The hung call outlasts the client's timeout by far, and the timeout leaves a loaded
    # machine ample time for the answers that do not hang (0.3 s timed out a retry too).
    api.faults.add(verb="get", resource="pods", status=0, delay_s=6.0, times=1)
    async with gateway_for(kubeconfig, timeout_s=1.5) as (gateway, metrics):
        found = await gateway.read_pod("default", "p")
        assert found is not None and found.metadata.name == "p"
        assert errors(metrics, "get pods", "timeout") == 1
        assert await gateway.read_pod("default", "absent") is None


async def test_binding_answers_are_data(api: ApiServer, kubeconfig: Path) -> None:
    uid = api.create(POD, pod("p"))["metadata"]["uid"]
    async with gateway_for(kubeconfig) as (gateway, metrics):
        first = await gateway.bind_pod(
            "default", "p", uid=uid, node="gpu-1", annotations={"a": "b"}
        )
        again = await gateway.bind_pod("default", "p", uid=uid, node="gpu-1", annotations={})
        missing = await gateway.bind_pod("default", "q", uid="x", node="gpu-1", annotations={})
    assert (first.ok, first.code) == (True, 201)
    assert (again.code, again.reason) == (409, "Conflict")
    assert 'already assigned to node "gpu-1"' in again.message
    assert missing.code == 404
    assert errors(metrics, "create pods/binding", "409") == 1
    assert api.get(POD, "default", "p")["metadata"]["annotations"] == {"a": "b"}


async def test_watch_yields_changes_and_bookmarks_and_expires_on_410(
    api: ApiServer, kubeconfig: Path
) -> None:
    async with gateway_for(kubeconfig) as (gateway, _):
        start = (await gateway.list_objects(Pod)).resource_version
        api.create(POD, pod("p"))
        seen = []
        async with contextlib.aclosing(
            gateway.watch_objects(Pod, resource_version=start)
        ) as stream:
            async for event in stream:
                seen.append(event.type)
                if event.type == "BOOKMARK":
                    assert event.resource_version == str(api.store.revision)
                    break
        assert seen[0] == "ADDED"
        api.compact()
        expired = gateway.watch_objects(Pod, resource_version=start)
        with pytest.raises(WatchExpiredError, match="too old resource version"):
            await anext(expired)
        await expired.aclose()


async def test_a_dropped_watch_just_ends(api: ApiServer, kubeconfig: Path) -> None:
    async with gateway_for(kubeconfig) as (gateway, _):
        for abrupt in (False, True):
            stream = gateway.watch_objects(Node, resource_version=str(api.store.revision))
            async with contextlib.aclosing(stream):
                api.create(NODE, node(f"n-{int(abrupt)}"))
                first = await anext(stream)
                assert first.type == "ADDED"
                api.drop_watches(NODE, abrupt=abrupt)
                assert [e async for e in stream if e.type != "BOOKMARK"] == []


P = "http://p:3128"


@pytest.mark.parametrize(
    ("url", "environ", "proxy"),
    [
        pytest.param("https://10.0.0.1:443", {}, "", id="none"),
        pytest.param("https://10.0.0.1:443", {"HTTPS_PROXY": P}, P, id="upper"),
        pytest.param("https://10.0.0.1", {"https_proxy": P}, P, id="lower"),
        pytest.param("http://api.local:8080", {"HTTPS_PROXY": P}, "", id="other-scheme"),
        pytest.param("http://api.local:8080", {"HTTP_PROXY": P}, P, id="http"),
        pytest.param(
            "https://k.default.svc",
            {"HTTPS_PROXY": P, "NO_PROXY": ".svc,10.0.0.0"},
            "",
            id="no-proxy-suffix",
        ),
        pytest.param(
            "https://10.0.0.1:6443",
            {"HTTPS_PROXY": P, "NO_PROXY": "10.0.0.1:6443"},
            "",
            id="no-proxy-port",
        ),
        pytest.param(
            "https://10.0.0.1", {"HTTPS_PROXY": P, "no_proxy": "*"}, "", id="no-proxy-all"
        ),
        pytest.param(
            "https://k.example", {"HTTPS_PROXY": P, "NO_PROXY": ".svc"}, P, id="no-proxy-other"
        ),
    ],
)
def test_the_environments_proxy_for_the_api_server(
    url: str, environ: dict[str, str], proxy: str
) -> None:
    assert environment_proxy(url, environ) == proxy


@contextlib.asynccontextmanager
async def forwarding_proxy() -> AsyncIterator[tuple[str, list[str]]]:
    """A plain HTTP proxy on loopback: forwards each request and records its URL."""
    seen: list[str] = []

    async def forward(request: web.Request) -> web.StreamResponse:
        seen.append(str(request.url))
        async with aiohttp.ClientSession(trust_env=False) as http:
            async with http.request(
                request.method, request.url, headers=request.headers, data=await request.read()
            ) as answer:
                return web.Response(
                    status=answer.status,
                    body=await answer.read(),
                    content_type=answer.content_type,
                )

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forward)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("bypassed", [False, True], ids=["proxied", "no-proxy"])
async def test_a_proxy_the_environment_names_is_read_once_and_used(
    api: ApiServer, kubeconfig: Path, bypassed: bool
) -> None:
    """The HTTP client no longer reads the environment on each request (kubernetes-asyncio's
    trust_env cost the binder a third of its CPU per pod); the proxy it names is read with
    the configuration, and used."""
    api.create(NODE, node("n-1"))
    async with forwarding_proxy() as (proxy_url, seen):
        environ = {"HTTP_PROXY": proxy_url} | ({"NO_PROXY": "127.0.0.1"} if bypassed else {})
        configuration = new_configuration()
        await load_configuration(configuration, kubeconfig=str(kubeconfig), environ=environ)
        assert configuration.proxy == (None if bypassed else proxy_url)
        gateway = KubeGateway.create(
            configuration, BinderMetrics.create(CollectorRegistry()), clock=SystemClock()
        )
        try:
            listed = await gateway.list_objects(Node)
        finally:
            await gateway.close()
    assert [n.metadata.name for n in listed.items] == ["n-1"]
    assert bool(seen) is not bypassed, seen
