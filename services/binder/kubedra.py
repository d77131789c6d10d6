"""The binder's ``resource.k8s.io/v1`` calls (ResourceSlices, ResourceClaims) over the gateway's
kubernetes-asyncio client (``kube.KubeGateway.send``: the same timeouts, retries and metrics).

Claims are written with JSON merge patches carrying ``metadata.resourceVersion``: the API server
takes that as a precondition (409 when someone wrote the claim since it was read), as
kube-scheduler's writes of an allocation are conditional on what it read.
"""

from __future__ import annotations

from typing import Final

import msgspec

from services.binder.gateway import Answer, ApiUnavailableError, Body
from services.binder.kube import FIELD_MANAGER, MERGE_PATCH, KubeGateway
from services.binder.rules.draobjects import ResourceClaim

CLAIMS: Final = "resourceclaims"


class KubeDra:
    """Implements ``slicing.SliceApi`` and ``draclaims.ClaimApi``."""

    def __init__(self, gateway: KubeGateway) -> None:
        self._gateway = gateway

    # --- slices --------------------------------------------------------------------------------

    async def list_slices(self, *, node: str, driver: str) -> list[Body]:
        """The ResourceSlices of ``driver`` on ``node`` (as JSON objects)."""
        selector = f"spec.nodeName={node},spec.driver={driver}"
        answer = await self._gateway.send(
            "list resourceslices",
            lambda api, options: api.list_resource_slice(field_selector=selector, **options),
        )
        if not answer.ok:
            raise ApiUnavailableError(
                "list resourceslices", f"HTTP {answer.code} {answer.reason}: {answer.message}"
            )
        items: list[Body] = msgspec.json.decode(answer.message).get("items") or []
        return items

    async def create_slice(self, body: Body) -> Answer:
        return await self._gateway.send(
            "create resourceslices",
            lambda api, options: api.create_resource_slice(
                body, field_manager=FIELD_MANAGER, **options
            ),
        )

    async def replace_slice(self, name: str, body: Body) -> Answer:
        return await self._gateway.send(
            "update resourceslices",
            lambda api, options: api.replace_resource_slice(
                name, body, field_manager=FIELD_MANAGER, **options
            ),
        )

    async def delete_slice(self, name: str) -> Answer:
        return await self._gateway.send(
            "delete resourceslices",
            lambda api, options: api.delete_resource_slice(name, **options),
        )

    # --- claims --------------------------------------------------------------------------------

    async def read_claim(self, namespace: str, name: str) -> ResourceClaim | None:
        answer = await self._gateway.send(
            f"get {CLAIMS}",
            lambda api, options: api.read_namespaced_resource_claim(name, namespace, **options),
        )
        if answer.code == 404:
            return None
        if not answer.ok:
            raise ApiUnavailableError(
                f"get {CLAIMS}", f"HTTP {answer.code} {answer.reason}: {answer.message}"
            )
        return msgspec.json.decode(answer.message, type=ResourceClaim)

    async def patch_claim(self, namespace: str, name: str, patch: Body) -> Answer:
        return await self._gateway.send(
            f"patch {CLAIMS}",
            lambda api, options: api.patch_namespaced_resource_claim(
                name,
                namespace,
                patch,
                field_manager=FIELD_MANAGER,
                _content_type=MERGE_PATCH,
                **options,
            ),
        )

    async def patch_claim_status(self, namespace: str, name: str, patch: Body) -> Answer:
        return await self._gateway.send(
            f"patch {CLAIMS}/status",
            lambda api, options: api.patch_namespaced_resource_claim_status(
                name,
                namespace,
                patch,
                field_manager=FIELD_MANAGER,
                _content_type=MERGE_PATCH,
                **options,
            ),
        )
