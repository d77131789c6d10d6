"""HTTP: the page and its assets, the JSON API, the live event stream, and health and metrics.

Routes (all GET, all read-only):

* ``/``: the page; ``/static/<name>``: its script and style sheet, read from the package (no
  build step, no CDN: the page loads nothing from anywhere else, and its Content-Security-Policy
  says so).
* ``/api/v1/cluster``: :class:`~services.dashboard.core.views.ClusterView` as JSON.
* ``/api/v1/pods/pending[?limit=N]``: :class:`~services.dashboard.core.views.PendingView`.
* ``/api/v1/pods/running[?filter=TEXT&offset=N&limit=N]``: one page of the placed pods
  (:class:`~services.dashboard.core.views.RunningView`), by namespace and name.
* ``/api/v1/events``: server-sent events, a ``snapshot`` then ``update`` events as things change.
* ``/healthz``, ``/readyz``, ``/metrics``: as every Tessera service (``shared.runtime.health``),
  whose server serves these routes too (:meth:`DashboardRoutes.install`).

The API answers 503 with the reason until every KV bucket has delivered its initial values, so a
script never mistakes a half-loaded view for the cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from importlib import resources
from typing import Final

import msgspec
from aiohttp import web

from services.dashboard.live import LiveView
from shared.runtime.health import HttpRoutes

ASSETS: Final[dict[str, str]] = {
    "index.html": "text/html; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
}
SECURITY_HEADERS: Final[dict[str, str]] = {
    # Everything comes from this server; inline style attributes size the slice bars.
    "Content-Security-Policy": "default-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}
KEEPALIVE_S: Final = 15.0
MAX_RUNNING_ROWS: Final = 1000
"""The most placed pods one ``/api/v1/pods/running`` page carries."""


def load_assets() -> dict[str, bytes]:
    """The page's files, shipped as package data in ``services/dashboard/static``."""
    folder = resources.files("services.dashboard").joinpath("static")
    return {name: folder.joinpath(name).read_bytes() for name in ASSETS}


def _json(payload: object, status: int = 200) -> web.Response:
    return web.Response(
        body=msgspec.json.encode(payload),
        status=status,
        content_type="application/json",
        headers={"Cache-Control": "no-cache"},
    )


class DashboardRoutes:
    """The dashboard's routes, served by the service's health server beside its own."""

    def __init__(self, *, live: LiveView, keepalive_s: float = KEEPALIVE_S) -> None:
        self._live = live
        self._assets = load_assets()
        self._keepalive_s = keepalive_s

    def install(self, routes: HttpRoutes) -> None:
        routes.get("/", self._index)
        routes.get("/static/{name}", self._asset)
        routes.get("/api/v1/cluster", self._cluster)
        routes.get("/api/v1/pods/pending", self._pending)
        routes.get("/api/v1/pods/running", self._running)
        routes.get("/api/v1/events", self._events)

    async def _index(self, _: web.Request, __: Mapping[str, str]) -> web.Response:
        return self._serve("index.html")

    async def _asset(self, _: web.Request, params: Mapping[str, str]) -> web.Response:
        name = params["name"]
        if name not in ASSETS or name == "index.html":
            raise web.HTTPNotFound(text=f"no asset {name!r}")
        return self._serve(name)

    def _serve(self, name: str) -> web.Response:
        return web.Response(
            body=self._assets[name], headers={"Content-Type": ASSETS[name], **SECURITY_HEADERS}
        )

    def _not_synced(self) -> web.Response | None:
        if self._live.synced:
            return None
        return _json(
            {"error": "not ready", "reason": self._live.waiting_for() or "loading"}, status=503
        )

    async def _cluster(self, _: web.Request, __: Mapping[str, str]) -> web.Response:
        return self._not_synced() or _json(self._live.cluster())

    async def _pending(self, request: web.Request, _: Mapping[str, str]) -> web.Response:
        raw = request.query.get("limit")
        limit: int | None = None
        if raw is not None:
            if not raw.isdigit():
                return _json(
                    {"error": f"limit must be a whole number >= 0, got {raw!r}"}, status=400
                )
            limit = int(raw)
        return self._not_synced() or _json(self._live.pending(limit))

    async def _running(self, request: web.Request, _: Mapping[str, str]) -> web.Response:
        numbers: dict[str, int] = {}
        for name, default, most in (("offset", 0, None), ("limit", 50, MAX_RUNNING_ROWS)):
            raw = request.query.get(name, str(default))
            if not raw.isdigit() or (most is not None and int(raw) > most):
                upto = f" up to {most}" if most is not None else ""
                return _json(
                    {"error": f"{name} must be a whole number >= 0{upto}, got {raw!r}"}, status=400
                )
            numbers[name] = int(raw)
        return self._not_synced() or _json(
            self._live.running(
                offset=numbers["offset"],
                limit=numbers["limit"],
                match=request.query.get("filter", ""),
            )
        )

    async def _events(self, request: web.Request, _: Mapping[str, str]) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",  # tell a proxy in front not to buffer the stream
            }
        )
        await response.prepare(request)
        page = self._live.connect_page()
        try:
            await response.write(b"retry: 2000\n\n")  # how soon the browser reconnects
            while True:
                try:
                    async with asyncio.timeout(self._keepalive_s):
                        chunk = await page.queue.get()
                except TimeoutError:
                    chunk = b": keepalive\n\n"  # keeps idle proxies from cutting the stream
                if chunk is None:  # fell behind, or the server is stopping
                    break
                await response.write(chunk)
        except (ConnectionResetError, ConnectionError):
            pass  # the page went away
        finally:
            self._live.disconnect_page(page)
        with contextlib.suppress(ConnectionError):
            await response.write_eof()
        return response
