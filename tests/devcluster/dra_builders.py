"""Builders of ``resource.k8s.io/v1`` objects for the DRA tests (valid unless changed)."""

from __future__ import annotations

import uuid
from typing import Any

Obj = dict[str, Any]

DRIVER = "gpu.test.tessera.dev"
CLASS = "test-gpu"
API = "/apis/resource.k8s.io/v1"


def device_class(name: str = CLASS, driver: str = DRIVER) -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]},
    }


def device(name: str, **extra: Any) -> Obj:
    return {
        "name": name,
        "attributes": {"uuid": {"string": f"GPU-{name}"}, "index": {"int": 0}},
        "capacity": {"memory": {"value": "80Gi"}},
        **extra,
    }


def resource_slice(
    name: str = "node-a-gpus",
    node: str = "node-a",
    devices: list[Obj] | None = None,
    driver: str = DRIVER,
    **spec: Any,
) -> Obj:
    body: Obj = {
        "driver": driver,
        "nodeName": node,
        "pool": {"name": node, "generation": 0, "resourceSliceCount": 1},
        "devices": [device("gpu-0")] if devices is None else devices,
    }
    body.update(spec)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {k: v for k, v in body.items() if v is not None},
    }


def request(name: str = "gpu", **exactly: Any) -> Obj:
    return {"name": name, "exactly": {"deviceClassName": CLASS, **exactly}}


def claim_spec(*requests: Obj) -> Obj:
    return {"devices": {"requests": list(requests) or [request()]}}


def claim(name: str = "claim", *requests: Obj, namespace: str = "default") -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": claim_spec(*requests),
    }


def template(name: str = "one-gpu", *requests: Obj, namespace: str = "default") -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"spec": claim_spec(*requests)},
    }


def result(device_name: str = "gpu-0", request_name: str = "gpu", **extra: Any) -> Obj:
    return {
        "request": request_name,
        "driver": DRIVER,
        "pool": "node-a",
        "device": device_name,
        **extra,
    }


def allocation(*results: Obj, node: str = "node-a") -> Obj:
    return {
        "devices": {"results": list(results) or [result()]},
        "nodeSelector": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
            ]
        },
    }


def consumer(pod: str, uid: str | None = None) -> Obj:
    return {"resource": "pods", "name": pod, "uid": uid or str(uuid.uuid4())}


def pod_with_claims(
    name: str,
    claims: list[Obj],
    container_claims: list[Obj] | None = None,
    namespace: str = "default",
) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "cuda:12",
                    "resources": {
                        "claims": [{"name": c["name"]} for c in claims]
                        if container_claims is None
                        else container_claims
                    },
                }
            ],
            "resourceClaims": claims,
        },
    }
