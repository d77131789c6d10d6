"""A Kubernetes API test double over aiohttp, faithful for every endpoint Tessera uses.

Real clients (kubernetes-asyncio in the binder, kubectl, helm) talk to it over HTTP exactly as to
a kube-apiserver: ``async with ApiServer() as api:`` listens on a free loopback port, ``api.url``
is the server, :meth:`ApiServer.write_kubeconfig` writes a kubeconfig with a bearer token for it.

Who asks: each request authenticates as a user by its bearer token, as a kube-apiserver's token
authenticator does: ``token`` is an admin's (``system:masters``), :meth:`ApiServer.add_user` makes
a token for any other user (a service account's ``system:serviceaccount:NS:NAME``), an unknown
token is 401, and a request without one is ``system:anonymous`` when the server has no admin
token, else 401. The user is the ``userInfo`` of the admission reviews a write causes. kubectl
and helm send a token only over HTTPS: ``ApiServer(tls=True)`` serves HTTPS with a CA made for it
(in the kubeconfigs it writes).

What it serves (``resources.RESOURCES``): pods (with ``/status`` and ``/binding``), nodes (with
``/status``), namespaces (created implicitly by the first object in them), coordination.k8s.io/v1
leases, events.k8s.io/v1 events and the core v1 view of the same events,
admissionregistration.k8s.io/v1 mutating and validating webhook configurations, whose webhooks a
create over HTTP calls as the API server does (``admission.py``), and resource.k8s.io/v1
(DeviceClass, ResourceSlice, ResourceClaim with ``/status``, ResourceClaimTemplate: ``dra.py``),
decoded by their strict 1.37 schemas (``schema.py``). For each:

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
- ``metadata.finalizers``: a delete only marks an object that has some (``deletionTimestamp``),
  the update that removes the last one completes the delete, none may be added meanwhile;
- pods/log: a container's log from the simulated kubelet of the pod's node (``pod_logs``).

Boolean query parameters are accepted as ``true``, ``True`` and ``1`` (kubernetes-asyncio sends
``True``). Every answer that is not a success is a ``metav1.Status``; a 422 carries each field
error in ``details.causes`` (reason, message, field), which kubectl prints. A create body may be
JSON or, for the kinds kubectl's ``create`` generators send that way, protobuf (``protobuf.py``).

Faults for tests (:class:`Faults`): fail a verb on a resource with a status code, delay it, or
reset the connection, N times or until cleared; :meth:`ApiServer.drop_watches` ends open watches
(cleanly or by cutting the connection). :attr:`ApiServer.writes` records every write received
over HTTP with its body and result, so tests can validate what a client wrote.

Run it by hand: ``python -m tessera.devcluster.apiserver --port 6443 --kubeconfig dev.kubeconfig``.

This module puts the double together and runs it; the parts: ``objects.py`` (the operations on
objects, in process), ``rest.py`` (the HTTP front), ``controls.py`` (faults and the journal of
writes), ``store.py`` (storage, resource versions, watches), ``patches.py`` (patch semantics),
``resources.py`` (the types, their defaults and validation), ``admission.py`` (webhooks),
``protobuf.py`` (protobuf request bodies).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import secrets
import ssl
import tempfile
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Final

from aiohttp import web

from tessera.devcluster.certs import make_serving_certificate
from tessera.devcluster.controls import Faults, Write
from tessera.devcluster.objects import ADMIN_INFO, DEFAULT_NAMESPACES, ApiObjects
from tessera.devcluster.resources import Obj, ResourceType
from tessera.devcluster.rest import RestFront

DEFAULT_TOKEN: Final = "tessera-dev-token"


@dataclass(frozen=True)
class User:
    """Who a request authenticated as."""

    name: str
    groups: tuple[str, ...] = ()
    authenticated: bool = True

    def info(self) -> Obj:
        """As an AdmissionReview's ``userInfo`` (every authenticated user is in
        ``system:authenticated``, as the API server adds it)."""
        groups = [*self.groups, "system:authenticated"] if self.authenticated else [*self.groups]
        return {"username": self.name, "groups": groups}


ADMIN: Final = User(ADMIN_INFO["username"], tuple(ADMIN_INFO["groups"]))
ANONYMOUS: Final = User("system:anonymous", ("system:unauthenticated",), authenticated=False)


def service_account(namespace: str, name: str) -> User:
    """A service account's user, as its token authenticates."""
    return User(
        f"system:serviceaccount:{namespace}:{name}",
        ("system:serviceaccounts", f"system:serviceaccounts:{namespace}"),
    )


class ApiServer(ApiObjects):
    """The API test double: an in-memory store behind the Kubernetes REST API."""

    def __init__(
        self,
        *,
        token: str = DEFAULT_TOKEN,
        tls: bool = False,
        bookmark_interval_s: float = 1.0,
        graceful_deletion: bool = False,
        history_limit: int = 20_000,
        journal_limit: int = 10_000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(
            graceful_deletion=graceful_deletion, history_limit=history_limit, clock=clock
        )
        self.token = token
        self.users: dict[str, User] = {token: ADMIN} if token else {}
        """Bearer token -> the user it authenticates."""
        self.tls = tls
        self.ca_pem = b""
        """The CA of the serving certificate (HTTPS only)."""
        self._certs: tempfile.TemporaryDirectory[str] | None = None
        self.bookmark_interval_s = bookmark_interval_s
        self.faults = Faults()
        self.writes: deque[Write] = deque(maxlen=journal_limit)
        """The last ``journal_limit`` writes received over HTTP (0 keeps none)."""
        self.requests: Counter[tuple[str, str]] = Counter()
        """(verb, resource label) -> requests received over HTTP."""
        self._runner: web.AppRunner | None = None
        self.url = ""
        self.pod_logs: Callable[[Obj, str], str] | None = None
        """pods/log: (pod, container) -> the container's log, as the node's kubelet serves it
        (the API server proxies to it); None = no kubelet serves logs (404)."""
        for namespace in DEFAULT_NAMESPACES:
            self._ensure_namespace(namespace)

    # --- lifecycle ------------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(client_max_size=8 * 2**20)
        app.router.add_route("*", "/{path:.*}", RestFront(self).handle)
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Listen; returns the server URL (``http://host:port``, ``https://`` with ``tls``)."""
        context = self._serving_context(host) if self.tls else None
        self._runner = web.AppRunner(self.app(), access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, ssl_context=context)
        await site.start()
        sockets = getattr(site._server, "sockets", None) or []
        bound = int(sockets[0].getsockname()[1]) if sockets else port
        self.url = f"{'https' if context else 'http'}://{host}:{bound}"
        return self.url

    def _serving_context(self, host: str) -> ssl.SSLContext:
        self._certs = tempfile.TemporaryDirectory(prefix="tessera-api-")
        certificate = make_serving_certificate(
            Path(self._certs.name), [host, "localhost"], ca_name="tessera-api-double-ca"
        )
        self.ca_pem = certificate.ca_pem
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(certificate.cert_file, certificate.key_file)
        return context

    async def stop(self) -> None:
        await self.admission.close()
        self.store.close_watches()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._certs is not None:
            self._certs.cleanup()
            self._certs = None

    # --- who asks -------------------------------------------------------------------------------

    def add_user(self, user: User) -> str:
        """A new bearer token that authenticates as ``user``."""
        token = secrets.token_urlsafe(24)
        self.users[token] = user
        return token

    def authenticate(self, authorization: str | None) -> User | None:
        """The user of a request's ``Authorization`` header; None when it is refused (401)."""
        if not authorization:
            return ANONYMOUS if not self.token else None
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer":
            return None
        return self.users.get(token.strip())

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

    def write_kubeconfig(
        self, path: str | Path, *, namespace: str = "default", token: str | None = None
    ) -> Path:
        """Write a kubeconfig (JSON, which is YAML) that reaches this server with ``token``
        (default: the admin's), trusting its CA over HTTPS."""
        return write_kubeconfig(
            path,
            server=self.url,
            token=self.token if token is None else token,
            namespace=namespace,
            ca_pem=self.ca_pem,
        )

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


def write_kubeconfig(
    path: str | Path,
    *,
    server: str,
    token: str,
    namespace: str = "default",
    name: str = "tessera-dev",
    ca_pem: bytes = b"",
) -> Path:
    """Write a kubeconfig for ``server`` with a bearer ``token`` (trusting ``ca_pem`` for an
    HTTPS server); returns the path."""
    cluster: Obj = {"server": server}
    if ca_pem:
        cluster["certificate-authority-data"] = base64.b64encode(ca_pem).decode()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": cluster}],
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
