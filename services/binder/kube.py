"""The cluster gateway over kubernetes-asyncio: the only module in Tessera that imports it.

Configuration: ``--kubeconfig`` when given; else the in-cluster service account when running in a
pod (``KUBERNETES_SERVICE_HOST``); else ``KUBECONFIG`` / ``~/.kube/config``. A missing or broken
configuration is a :class:`~shared.config.ConfigError` naming what was tried.

Every call runs with ``_preload_content=False``: responses are decoded with msgspec into the
binder's own object views (much faster than the client's model classes, and immune to the
client's ``ValueError`` on the Binding's ``Status`` answer), and HTTP failures come back as
status codes instead of exceptions. Every call has a timeout (``asyncio.timeout`` around it and
the client's request timeout under it); 408/429/5xx answers, timeouts and connection errors are
retried with capped, jittered exponential backoff, then raise ``ApiUnavailableError``.

Watches are read line by line from the raw response (not through ``kubernetes_asyncio.watch``,
which retries a 410 once with the same stale resourceVersion and builds model objects): the
informer gets bookmarks, a clean end of stream, and ``WatchExpiredError`` on 410 (as an HTTP
status or as an ERROR event).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import random
import urllib.parse
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import aiohttp
import msgspec
from kubernetes_asyncio import client, config

from services.binder.gateway import (
    Answer,
    ApiUnavailableError,
    Body,
    Kind,
    Listing,
    WatchEvent,
    WatchExpiredError,
)
from services.binder.metrics import BinderMetrics
from services.binder.rules.draobjects import (
    ClaimList,
    ResourceClaim,
    ResourceClaimTemplate,
    TemplateList,
)
from services.binder.rules.objects import (
    Bookmark,
    Lease,
    Namespace,
    NamespaceList,
    Node,
    NodeList,
    PodList,
    RawWatchEvent,
    Status,
)
from shared.clock import Clock
from shared.config import ConfigError
from shared.kubeobjects import Pod

log = logging.getLogger(__name__)

TRANSIENT_CODES: Final = frozenset({408, 429, 500, 502, 503, 504})
MERGE_PATCH: Final = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH: Final = "application/strategic-merge-patch+json"
FIELD_MANAGER: Final = "tessera-binder"
LIST_PAGE: Final = 500
"""Objects per list page (as client-go's informers page)."""


@dataclass(frozen=True)
class RetryPolicy:
    """Capped exponential backoff for transient failures."""

    attempts: int = 5
    initial_s: float = 0.2
    max_s: float = 5.0


def new_configuration() -> Any:
    """An empty client configuration to load into."""
    return client.Configuration()


async def load_configuration(
    configuration: Any, *, kubeconfig: str, environ: Mapping[str, str]
) -> str:
    """Fill ``configuration`` from the first source that applies; returns which it was. A proxy
    the environment names for the API server (``HTTPS_PROXY``, ``NO_PROXY``) is read here, once:
    the gateway's HTTP client does not read the environment on each request."""
    source = await _load(configuration, kubeconfig=kubeconfig, environ=environ)
    if not configuration.proxy:
        configuration.proxy = environment_proxy(configuration.host, environ) or None
    return source


def environment_proxy(url: str, environ: Mapping[str, str]) -> str:
    """The proxy ``environ`` names for requests to ``url`` (``<scheme>_proxy`` in lower or upper
    case, unless ``no_proxy`` covers the host), as aiohttp and client-go read it; "" for none."""
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme or "https"
    proxy = environ.get(f"{scheme}_proxy") or environ.get(f"{scheme.upper()}_PROXY") or ""
    no_proxy = environ.get("no_proxy") or environ.get("NO_PROXY") or ""
    host = (parts.hostname or "").lower()
    for entry in (e.strip().lower() for e in no_proxy.split(",")):
        name = entry.rsplit(":", 1)[0] if entry.count(":") == 1 else entry
        if entry == "*" or (
            name and (host == name.lstrip(".") or host.endswith("." + name.lstrip(".")))
        ):
            return ""
    return proxy


async def _load(configuration: Any, *, kubeconfig: str, environ: Mapping[str, str]) -> str:
    if kubeconfig and not _is_file(kubeconfig):
        raise ConfigError(f"cannot load Kubernetes configuration: no such file: {kubeconfig}")
    listed = [p for p in environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    if not kubeconfig and listed and not any(_is_file(p) for p in listed):
        raise ConfigError(
            "cannot load Kubernetes configuration: no file of KUBECONFIG exists: "
            + ", ".join(listed)
        )
    try:
        if kubeconfig:
            await config.load_kube_config(
                config_file=kubeconfig, client_configuration=configuration, persist_config=False
            )
            return f"kubeconfig {kubeconfig}"
        if environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            return "in-cluster service account"
        path = environ.get("KUBECONFIG") or _home_kubeconfig(environ)
        if not path:
            raise ConfigError(
                "no Kubernetes API to talk to: not running in a pod (KUBERNETES_SERVICE_HOST is "
                "unset), no --kubeconfig, no KUBECONFIG, and no ~/.kube/config"
            )
        await config.load_kube_config(
            config_file=path, client_configuration=configuration, persist_config=False
        )
        return f"kubeconfig {path}"
    except ConfigError:
        raise
    except Exception as error:  # YAML, I/O, missing keys: any failure is a config error
        source = kubeconfig or "the in-cluster service account / KUBECONFIG"
        raise ConfigError(f"cannot load Kubernetes configuration from {source}: {error}") from None


def _is_file(path: str) -> bool:
    return Path(path).expanduser().is_file()


def _home_kubeconfig(environ: Mapping[str, str]) -> str:
    """``~/.kube/config`` when it exists, else ""."""
    path = Path(environ.get("HOME", "~")).expanduser() / ".kube" / "config"
    return str(path) if path.exists() else ""


def _status(body: bytes) -> Status:
    try:
        return msgspec.json.decode(body, type=Status)
    except msgspec.DecodeError:
        return Status(message=body[:200].decode(errors="replace"))


def _answer(code: int, body: bytes) -> Answer:
    if 200 <= code < 300:
        return Answer(code=code)
    status = _status(body)
    return Answer(code=code, reason=status.reason, message=status.message)


class KubeGateway:
    """Implements ``gateway.ClusterGateway`` with kubernetes-asyncio."""

    def __init__(
        self,
        api: Any,
        *,
        clock: Clock,
        metrics: BinderMetrics | None = None,
        timeout_s: float = 10.0,
        watch_timeout_s: int = 300,
        retry: RetryPolicy = RetryPolicy(),
    ) -> None:
        self._api = api
        # Typed as Any: the client's stubs model neither ``_preload_content=False`` (which returns
        # the raw aiohttp response) nor ``_content_type``, both of which every call here uses.
        self._core: Any = client.CoreV1Api(api)
        self._events: Any = client.EventsV1Api(api)
        self._coordination: Any = client.CoordinationV1Api(api)
        self._resource: Any = client.ResourceV1Api(api)
        self._clock = clock
        self._metrics = metrics
        self._timeout_s = timeout_s
        self._watch_timeout_s = watch_timeout_s
        self._retry = retry

    @classmethod
    def create(
        cls,
        configuration: Any,
        metrics: BinderMetrics,
        *,
        clock: Clock,
        timeout_s: float = 10.0,
        watch_timeout_s: int = 300,
        retry: RetryPolicy = RetryPolicy(),
    ) -> KubeGateway:
        """A gateway over a loaded ``configuration`` (see :func:`load_configuration`)."""
        api = client.ApiClient(configuration)
        # kubernetes-asyncio makes its aiohttp session with trust_env=True, so every request read
        # the proxy variables and ~/.netrc again: 30-45 % of the binder's CPU per pod (issue 22).
        # load_configuration read the environment's proxy once; the client reads it no more.
        api.rest_client.pool_manager._trust_env = False
        return cls(
            api,
            clock=clock,
            metrics=metrics,
            timeout_s=timeout_s,
            watch_timeout_s=watch_timeout_s,
            retry=retry,
        )

    async def close(self) -> None:
        await self._api.close()

    # --- the request loop --------------------------------------------------------------------

    def _failed(self, verb: str, code: str) -> None:
        if self._metrics is not None:
            self._metrics.api_error(verb, code)

    async def _send(self, verb: str, call: Callable[[], Awaitable[Any]]) -> tuple[int, bytes]:
        """(status, body) of the call, retrying transient failures; then ApiUnavailableError."""
        delay = self._retry.initial_s
        for attempt in range(1, self._retry.attempts + 1):
            try:
                async with asyncio.timeout(self._timeout_s):
                    response = await call()
                    try:
                        body = await response.read()
                    finally:
                        response.release()
            except TimeoutError:
                self._failed(verb, "timeout")
                failure = f"no answer within {self._timeout_s:g} s"
            except (aiohttp.ClientError, OSError) as error:
                self._failed(verb, "connection")
                failure = f"{type(error).__name__}: {error}"
            else:
                if response.status not in TRANSIENT_CODES:
                    if response.status >= 400:
                        self._failed(verb, str(response.status))
                    return response.status, body
                self._failed(verb, str(response.status))
                status = _status(body)
                failure = f"HTTP {response.status} {status.reason}: {status.message}".strip()
            if attempt == self._retry.attempts:
                raise ApiUnavailableError(verb, f"{failure} (after {attempt} attempts)")
            log.info(
                "kubernetes API call failed; retrying",
                extra={"verb": verb, "error": failure, "attempt": attempt, "retry_s": delay},
            )
            await self._clock.sleep(delay * random.uniform(0.8, 1.2))
            delay = min(delay * 2, self._retry.max_s)
        raise AssertionError("unreachable")

    def _options(self) -> dict[str, Any]:
        return {"_preload_content": False, "_request_timeout": self._timeout_s}

    async def send(
        self, verb: str, call: Callable[[Any, dict[str, Any]], Awaitable[Any]]
    ) -> Answer:
        """``call(resource_api, options)`` on ``resource.k8s.io/v1`` as every call here is sent
        (``kubedra.py``'s calls), its answer with the body as ``message`` when it succeeded."""
        code, body = await self._send(verb, lambda: call(self._resource, self._options()))
        if 200 <= code < 300:
            return Answer(code=code, message=body.decode())
        return _answer(code, body)

    # --- list and watch ----------------------------------------------------------------------

    def _lister(self, kind: type[Kind]) -> tuple[str, Callable[..., Awaitable[Any]], type[Any]]:
        if kind is Pod:
            return "pods", self._core.list_pod_for_all_namespaces, PodList
        if kind is Node:
            return "nodes", self._core.list_node, NodeList
        if kind is Namespace:
            return "namespaces", self._core.list_namespace, NamespaceList
        if kind is ResourceClaim:
            return (
                "resourceclaims",
                self._resource.list_resource_claim_for_all_namespaces,
                ClaimList,
            )
        if kind is ResourceClaimTemplate:
            return (
                "resourceclaimtemplates",
                self._resource.list_resource_claim_template_for_all_namespaces,
                TemplateList,
            )
        raise TypeError(f"cannot list {kind.__name__}")

    async def list_objects(
        self, kind: type[Kind], *, field_selector: str = "", label_selector: str = ""
    ) -> Listing[Kind]:
        plural, function, list_type = self._lister(kind)
        items: list[Kind] = []
        token = ""
        while True:
            call = functools.partial(
                function,
                field_selector=field_selector,
                label_selector=label_selector,
                limit=LIST_PAGE,
                _continue=token or None,
                **self._options(),
            )
            code, body = await self._send(f"list {plural}", call)
            if code == 410 and token:  # the snapshot behind the continue token expired
                items, token = [], ""
                continue
            if code != 200:
                answer = _answer(code, body)
                raise ApiUnavailableError(
                    f"list {plural}", f"HTTP {code} {answer.reason}: {answer.message}"
                )
            try:
                page = msgspec.json.decode(body, type=list_type)
            except msgspec.DecodeError as error:
                raise ApiUnavailableError(f"list {plural}", f"undecodable list: {error}") from None
            items.extend(page.items or ())
            token = page.metadata.continue_ or ""
            if not token:
                return Listing(items=items, resource_version=page.metadata.resource_version)

    async def watch_objects(
        self,
        kind: type[Kind],
        *,
        resource_version: str,
        field_selector: str = "",
        label_selector: str = "",
    ) -> AsyncGenerator[WatchEvent[Kind], None]:
        plural, function, _ = self._lister(kind)
        verb = f"watch {plural}"
        read_timeout = aiohttp.ClientTimeout(
            sock_connect=self._timeout_s, sock_read=self._watch_timeout_s + self._timeout_s
        )
        try:
            async with asyncio.timeout(self._timeout_s):
                response = await function(
                    watch=True,
                    allow_watch_bookmarks=True,
                    resource_version=resource_version,
                    timeout_seconds=self._watch_timeout_s,
                    field_selector=field_selector,
                    label_selector=label_selector,
                    _preload_content=False,
                    _request_timeout=read_timeout,
                )
        except TimeoutError:
            self._failed(verb, "timeout")
            raise ApiUnavailableError(verb, f"no answer within {self._timeout_s:g} s") from None
        except (aiohttp.ClientError, OSError) as error:
            self._failed(verb, "connection")
            raise ApiUnavailableError(verb, f"{type(error).__name__}: {error}") from None
        try:
            if response.status != 200:
                body = await response.read()
                self._failed(verb, str(response.status))
                status = _status(body)
                if response.status == 410:
                    raise WatchExpiredError(status.message)
                raise ApiUnavailableError(
                    verb, f"HTTP {response.status} {status.reason}: {status.message}"
                )
            async for event in self._events_of(response, kind, verb):
                yield event
        finally:
            response.release()

    async def _events_of(
        self, response: Any, kind: type[Kind], verb: str
    ) -> AsyncIterator[WatchEvent[Kind]]:
        while True:
            try:
                line = await response.content.readline()
            except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as error:
                log.info("watch stream broke", extra={"verb": verb, "error": repr(error)})
                return
            if not line:
                return  # the server ended the stream (timeoutSeconds, or it went away)
            if not line.strip():
                continue
            try:
                raw = msgspec.json.decode(line, type=RawWatchEvent)
                if raw.type == "ERROR":
                    status = _status(raw.object)
                    if status.code == 410:
                        raise WatchExpiredError(status.message)
                    self._failed(verb, str(status.code))
                    raise ApiUnavailableError(
                        verb, f"watch error {status.code} {status.reason}: {status.message}"
                    )
                if raw.type == "BOOKMARK":
                    mark = msgspec.json.decode(raw.object, type=Bookmark)
                    yield WatchEvent("BOOKMARK", None, mark.metadata.resource_version)
                    continue
                obj = msgspec.json.decode(raw.object, type=kind)
            except msgspec.DecodeError as error:
                log.error(
                    "undecodable watch event; watching again",
                    extra={
                        "verb": verb,
                        "error": str(error),
                        "line": line[:300].decode(errors="replace"),
                    },
                )
                return
            yield WatchEvent(raw.type, obj, obj.metadata.resource_version)

    # --- pods --------------------------------------------------------------------------------

    async def read_pod(self, namespace: str, name: str) -> Pod | None:
        code, body = await self._send(
            "get pods", lambda: self._core.read_namespaced_pod(name, namespace, **self._options())
        )
        if code == 404:
            return None
        if code != 200:
            answer = _answer(code, body)
            raise ApiUnavailableError("get pods", f"HTTP {code} {answer.reason}: {answer.message}")
        return msgspec.json.decode(body, type=Pod)

    async def bind_pod(
        self, namespace: str, name: str, *, uid: str, node: str, annotations: dict[str, str]
    ) -> Answer:
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": uid,
                "annotations": annotations,
            },
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        return _answer(
            *await self._send(
                "create pods/binding",
                lambda: self._core.create_namespaced_pod_binding(
                    name, namespace, binding, field_manager=FIELD_MANAGER, **self._options()
                ),
            )
        )

    async def patch_pod(self, namespace: str, name: str, patch: Body) -> Answer:
        return _answer(
            *await self._send(
                "patch pods",
                lambda: self._core.patch_namespaced_pod(
                    name,
                    namespace,
                    patch,
                    field_manager=FIELD_MANAGER,
                    _content_type=MERGE_PATCH,
                    **self._options(),
                ),
            )
        )

    async def patch_pod_status(self, namespace: str, name: str, patch: Body) -> Answer:
        return _answer(
            *await self._send(
                "patch pods/status",
                lambda: self._core.patch_namespaced_pod_status(
                    name,
                    namespace,
                    patch,
                    field_manager=FIELD_MANAGER,
                    _content_type=STRATEGIC_MERGE_PATCH,
                    **self._options(),
                ),
            )
        )

    # --- events ------------------------------------------------------------------------------

    async def create_event(self, namespace: str, event: Body) -> Answer:
        return _answer(
            *await self._send(
                "create events",
                lambda: self._events.create_namespaced_event(
                    namespace, event, field_manager=FIELD_MANAGER, **self._options()
                ),
            )
        )

    async def patch_event(self, namespace: str, name: str, patch: Body) -> Answer:
        return _answer(
            *await self._send(
                "patch events",
                lambda: self._events.patch_namespaced_event(
                    name,
                    namespace,
                    patch,
                    field_manager=FIELD_MANAGER,
                    _content_type=MERGE_PATCH,
                    **self._options(),
                ),
            )
        )

    # --- leases ------------------------------------------------------------------------------

    async def read_lease(self, namespace: str, name: str) -> Lease | None:
        code, body = await self._send(
            "get leases",
            lambda: self._coordination.read_namespaced_lease(name, namespace, **self._options()),
        )
        if code == 404:
            return None
        if code != 200:
            answer = _answer(code, body)
            raise ApiUnavailableError(
                "get leases", f"HTTP {code} {answer.reason}: {answer.message}"
            )
        return msgspec.json.decode(body, type=Lease)

    async def create_lease(self, namespace: str, lease: Body) -> Answer:
        return _answer(
            *await self._send(
                "create leases",
                lambda: self._coordination.create_namespaced_lease(
                    namespace, lease, field_manager=FIELD_MANAGER, **self._options()
                ),
            )
        )

    async def replace_lease(self, namespace: str, name: str, lease: Body) -> Answer:
        return _answer(
            *await self._send(
                "update leases",
                lambda: self._coordination.replace_namespaced_lease(
                    name, namespace, lease, field_manager=FIELD_MANAGER, **self._options()
                ),
            )
        )
