"""The API test double's HTTP front: the Kubernetes REST paths and verbs over aiohttp, mapped to
the operations of :class:`~tessera.devcluster.objects.ApiObjects`; list pages and tables, watch
streams with bookmarks, pods/log, injected faults, and the journal of writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import msgspec
from aiohttp import web

from tessera.devcluster import admission, discovery, protobuf, resources, schema
from tessera.devcluster.controls import Write
from tessera.devcluster.jsoncopy import clone
from tessera.devcluster.resources import POD, ApiError, Obj, ResourceType
from tessera.devcluster.selectors import (
    SelectorError,
    parse_field_selector,
    parse_label_selector,
    selector,
)
from tessera.devcluster.store import Closed

if TYPE_CHECKING:
    from tessera.devcluster.apiserver import ApiServer

_ENCODER: Final = msgspec.json.Encoder()
_TRUE: Final = frozenset({"true", "True", "1"})


@dataclass(frozen=True)
class Target:
    """What a request path names."""

    resource: ResourceType
    namespace: str
    name: str
    subresource: str

    @property
    def label(self) -> str:
        return (
            f"{self.resource.plural}/{self.subresource}"
            if self.subresource
            else self.resource.plural
        )


def _parse_path(path: str) -> Target | None:
    parts = [p for p in path.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        group, version, rest = "", "v1", parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    namespace = ""
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    if not rest or len(rest) > 3:
        return None
    resource = resources.find(group, version, rest[0])
    if resource is None or (namespace and not resource.namespaced):
        return None
    name = rest[1] if len(rest) > 1 else ""
    subresource = rest[2] if len(rest) > 2 else ""
    if subresource and subresource not in resource.subresources:
        return None
    return Target(resource, namespace, name, subresource)


def _status(code: int, status: str = "Success") -> Obj:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": status, "code": code}


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=_ENCODER.encode(body), status=status, content_type="application/json")


def _error(error: ApiError) -> web.Response:
    return _json(error.status(), error.code)


def _flag(value: str | None) -> bool:
    return value in _TRUE


_TOP_LEVEL: Final = frozenset(
    {"apiVersion", "kind", "metadata", "spec", "status"}
    | {"regarding", "related", "note", "reason", "type", "action", "eventTime", "series"}
    | {"reportingController", "reportingInstance", "deprecatedSource", "deprecatedCount"}
    | {"deprecatedFirstTimestamp", "deprecatedLastTimestamp", "involvedObject", "message"}
    | {"source", "firstTimestamp", "lastTimestamp", "count", "reportingComponent"}
    | {"data", "stringData", "binaryData", "immutable"}  # secrets and config maps
)


def _strict_top_level(body: Obj) -> None:
    """``fieldValidation=Strict`` (what ``kubectl create -f`` sends) for top-level fields."""
    unknown = sorted(set(body) - _TOP_LEVEL)
    if unknown:
        raise ApiError(
            400,
            "BadRequest",
            "strict decoding error: " + ", ".join(f'unknown field "{name}"' for name in unknown),
        )


def _without_directives(patch: Any) -> Any:
    """A strategic merge patch without its ``$patch``, ``$retainKeys``, ``$setElementOrder/``
    and ``$deleteFromPrimitiveList/`` directives: the fields it sets."""
    if isinstance(patch, dict):
        return {k: _without_directives(v) for k, v in patch.items() if not k.startswith("$")}
    if isinstance(patch, list):
        return [_without_directives(item) for item in patch]
    return patch


def _strict(resource: ResourceType, body: Any) -> None:
    """``fieldValidation=Strict``: a field the type does not have is a 400. Types with a schema
    are checked at every depth (a patch by the fields it sets), the others at the top level."""
    if not isinstance(body, dict):
        return
    if not resource.schema:
        _strict_top_level(body)
        return
    unknown = schema.decode(resource.kind, clone(_without_directives(body))).unknown
    if unknown:
        raise ApiError(
            400,
            "BadRequest",
            f'{resource.kind} in version "{resource.version}" cannot be handled as a '
            f"{resource.kind}: strict decoding error: "
            + ", ".join(f'unknown field "{field}"' for field in unknown),
        )


class RestFront:
    """Answers every HTTP request to an :class:`~tessera.devcluster.apiserver.ApiServer`."""

    def __init__(self, api: ApiServer) -> None:
        self.api = api

    async def handle(self, request: web.Request) -> web.StreamResponse:
        user = self.api.authenticate(request.headers.get("Authorization"))
        if user is None:
            return _error(ApiError(401, "Unauthorized", "Unauthorized"))
        document = discovery.discovery(request.path, request.host)
        if document is not None and request.method == "GET":
            return _json(document)
        target = _parse_path(request.path)
        if target is None:
            return _error(
                ApiError(404, "NotFound", "the server could not find the requested resource")
            )
        verb = self._verb(request, target)
        if verb is None:
            return _error(
                ApiError(
                    405, "MethodNotAllowed", f"{request.method} is not supported on {request.path}"
                )
            )
        self.api.requests[(verb, target.label)] += 1
        fault = self.api.faults.take(verb, target.label)
        if fault is not None:
            if fault.delay_s:
                await asyncio.sleep(fault.delay_s)
            if fault.reset:
                if request.transport is not None:
                    request.transport.abort()
                return web.Response(status=500)  # never sent: the connection is gone
            if fault.status:
                reason = {429: "TooManyRequests", 503: "ServiceUnavailable", 504: "Timeout"}.get(
                    fault.status, "InternalError"
                )
                return _error(ApiError(fault.status, reason, fault.message))
        try:
            if verb == "watch":
                return await self._watch(request, target)
            return await self._dispatch(request, target, verb, user.info())
        except ApiError as error:
            return _error(error)

    def _verb(self, request: web.Request, target: Target) -> str | None:
        method = request.method
        if method == "GET":
            if target.name:
                return "get"
            return "watch" if _flag(request.query.get("watch")) else "list"
        if method == "POST":
            if target.subresource == "binding" or (not target.name and not target.subresource):
                return "create"
            return None
        if not target.name:
            return None
        return {"PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(method)

    async def _body(self, request: web.Request) -> Any:
        raw = await request.read()
        if not raw:
            return None
        if request.content_type == protobuf.CONTENT_TYPE:
            try:
                return protobuf.decode(raw)
            except protobuf.ProtobufError as error:
                raise ApiError(415, "UnsupportedMediaType", str(error)) from None
        try:
            return json.loads(raw)
        except ValueError as error:
            raise ApiError(400, "BadRequest", f"the request body is not JSON: {error}") from None

    async def _dispatch(
        self, request: web.Request, target: Target, verb: str, user: Obj
    ) -> web.Response:
        resource, namespace, name = target.resource, target.namespace, target.name
        if verb == "get" and target.subresource == "log":
            return self._log(request, self.api.get(resource, namespace, name))
        if verb == "get":
            view = resource.to_view(self.api.get(resource, namespace, name))
            if discovery.wants_table(request.headers.get("Accept", "")):
                return _json(
                    discovery.table(
                        resource,
                        [view],
                        now=self.api.clock(),
                        resource_version=view["metadata"].get("resourceVersion", ""),
                        include_object=request.query.get("includeObject", "Metadata"),
                    )
                )
            return _json(view)
        if verb == "list":
            return self._list(request, target)
        content_type = request.content_type
        body = await self._body(request)
        code, result = 200, None
        warnings: list[str] = []
        admission.WARNINGS.set(warnings)  # this request's task only
        try:
            if verb == "create" and target.subresource == "binding":
                if not isinstance(body, dict):
                    raise ApiError(400, "BadRequest", "a Binding must be a JSON object")
                result = self.api.bind(namespace, name, body)
                code, answer = 201, _status(201)
            elif verb == "create":
                if not isinstance(body, dict):
                    raise ApiError(400, "BadRequest", "the object must be a JSON object")
                if request.query.get("fieldValidation") == "Strict":
                    _strict(resource, body)
                result = await self.api.create_admitted(
                    resource, resource.from_view(body), namespace, user=user
                )
                code, answer = 201, resource.to_view(result)
            elif verb == "update":
                if not isinstance(body, dict):
                    raise ApiError(400, "BadRequest", "the object must be a JSON object")
                if request.query.get("fieldValidation") == "Strict" and resource.schema:
                    _strict(resource, body)
                result = await self.api.update_admitted(
                    resource,
                    namespace,
                    name,
                    resource.from_view(body),
                    target.subresource,
                    user=user,
                )
                answer = resource.to_view(result)
            elif verb == "patch":
                strict = request.query.get("fieldValidation") == "Strict"
                if strict and resource.schema and not content_type.endswith("json-patch+json"):
                    _strict(resource, body)
                result = await self.api.patch_admitted(
                    resource, namespace, name, body, content_type, target.subresource, user=user
                )
                answer = resource.to_view(result)
            else:
                options = body if isinstance(body, dict) else {}
                preconditions = options.get("preconditions") or {}
                grace = request.query.get("gracePeriodSeconds", options.get("gracePeriodSeconds"))
                deleted = self.api.delete(
                    resource,
                    namespace,
                    name,
                    grace_period_s=None if grace is None else int(grace),
                    uid=preconditions.get("uid"),
                    resource_version=preconditions.get("resourceVersion"),
                )
                result = self.api.find(resource, namespace, name)
                # An object that stays (a pod given its grace period, one held by finalizers) is
                # answered with its new state, as the API server does.
                answer = (
                    resource.to_view(deleted)
                    if resource is POD or result is not None
                    else _status(200)
                )
        except ApiError as error:
            self.api.writes.append(
                Write(verb, target.label, namespace, name, content_type, body, error.code, None)
            )
            raise
        self.api.writes.append(
            Write(
                verb,
                target.label,
                namespace,
                name or (result or {}).get("metadata", {}).get("name", ""),
                content_type,
                body,
                code,
                result,
            )
        )
        response = _json(answer, code)
        for warning in warnings:  # RFC 7234's form, as the API server writes admission warnings
            text = warning.replace("\\", "\\\\").replace('"', '\\"')
            response.headers.add("Warning", f'299 - "{text}"')
        return response

    def _log(self, request: web.Request, pod: Obj) -> web.Response:
        """pods/log: one container's log as text (``container`` names it; a pod of one
        container needs none), as the kubelet answers through the API server."""
        names = [c.get("name", "") for c in (pod.get("spec") or {}).get("containers") or []]
        container = request.query.get("container") or ""
        if not container:
            if len(names) != 1:
                raise ApiError(
                    400,
                    "BadRequest",
                    f"a container name must be specified for pod {pod['metadata']['name']}, "
                    f"choose one of: [{' '.join(names)}]",
                )
            container = names[0]
        if container not in names:
            raise ApiError(
                400,
                "BadRequest",
                f"container {container} is not valid for pod {pod['metadata']['name']}",
            )
        if self.api.pod_logs is None:
            raise ApiError(404, "NotFound", "no kubelet serves logs for this pod")
        return web.Response(
            text=self.api.pod_logs(pod, container), content_type="text/plain", charset="utf-8"
        )

    def _match(self, request: web.Request, resource: ResourceType) -> Any:
        try:
            fields = parse_field_selector(
                request.query.get("fieldSelector", ""), resource.supported_fields()
            )
            labels = parse_label_selector(request.query.get("labelSelector", ""))
        except SelectorError as error:
            raise ApiError(400, "BadRequest", str(error)) from None
        return selector(fields, labels)

    def _list(self, request: web.Request, target: Target) -> web.Response:
        resource = target.resource
        limit_text = request.query.get("limit", "0")
        items, revision, token = self.api.store.list_page(
            resource,
            namespace=target.namespace,
            match=self._match(request, resource),
            limit=int(limit_text) if limit_text.isdigit() else 0,
            token=request.query.get("continue", ""),
        )
        views = []
        for item in items:
            view = dict(resource.to_view(item))
            view.pop("apiVersion", None)
            view.pop("kind", None)
            views.append(view)
        if discovery.wants_table(request.headers.get("Accept", "")):
            return _json(
                discovery.table(
                    resource,
                    views,
                    now=self.api.clock(),
                    resource_version=revision,
                    include_object=request.query.get("includeObject", "Metadata"),
                    continue_token=token,
                )
            )
        metadata: Obj = {"resourceVersion": revision}
        if token:
            metadata["continue"] = token
        return _json(
            {
                "kind": resource.list_kind,
                "apiVersion": resource.api_version,
                "metadata": metadata,
                "items": views,
            }
        )

    async def _watch(self, request: web.Request, target: Target) -> web.StreamResponse:
        resource = target.resource
        match = self._match(request, resource)
        since_text = request.query.get("resourceVersion", "")
        if since_text not in ("", "0") and not since_text.isdigit():
            raise ApiError(400, "BadRequest", f"invalid resource version {since_text!r}")
        bookmarks = _flag(request.query.get("allowWatchBookmarks"))
        timeout_text = request.query.get("timeoutSeconds", "")
        deadline = (
            asyncio.get_running_loop().time() + float(timeout_text)
            if timeout_text.isdigit()
            else None
        )
        response = web.StreamResponse(status=200)
        response.content_type = "application/json"
        response.enable_chunked_encoding()

        async def send(kind: str, obj: Obj) -> None:
            await response.write(_ENCODER.encode({"type": kind, "object": obj}) + b"\n")

        try:  # registered before the answer starts, so a client that has it misses nothing
            initial, watcher = self.api.store.watch(
                resource,
                namespace=target.namespace,
                match=match,
                since=None if since_text in ("", "0") else int(since_text),
            )
        except ApiError as error:  # too old: an ERROR event, as the watch cache answers
            await response.prepare(request)
            await send("ERROR", error.status())
            await response.write_eof()
            return response
        abrupt = False
        try:
            await response.prepare(request)
            for kind, obj in initial:
                await send(kind, resource.to_view(obj))
            loop = asyncio.get_running_loop()
            while True:
                wait = self.api.bookmark_interval_s if bookmarks else 3600.0
                if deadline is not None:
                    wait = min(wait, deadline - loop.time())
                    if wait <= 0:
                        break
                try:
                    async with asyncio.timeout(wait):
                        item = await watcher.queue.get()
                except TimeoutError:
                    if bookmarks and (deadline is None or loop.time() < deadline):
                        await send(
                            "BOOKMARK",
                            {
                                "kind": resource.kind,
                                "apiVersion": resource.api_version,
                                "metadata": {"resourceVersion": str(self.api.store.revision)},
                            },
                        )
                    continue
                if isinstance(item, Closed):
                    abrupt = item.abrupt
                    break
                seen = watcher.translate(item)
                if seen is not None:
                    await send(seen[0], resource.to_view(seen[1]))
        except (ConnectionResetError, asyncio.CancelledError):
            abrupt = True
        finally:
            self.api.store.stop_watch(watcher)
        if abrupt:
            if request.transport is not None:
                request.transport.abort()
            return response
        with contextlib.suppress(ConnectionResetError):
            await response.write_eof()
        return response
