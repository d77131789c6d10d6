"""A fake kubelet for device plugin tests: the Registration service on a real ``kubelet.sock`` and a
DevicePlugin client dialling the plugin's own socket, both over real unix-socket gRPC.

Like the real kubelet it rejects an unsupported API version, and :meth:`FakeKubelet.restart` does
what a restarting kubelet does: stop, delete every socket in the plugin directory, serve again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc

from services.deviceplugin._proto import api_pb2, api_pb2_grpc
from tessera.devcluster.devicemanager import KUBELET_CHECKPOINT


class _Registration(api_pb2_grpc.RegistrationServicer):  # type: ignore[misc]
    def __init__(self, kubelet: FakeKubelet) -> None:
        self._kubelet = kubelet

    async def Register(  # noqa: N802 (the generated servicer's method name)
        self, request: Any, context: Any
    ) -> Any:
        if request.version != "v1beta1":
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"unsupported version {request.version!r}"
            )
        if self._kubelet.refuse:
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, self._kubelet.refuse)
        self._kubelet.register_calls += 1
        await self._kubelet.answer_registrations.wait()
        await self._kubelet.registrations.put(request)
        return api_pb2.Empty()


class FakeKubelet:
    """``async with FakeKubelet(plugin_dir) as kubelet:`` serves ``plugin_dir/kubelet.sock``."""

    def __init__(self, plugin_dir: Path) -> None:
        self.plugin_dir = plugin_dir
        self.socket = plugin_dir / "kubelet.sock"
        self.registrations: asyncio.Queue[Any] = asyncio.Queue()
        self.refuse = ""
        """When set, Register fails with this message (e.g. a resource name already taken)."""
        self.answer_registrations = asyncio.Event()
        """Cleared, Register holds its answer (a slow kubelet) until it is set again."""
        self.answer_registrations.set()
        self.register_calls = 0
        self._server: Any = None

    async def start(self) -> None:
        server = grpc.aio.server()
        api_pb2_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        server.add_insecure_port(f"unix://{self.socket}")
        await server.start()
        self._server = server

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.stop(0)

    async def restart(self) -> None:
        """Stop, wipe the plugin directory (as the kubelet's device manager does at start:
        every file but its checkpoint, subdirectories kept), serve again."""
        await self.stop()
        for path in self.plugin_dir.iterdir():
            if not path.is_dir() and path.name != KUBELET_CHECKPOINT:
                path.unlink()
        await self.start()

    async def registered(self, timeout: float = 10.0) -> Any:
        """The next RegisterRequest the kubelet received."""
        return await asyncio.wait_for(self.registrations.get(), timeout)

    @contextlib.asynccontextmanager
    async def plugin(self, endpoint: str) -> AsyncIterator[Any]:
        """A DevicePlugin stub dialling ``endpoint`` in the plugin directory, as kubelets do."""
        async with grpc.aio.insecure_channel(f"unix://{self.plugin_dir / endpoint}") as channel:
            yield api_pb2_grpc.DevicePluginStub(channel)

    async def __aenter__(self) -> FakeKubelet:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()
