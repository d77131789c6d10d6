"""The DRA side's gRPC adapter: the kubelet's plugin registration and ``DRAPlugin`` v1 services
on unix sockets (with ``server.py``, the only modules here importing grpc).

It translates and nothing more. :class:`GrpcDraServer` serves ``k8s.io.kubelet.pkg.apis.dra.v1.
DRAPlugin`` on the plugin's ``dra.sock`` and then ``pluginregistration.Registration`` on
``<registry>/<driver>-reg.sock``, which the kubelet's plugin watcher finds: ``GetInfo`` answers
type ``DRAPlugin``, the driver name, the ``dra.sock`` endpoint and ``v1.DRAPlugin``;
``NotifyRegistrationStatus`` is handed to ``on_registration``. Each prepare and unprepare is a
call on a :class:`DraCore`; a claim it refuses gets its message as the claim's ``error`` (the
kubelet retries it and shows it on the pod).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final, Protocol

import grpc

from services.deviceplugin._proto.dra.v1 import api_pb2 as dra_pb2
from services.deviceplugin._proto.dra.v1 import api_pb2_grpc as dra_grpc
from services.deviceplugin._proto.pluginregistration.v1 import api_pb2 as registration_pb2
from services.deviceplugin._proto.pluginregistration.v1 import api_pb2_grpc as registration_grpc
from services.deviceplugin.rules.allocate import Refusal
from services.deviceplugin.rules.prepare import ClaimRef, Prepared

log = logging.getLogger(__name__)

PLUGIN_TYPE: Final = "DRAPlugin"
DRA_SERVICE: Final = "v1.DRAPlugin"


class DraCore(Protocol):
    """What the DRA servicer needs from the service behind it."""

    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, Prepared | Refusal]:
        """Each claim (by uid) prepared, or why not."""
        ...

    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        """Each claim (by uid) unprepared: "" or the error."""
        ...


def _refs(claims: Any) -> list[ClaimRef]:
    return [ClaimRef(namespace=c.namespace, name=c.name, uid=c.uid) for c in claims]


class _Plugin(dra_grpc.DRAPluginServicer):  # type: ignore[misc]
    def __init__(self, core: DraCore) -> None:
        self._core = core

    async def NodePrepareResources(  # noqa: N802 (the generated servicer's method name)
        self, request: Any, context: Any
    ) -> Any:
        outcomes = await self._core.prepare(_refs(request.claims))
        answer = dra_pb2.NodePrepareResourcesResponse()
        for uid, outcome in outcomes.items():
            if isinstance(outcome, Refusal):
                answer.claims[uid].error = outcome.message
                continue
            answer.claims[uid].devices.extend(
                dra_pb2.Device(
                    request_names=[d.request],
                    pool_name=d.pool,
                    device_name=d.device,
                    cdi_device_ids=list(d.cdi_ids),
                )
                for d in outcome.devices
            )
        return answer

    async def NodeUnprepareResources(  # noqa: N802 (the generated servicer's method name)
        self, request: Any, context: Any
    ) -> Any:
        errors = await self._core.unprepare(_refs(request.claims))
        answer = dra_pb2.NodeUnprepareResourcesResponse()
        for uid, error in errors.items():
            answer.claims[uid].error = error
        return answer


class _Registration(registration_grpc.RegistrationServicer):  # type: ignore[misc]
    def __init__(
        self, *, driver: str, endpoint: Path, on_registration: Callable[[bool, str], None]
    ) -> None:
        self._driver = driver
        self._endpoint = endpoint
        self._on_registration = on_registration

    async def GetInfo(self, request: Any, context: Any) -> Any:  # noqa: N802 (gRPC's name)
        return registration_pb2.PluginInfo(
            type=PLUGIN_TYPE,
            name=self._driver,
            endpoint=str(self._endpoint),
            supported_versions=[DRA_SERVICE],
        )

    async def NotifyRegistrationStatus(  # noqa: N802 (gRPC's name)
        self, request: Any, context: Any
    ) -> Any:
        self._on_registration(bool(request.plugin_registered), str(request.error))
        return registration_pb2.RegistrationStatusResponse()


def _fresh(path: Path) -> str:
    """The gRPC target for serving at ``path``, after removing what a previous run left."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    return f"unix://{path.absolute()}"


class GrpcDraServer:
    """``DRAPlugin`` of ``core`` on ``endpoint``, registered through ``registration_socket``."""

    def __init__(
        self,
        core: DraCore,
        *,
        driver: str,
        endpoint: Path,
        registration_socket: Path,
        on_registration: Callable[[bool, str], None],
        stop_grace_s: float = 1.0,
    ) -> None:
        self._core = core
        self._driver = driver
        self.endpoint = endpoint
        self.registration_socket = registration_socket
        self._on_registration = on_registration
        self._grace = stop_grace_s
        self._servers: list[Any] = []

    async def start(self) -> None:
        """Serve the plugin, then the registration socket (a plugin registers once it serves)."""
        plugin = grpc.aio.server()
        dra_grpc.add_DRAPluginServicer_to_server(_Plugin(self._core), plugin)
        plugin.add_insecure_port(_fresh(self.endpoint))
        await plugin.start()
        self._servers.append(plugin)
        registration = grpc.aio.server()
        registration_grpc.add_RegistrationServicer_to_server(
            _Registration(
                driver=self._driver, endpoint=self.endpoint, on_registration=self._on_registration
            ),
            registration,
        )
        registration.add_insecure_port(_fresh(self.registration_socket))
        await registration.start()
        self._servers.append(registration)
        log.info(
            "serving the DRA plugin API",
            extra={"socket": str(self.endpoint), "registration": str(self.registration_socket)},
        )

    async def stop(self) -> None:
        """Stop serving; the sockets go, so the kubelet deregisters the plugin."""
        servers, self._servers = self._servers, []
        for server in reversed(servers):
            await server.stop(self._grace)
        for path in (self.registration_socket, self.endpoint):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
