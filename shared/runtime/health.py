"""``/healthz``, ``/readyz`` and ``/metrics`` over aiohttp.

``/healthz`` answers while the event loop runs (liveness). ``/readyz`` answers 200 only when every
registered readiness check passes, and otherwise 503 with the failing checks and their reasons, so
``kubectl describe`` of a not-ready pod says why (secrets scrubbed). ``/metrics`` serves the
service's own registry.

A service body may serve its own read-only GET endpoints on the same port through
:class:`HttpRoutes` (the server is already listening when the body starts, so routes are matched
at request time).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

Probe = Callable[[], tuple[bool, str]]
"""A readiness probe: (ready, reason when not ready)."""


@dataclass
class Readiness:
    """Named readiness checks; the service is ready when all of them are."""

    _probes: dict[str, Probe] = field(default_factory=dict)
    http_port: int | None = None
    """Where /readyz is served, once the HTTP server listens (useful to tests and logs)."""

    def set(self, name: str, ready: bool, reason: str = "") -> None:
        """Record a fixed state for check ``name``."""
        self._probes[name] = lambda: (ready, reason)

    def probe(self, name: str, probe: Probe) -> None:
        """Evaluate ``probe`` on every readiness request (for state that changes by itself)."""
        self._probes[name] = probe

    def report(self) -> dict[str, tuple[bool, str]]:
        return {name: probe() for name, probe in self._probes.items()}

    @property
    def ready(self) -> bool:
        report = self.report()
        return bool(report) and all(ok for ok, _ in report.values())


RouteHandler = Callable[[web.Request, Mapping[str, str]], Awaitable[web.StreamResponse]]
"""A service's GET handler: the request and the values of the path's ``{name}`` segments."""


@dataclass
class HttpRoutes:
    """GET endpoints a service body adds to its health server while it runs."""

    _routes: list[tuple[re.Pattern[str], RouteHandler]] = field(default_factory=list)

    def get(self, path: str, handler: RouteHandler) -> None:
        """Serve GET ``path``; a ``{name}`` segment matches one path segment, passed by name."""
        parts = []
        for segment in path.strip("/").split("/"):
            if segment.startswith("{") and segment.endswith("}"):
                parts.append(f"(?P<{segment[1:-1]}>[^/]+)")
            else:
                parts.append(re.escape(segment))
        self._routes.append((re.compile("^/" + "/".join(parts) + "$"), handler))

    def match(self, path: str) -> tuple[RouteHandler, dict[str, str]] | None:
        for pattern, handler in self._routes:
            found = pattern.match(path)
            if found is not None:
                return handler, found.groupdict()
        return None


class HealthServer:
    """The HTTP side of a service."""

    def __init__(
        self,
        *,
        readiness: Readiness,
        registry: CollectorRegistry,
        service: str,
        redact: Callable[[str], str] = str,
        routes: HttpRoutes | None = None,
    ) -> None:
        self._redact = redact
        self._readiness = readiness
        self._registry = registry
        self._service = service
        self._routes = routes or HttpRoutes()
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/{path:.*}", self._service_route)
        return app

    async def _service_route(self, request: web.Request) -> web.StreamResponse:
        found = self._routes.match(request.path)
        if found is None:
            return web.json_response({"error": f"no endpoint {request.path}"}, status=404)
        handler, params = found
        return await handler(request, params)

    async def _healthz(self, _: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "service": self._service})

    async def _readyz(self, _: web.Request) -> web.Response:
        report = self._readiness.report()
        ready = bool(report) and all(ok for ok, _ in report.values())
        checks = {
            name: {"ready": ok, "reason": self._redact(why)} for name, (ok, why) in report.items()
        }
        return web.json_response(
            {"ready": ready, "service": self._service, "checks": checks},
            status=200 if ready else 503,
        )

    async def _metrics(self, _: web.Request) -> web.Response:
        body = generate_latest(self._registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (0 = any free port); returns the bound port."""
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        self.port = int(sockets[0].getsockname()[1]) if sockets else port
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
