"""A service body's own GET endpoints on the health server (``HttpRoutes``)."""

from __future__ import annotations

from collections.abc import Mapping

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry

from shared.runtime.health import HealthServer, HttpRoutes, Readiness


async def test_routes_added_after_start_are_served_with_their_path_values() -> None:
    routes = HttpRoutes()
    server = HealthServer(
        readiness=Readiness(), registry=CollectorRegistry(), service="t", routes=routes
    )
    port = await server.start("127.0.0.1", 0)
    try:

        async def pod(request: web.Request, params: Mapping[str, str]) -> web.StreamResponse:
            return web.json_response({"uid": params["uid"]})

        routes.get("/v1/pods/{uid}", pod)
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/v1/pods/abc-1") as response:
                assert (response.status, await response.json()) == (200, {"uid": "abc-1"})
            async with http.get(f"http://127.0.0.1:{port}/v1/pods/abc/x") as response:
                assert response.status == 404
                assert "no endpoint /v1/pods/abc/x" in (await response.json())["error"]
            async with http.get(f"http://127.0.0.1:{port}/healthz") as response:
                assert response.status == 200
    finally:
        await server.stop()
