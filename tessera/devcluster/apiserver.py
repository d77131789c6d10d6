"""A Kubernetes API test double over aiohttp, faithful for every endpoint Tessera uses.

Real clients (kubernetes-asyncio in the binder, later kubectl) talk to it over HTTP exactly as to
a kube-apiserver: ``async with ApiServer() as api:`` listens on a free loopback port, ``api.url``
is the server, :meth:`ApiServer.write_kubeconfig` writes a kubeconfig with a bearer token for it.

What it serves (``resources.RESOURCES``): pods (with ``/status`` and ``/binding``), nodes (with
``/status``), namespaces (created implicitly by the first object in them), coordination.k8s.io/v1
leases, events.k8s.io/v1 events and the core v1 view of the same events, and
admissionregistration.k8s.io/v1 mutating and validating webhook configurations, whose webhooks a
create over HTTP calls as the API server does (``admission.py``). For each:

- get, list (``fieldSelector``, ``labelSelector``, ``limit``/``continue`` pages from one snapshot),
  create (``generateName``, uid, creationTimestamp, the type's defaults and validation: 422 with the
  field, 409 AlreadyExists), update (PUT, 409 Conflict on a stale ``resourceVersion``), patch
  (JSON merge, strategic merge, JSON patch; ``metadata.resourceVersion`` in a patch is a
  precondition), delete (``preconditions``; pods on a node are only marked for deletion when
  ``graceful_deletion`` is on, as a kubelet would finish them);
- watch: ``resourceVersion`` unset/"0" starts with the current objects, N resumes after N, a
  revision older than the window answers an ERROR event with 410 Expired (``Store.compact``
  forces that); ``allowWatchBookmarks`` gives BOOKMARK events every ``bookmark_interval_s``;
  ``timeoutSeconds`` ends the stream; selectors translate changes as the watch cache does;
- pods/binding: 201 with a ``Status`` (not a Binding), 409 when the pod already has a node or is
  being deleted or its uid differs from the Binding's, sets ``spec.nodeName``, merges the Binding's
  annotations and sets ``PodScheduled=True``, as ``BindingREST`` does;
- status writes keep the spec, main-resource writes keep the status; a pod's spec is immutable
  but for the fields the API allows; quantities are stored in the API server's canonical form;
- pods/log: a container's log from the simulated kubelet of the pod's node (``pod_logs``).

Boolean query parameters are accepted as ``true``, ``True`` and ``1`` (kubernetes-asyncio sends
``True``). Every answer that is not a success is a ``metav1.Status``.

Faults for tests (:class:`Faults`): fail a verb on a resource with a status code, delay it, or
reset the connection, N times or until cleared; :meth:`ApiServer.drop_watches` ends open watches
(cleanly or by cutting the connection). :attr:`ApiServer.writes` records every write received
over HTTP with its body and result, so tests can validate what a client wrote.

Run it by hand: ``python -m tessera.devcluster.apiserver --port 6443 --kubeconfig dev.kubeconfig``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import string
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Final

import msgspec
from aiohttp import web

from tessera.devcluster import discovery, patches, resources
from tessera.devcluster.admission import AdmissionChain, Phase
from tessera.devcluster.resources import (
    MUTATING_WEBHOOKS,
    NAMESPACE,
    POD,
    VALIDATING_WEBHOOKS,
    ApiError,
    Obj,
    ResourceType,
    conflict,
    invalid,
    not_found,
    timestamp,
)
from tessera.devcluster.selectors import (
    SelectorError,
    parse_field_selector,
    parse_label_selector,
    selector,
)
from tessera.devcluster.store import Closed, Key, Store, clone

_ENCODER: Final = msgspec.json.Encoder()
_TRUE: Final = frozenset({"true", "True", "1"})
DEFAULT_TOKEN: Final = "tessera-dev-token"
DEFAULT_NAMESPACES: Final = ("default", "kube-system")
NAMESPACE_NAME_LABEL: Final = "kubernetes.io/metadata.name"
"""The label the API server gives every namespace (webhooks' namespaceSelector keys on it)."""


# --- faults ----------------------------------------------------------------------------------


@dataclass
class Fault:
    """Make matching requests fail: ``status`` (0 = do not fail), after ``delay_s``, or cut the
    connection (``reset``); ``times`` matching requests (None = until cleared)."""

    verb: str | None = None
    """get, list, watch, create, update, patch, delete (None = any)."""
    resource: str | None = None
    """``pods``, ``pods/binding``, ``pods/status``, ``leases``, ``events``, ... (None = any)."""
    status: int = 500
    delay_s: float = 0.0
    reset: bool = False
    times: int | None = 1
    message: str = "injected fault"
    hits: int = 0

    def matches(self, verb: str, resource: str) -> bool:
        if self.times is not None and self.hits >= self.times:
            return False
        return (self.verb is None or self.verb == verb) and (
            self.resource is None or self.resource == resource
        )


class Faults:
    """The faults armed on a server; the first matching one applies to a request."""

    def __init__(self) -> None:
        self._armed: list[Fault] = []

    def add(
        self,
        *,
        verb: str | None = None,
        resource: str | None = None,
        status: int = 500,
        delay_s: float = 0.0,
        reset: bool = False,
        times: int | None = 1,
        message: str = "injected fault",
    ) -> Fault:
        fault = Fault(verb, resource, status, delay_s, reset, times, message)
        self._armed.append(fault)
        return fault

    def clear(self) -> None:
        self._armed.clear()

    def take(self, verb: str, resource: str) -> Fault | None:
        for fault in self._armed:
            if fault.matches(verb, resource):
                fault.hits += 1
                return fault
        return None


@dataclass(frozen=True)
class Write:
    """A write received over HTTP: what was sent and what it produced."""

    verb: str
    resource: str
    namespace: str
    name: str
    content_type: str
    body: Any
    code: int
    result: Obj | None
    """The object as stored afterwards (the pod, for a binding); None when the write failed."""


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


def _random_suffix() -> str:
    return "".join(random.choices(string.ascii_lowercase + string.digits, k=5))


class ApiServer:
    """The API test double: an in-memory store behind the Kubernetes REST API."""

    def __init__(
        self,
        *,
        token: str = DEFAULT_TOKEN,
        bookmark_interval_s: float = 1.0,
        graceful_deletion: bool = False,
        history_limit: int = 20_000,
        journal_limit: int = 10_000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.token = token
        self.bookmark_interval_s = bookmark_interval_s
        self.graceful_deletion = graceful_deletion
        self.clock = clock
        self.store = Store(history_limit=history_limit)
        self.faults = Faults()
        self.writes: deque[Write] = deque(maxlen=journal_limit)
        """The last ``journal_limit`` writes received over HTTP (0 keeps none)."""
        self.requests: Counter[tuple[str, str]] = Counter()
        """(verb, resource label) -> requests received over HTTP."""
        self._runner: web.AppRunner | None = None
        self.url = ""
        self.admission = AdmissionChain(self._webhook_configurations)
        self.pod_logs: Callable[[Obj, str], str] | None = None
        """pods/log: (pod, container) -> the container's log, as the node's kubelet serves it
        (the API server proxies to it); None = no kubelet serves logs (404)."""
        for namespace in DEFAULT_NAMESPACES:
            self._ensure_namespace(namespace)

    # --- lifecycle ------------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(client_max_size=8 * 2**20)
        app.router.add_route("*", "/{path:.*}", self._handle)
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Listen; returns the server URL (``http://host:port``)."""
        self._runner = web.AppRunner(self.app(), access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        sockets = getattr(site._server, "sockets", None) or []
        bound = int(sockets[0].getsockname()[1]) if sockets else port
        self.url = f"http://{host}:{bound}"
        return self.url

    def _webhook_configurations(self, phase: Phase) -> list[Obj]:
        kind = MUTATING_WEBHOOKS if phase == "mutating" else VALIDATING_WEBHOOKS
        return self.objects(kind)

    async def stop(self) -> None:
        await self.admission.close()
        self.store.close_watches()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> ApiServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def write_kubeconfig(self, path: str | Path, *, namespace: str = "default") -> Path:
        """Write a kubeconfig (JSON, which is YAML) that reaches this server with its token."""
        return write_kubeconfig(path, server=self.url, token=self.token, namespace=namespace)

    # --- test controls --------------------------------------------------------------------------

    def compact(self) -> int:
        """Forget the change history: resuming any watch from before now gets 410 Gone."""
        return self.store.compact()

    def drop_watches(self, resource: ResourceType | None = None, *, abrupt: bool = False) -> int:
        """End open watches (all, or one resource's): EOF, or a cut connection when ``abrupt``."""
        return self.store.close_watches(resource, abrupt=abrupt)

    def watchers(self, resource: ResourceType) -> int:
        """How many watches of ``resource``'s storage are open."""
        return len(self.store.collection(resource).watchers)

    def writes_to(self, resource: str, verb: str | None = None) -> list[Write]:
        return [
            w for w in self.writes if w.resource == resource and (verb is None or w.verb == verb)
        ]

    # --- operations (also used directly by tests and simulated components) ----------------------

    def get(self, resource: ResourceType, namespace: str, name: str) -> Obj:
        obj = self.store.get(resource, self._key(resource, namespace, name))
        if obj is None:
            raise not_found(resource.plural, name, resource.group)
        return obj

    def find(self, resource: ResourceType, namespace: str, name: str) -> Obj | None:
        return self.store.get(resource, self._key(resource, namespace, name))

    def objects(self, resource: ResourceType, namespace: str = "") -> list[Obj]:
        return list(self.store.objects(resource, namespace))

    def create(self, resource: ResourceType, obj: Obj, namespace: str = "") -> Obj:
        """Create ``obj`` as the API server would (defaults, validation, implicit namespace).

        In process: no admission webhook is called (a create over HTTP calls them)."""
        prepared, namespace = self._prepare_create(resource, obj, namespace)
        return self._store_created(resource, prepared, namespace)

    async def create_admitted(self, resource: ResourceType, obj: Obj, namespace: str = "") -> Obj:
        """Create ``obj`` as a client's create over HTTP is: defaults, the mutating admission
        webhooks, validation, the validating webhooks (``admission.py``), then stored."""
        meta = obj.get("metadata") or {}
        if resource.namespaced:
            namespace = namespace or meta.get("namespace") or "default"
        labels = self._namespace_labels(namespace)
        defaulted = clone(obj)
        resource.defaults(defaulted, self.clock())  # the API server defaults when it decodes
        mutated = await self.admission.admit(
            "mutating", resource, defaulted, namespace=namespace, namespace_labels=labels
        )
        prepared, namespace = self._prepare_create(resource, mutated, namespace)
        await self.admission.admit(
            "validating", resource, prepared, namespace=namespace, namespace_labels=labels
        )
        return self._store_created(resource, prepared, namespace)

    def _namespace_labels(self, namespace: str) -> dict[str, str]:
        found = self.store.get(NAMESPACE, ("", namespace)) if namespace else None
        labels = dict(((found or {}).get("metadata") or {}).get("labels") or {})
        if namespace:
            labels.setdefault(NAMESPACE_NAME_LABEL, namespace)
        return labels

    def _store_created(self, resource: ResourceType, obj: Obj, namespace: str) -> Obj:
        if resource.namespaced:
            self._ensure_namespace(namespace)
        return self.store.put(resource, obj)

    def _prepare_create(self, resource: ResourceType, obj: Obj, namespace: str) -> tuple[Obj, str]:
        """``obj`` ready to store (name, uid, defaults, validated), and its namespace."""
        obj = clone(obj)
        meta = obj.setdefault("metadata", {})
        if resource.namespaced:
            namespace = namespace or meta.get("namespace") or "default"
            if meta.get("namespace") not in (None, "", namespace):
                raise ApiError(
                    400,
                    "BadRequest",
                    "the namespace of the provided object does not match the namespace sent on "
                    "the request",
                )
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise invalid(
                    resource.kind,
                    "",
                    ["metadata.name: Required value: name or generateName is required"],
                )
            meta["name"] = meta["generateName"] + _random_suffix()
        name = meta["name"]
        if not resources.valid_name(name):
            raise invalid(
                resource.kind,
                name,
                [
                    f"metadata.name: Invalid value: {name!r}: a "
                    "lowercase RFC 1123 subdomain must consist of "
                    "lower case alphanumeric characters, '-' or '.'"
                ],
            )
        key = self._key(resource, namespace, name)
        if self.store.get(resource, key) is not None:
            raise ApiError(
                409,
                "AlreadyExists",
                f'{resource.plural}{"." + resource.group if resource.group else ""} "{name}" '
                "already exists",
                kind=resource.plural,
                name=name,
            )
        now = self.clock()
        obj["apiVersion"], obj["kind"] = resource.api_version, resource.kind
        meta["uid"] = resources.new_uid()
        meta["creationTimestamp"] = timestamp(now)
        meta.pop("resourceVersion", None)
        meta.pop("deletionTimestamp", None)
        resource.defaults(obj, now)
        errors = resource.validate(obj)
        if errors:
            raise invalid(resource.kind, name, errors)
        return obj, namespace

    def update(
        self, resource: ResourceType, namespace: str, name: str, obj: Obj, subresource: str = ""
    ) -> Obj:
        """Replace the object (PUT): a ``metadata.resourceVersion`` must be the current one."""
        current = self.get(resource, namespace, name)
        new = clone(obj)
        meta = new.setdefault("metadata", {})
        if meta.get("name", name) != name:
            raise ApiError(
                400, "BadRequest", "the name of the object does not match the name on the URL"
            )
        return self._replace(resource, current, new, subresource)

    def patch(
        self,
        resource: ResourceType,
        namespace: str,
        name: str,
        patch: Any,
        content_type: str,
        subresource: str = "",
    ) -> Obj:
        """Apply a patch of ``content_type`` to the object (or its status)."""
        current = self.get(resource, namespace, name)
        try:
            patched = patches.apply_patch(resource.to_view(current), patch, content_type)
        except patches.PatchError as error:
            reason = {400: "BadRequest", 415: "UnsupportedMediaType"}.get(error.status, "Invalid")
            raise ApiError(error.status, reason, error.message) from None
        # A patch result shares untouched parts with the stored object: work on a copy.
        return self._replace(resource, current, clone(resource.from_view(patched)), subresource)

    def _replace(self, resource: ResourceType, current: Obj, new: Obj, subresource: str) -> Obj:
        name = current["metadata"]["name"]
        meta = new.setdefault("metadata", {})
        current_meta = current["metadata"]
        wanted = meta.get("resourceVersion")
        if wanted and wanted != current_meta["resourceVersion"]:
            raise conflict(resource.plural, name, resource.group)
        causes = [
            f"metadata.{key}: Invalid value: {meta.get(key)!r}: field is immutable"
            for key in ("name", "namespace", "uid", "creationTimestamp")
            if key in meta and meta[key] != current_meta.get(key)
        ]
        if causes:
            raise invalid(resource.kind, name, causes)
        for key in (
            "name",
            "namespace",
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
        ):
            if key in current_meta and key not in meta:
                meta[key] = current_meta[key]
        new["apiVersion"], new["kind"] = resource.api_version, resource.kind
        errors = resource.update_rules(current, new, subresource) + resource.validate(new)
        if errors:
            raise invalid(resource.kind, name, errors)
        meta["resourceVersion"] = current_meta["resourceVersion"]
        if new == current:
            return current  # a no-op write keeps the resourceVersion, as the API server does
        return self.store.put(resource, new)

    def delete(
        self,
        resource: ResourceType,
        namespace: str,
        name: str,
        *,
        grace_period_s: int | None = None,
        uid: str | None = None,
        resource_version: str | None = None,
    ) -> Obj:
        """Delete (or, for a bound pod under ``graceful_deletion``, mark for deletion)."""
        current = self.get(resource, namespace, name)
        meta = current["metadata"]
        if uid is not None and uid != meta.get("uid"):
            raise conflict(
                resource.plural,
                name,
                resource.group,
                f"Precondition failed: UID in precondition: {uid}, UID in object meta: "
                f"{meta.get('uid')}",
            )
        if resource_version is not None and resource_version != meta.get("resourceVersion"):
            raise conflict(
                resource.plural,
                name,
                resource.group,
                f"Precondition failed: ResourceVersion in precondition: {resource_version}, "
                f"ResourceVersion in object meta: {meta.get('resourceVersion')}",
            )
        graceful = (
            resource is POD
            and self.graceful_deletion
            and current.get("spec", {}).get("nodeName")
            and grace_period_s != 0
            and not meta.get("deletionTimestamp")
        )
        if graceful:
            grace = grace_period_s
            if grace is None:
                grace = int(current["spec"].get("terminationGracePeriodSeconds", 30))
            marked = clone(current)
            marked["metadata"]["deletionTimestamp"] = timestamp(self.clock() + grace)
            marked["metadata"]["deletionGracePeriodSeconds"] = grace
            return self.store.put(resource, marked)
        self.store.delete(resource, self._key(resource, namespace, name))
        return current

    def bind(self, namespace: str, name: str, binding: Obj) -> Obj:
        """pods/binding as ``BindingREST.Create``: the bound pod, or ApiError."""
        meta = binding.get("metadata") or {}
        if meta.get("name", name) != name:
            raise ApiError(400, "BadRequest", "name in URL does not match name in Binding object")
        target = binding.get("target") or {}
        if target.get("kind") not in (None, "", "Node"):
            raise invalid("Binding", name, ["target.kind: Invalid value: must be empty or 'Node'"])
        node = target.get("name") or ""
        if not node:
            raise invalid("Binding", name, ["target.name: Required value"])
        pod = self.get(POD, namespace, name)

        def refused(message: str) -> ApiError:
            return conflict("pods/binding", name, message=message)

        if meta.get("uid") and meta["uid"] != pod["metadata"]["uid"]:
            raise refused(
                f"Precondition failed: UID in precondition: {meta['uid']}, UID in object meta: "
                f"{pod['metadata']['uid']}"
            )
        if (
            meta.get("resourceVersion")
            and meta["resourceVersion"] != pod["metadata"]["resourceVersion"]
        ):
            raise refused(
                "the object has been modified; please apply your changes to the "
                "latest version and try again"
            )
        if pod["metadata"].get("deletionTimestamp"):
            raise refused(f"pod {name} is being deleted, cannot be assigned to a host")
        if pod.get("spec", {}).get("nodeName"):
            raise refused(f'pod {name} is already assigned to node "{pod["spec"]["nodeName"]}"')
        bound = clone(pod)
        bound["spec"]["nodeName"] = node
        if meta.get("annotations"):
            bound["metadata"].setdefault("annotations", {}).update(meta["annotations"])
        set_condition(bound, {"type": "PodScheduled", "status": "True"}, self.clock())
        return self.store.put(POD, bound)

    # --- HTTP -----------------------------------------------------------------------------------

    def _key(self, resource: ResourceType, namespace: str, name: str) -> Key:
        return (namespace if resource.namespaced else "", name)

    def _ensure_namespace(self, namespace: str) -> None:
        if self.store.get(NAMESPACE, ("", namespace)) is None:
            obj: Obj = {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {
                    "name": namespace,
                    "labels": {NAMESPACE_NAME_LABEL: namespace},
                    "uid": resources.new_uid(),
                    "creationTimestamp": timestamp(self.clock()),
                },
            }
            NAMESPACE.defaults(obj, self.clock())
            self.store.put(NAMESPACE, obj)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if self.token and request.headers.get("Authorization") != f"Bearer {self.token}":
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
        self.requests[(verb, target.label)] += 1
        fault = self.faults.take(verb, target.label)
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
            return await self._dispatch(request, target, verb)
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
        try:
            return json.loads(raw)
        except ValueError as error:
            raise ApiError(400, "BadRequest", f"the request body is not JSON: {error}") from None

    async def _dispatch(self, request: web.Request, target: Target, verb: str) -> web.Response:
        resource, namespace, name = target.resource, target.namespace, target.name
        if verb == "get" and target.subresource == "log":
            return self._log(request, self.get(resource, namespace, name))
        if verb == "get":
            view = resource.to_view(self.get(resource, namespace, name))
            if discovery.wants_table(request.headers.get("Accept", "")):
                return _json(
                    discovery.table(
                        resource,
                        [view],
                        now=self.clock(),
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
        try:
            if verb == "create" and target.subresource == "binding":
                if not isinstance(body, dict):
                    raise ApiError(400, "BadRequest", "a Binding must be a JSON object")
                result = self.bind(namespace, name, body)
                code, answer = 201, _status(201)
            elif verb == "create":
                if not isinstance(body, dict):
                    raise ApiError(400, "BadRequest", "the object must be a JSON object")
                if request.query.get("fieldValidation") == "Strict":
                    _strict_top_level(body)
                result = await self.create_admitted(resource, resource.from_view(body), namespace)
                code, answer = 201, resource.to_view(result)
            elif verb == "update":
                if not isinstance(body, dict):
                    raise ApiError(400, "BadRequest", "the object must be a JSON object")
                result = self.update(
                    resource, namespace, name, resource.from_view(body), target.subresource
                )
                answer = resource.to_view(result)
            elif verb == "patch":
                result = self.patch(
                    resource, namespace, name, body, content_type, target.subresource
                )
                answer = resource.to_view(result)
            else:
                options = body if isinstance(body, dict) else {}
                preconditions = options.get("preconditions") or {}
                grace = request.query.get("gracePeriodSeconds", options.get("gracePeriodSeconds"))
                deleted = self.delete(
                    resource,
                    namespace,
                    name,
                    grace_period_s=None if grace is None else int(grace),
                    uid=preconditions.get("uid"),
                    resource_version=preconditions.get("resourceVersion"),
                )
                result = self.find(resource, namespace, name)
                answer = resource.to_view(deleted) if resource is POD else _status(200)
        except ApiError as error:
            self.writes.append(
                Write(verb, target.label, namespace, name, content_type, body, error.code, None)
            )
            raise
        self.writes.append(
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
        return _json(answer, code)

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
        if self.pod_logs is None:
            raise ApiError(404, "NotFound", "no kubelet serves logs for this pod")
        return web.Response(
            text=self.pod_logs(pod, container), content_type="text/plain", charset="utf-8"
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
        items, revision, token = self.store.list_page(
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
                    now=self.clock(),
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
            initial, watcher = self.store.watch(
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
                wait = self.bookmark_interval_s if bookmarks else 3600.0
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
                                "metadata": {"resourceVersion": str(self.store.revision)},
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
            self.store.stop_watch(watcher)
        if abrupt:
            if request.transport is not None:
                request.transport.abort()
            return response
        with contextlib.suppress(ConnectionResetError):
            await response.write_eof()
        return response


_TOP_LEVEL: Final = frozenset(
    {"apiVersion", "kind", "metadata", "spec", "status"}
    | {"regarding", "related", "note", "reason", "type", "action", "eventTime", "series"}
    | {"reportingController", "reportingInstance", "deprecatedSource", "deprecatedCount"}
    | {"deprecatedFirstTimestamp", "deprecatedLastTimestamp", "involvedObject", "message"}
    | {"source", "firstTimestamp", "lastTimestamp", "count", "reportingComponent"}
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


def set_condition(pod: Obj, condition: Obj, now: float) -> None:
    """Set a status condition by type, as ``podutil.UpdatePodCondition`` does: the transition
    time moves only when the status changes."""
    conditions = pod.setdefault("status", {}).setdefault("conditions", [])
    for existing in conditions:
        if existing.get("type") == condition["type"]:
            if existing.get("status") != condition.get("status"):
                existing["lastTransitionTime"] = timestamp(now)
            existing.update({k: v for k, v in condition.items() if k != "lastTransitionTime"})
            existing.setdefault("lastProbeTime", None)
            return
    conditions.append({"lastProbeTime": None, "lastTransitionTime": timestamp(now), **condition})


def write_kubeconfig(
    path: str | Path,
    *,
    server: str,
    token: str,
    namespace: str = "default",
    name: str = "tessera-dev",
) -> Path:
    """Write a kubeconfig for ``server`` with a bearer ``token``; returns the path."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": server}}],
        "users": [{"name": name, "user": {"token": token} if token else {}}],
        "contexts": [
            {"name": name, "context": {"cluster": name, "user": name, "namespace": namespace}}
        ],
        "current-context": name,
    }
    target = Path(path)
    target.write_text(json.dumps(config, indent=2) + "\n")
    return target


@dataclass
class _Options:
    host: str = "127.0.0.1"
    port: int = 6443
    kubeconfig: str = ""
    token: str = DEFAULT_TOKEN


async def _serve(options: _Options) -> None:
    server = ApiServer(token=options.token)
    url = await server.start(options.host, options.port)
    if options.kubeconfig:
        server.write_kubeconfig(options.kubeconfig)
    print(
        f"API test double listening on {url}"
        + (f"; kubeconfig: {options.kubeconfig}" if options.kubeconfig else ""),
        flush=True,
    )
    try:
        await asyncio.Event().wait()
    finally:
        await server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tessera.devcluster.apiserver",
        description="Run the Kubernetes API test double (in-memory, for development and tests).",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=6443, help="0 = any free port")
    parser.add_argument("--kubeconfig", default="", help="write a kubeconfig for it here")
    parser.add_argument(
        "--token",
        default=DEFAULT_TOKEN,
        help="bearer token clients must send; empty = none (kubectl sends no token over http)",
    )
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(_Options(args.host, args.port, args.kubeconfig, args.token)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
