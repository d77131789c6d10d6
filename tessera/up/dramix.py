"""The built-in mix of ``tessera up --dra``: the same kinds of pods as ``workload.builtin``,
asking for their GPUs through ResourceClaims of class ``gpu.tessera.dev``.

Each shape is one ResourceClaimTemplate (created before the pods): whole GPUs (``count`` and no
capacity), slices (``capacity.requests`` of ``memory`` and ``compute``), two distinct GPUs
(``distinctAttribute``), model choices as CEL selectors on the ``model`` attribute. A pod names
its template in ``spec.resourceClaims`` and each GPU container the claim in
``resources.claims``; the pod annotations of the device-plugin mix (GPU policy) apply as before.
"""

from __future__ import annotations

from typing import Any, Final

from shared.dra.devices import DEVICE_CLASS, DRIVER
from tessera.up.workload import NAMESPACE, container, dealt, pod

Obj = dict[str, Any]
A100: Final = f'device.attributes["{DRIVER}"].model.startsWith("A100")'
T4: Final = f'device.attributes["{DRIVER}"].model.startsWith("T4")'


def template(
    name: str,
    *,
    count: int = 1,
    memory: str = "",
    compute: str = "",
    selector: str = "",
    distinct: bool = False,
    namespace: str = NAMESPACE,
) -> Obj:
    """A ResourceClaimTemplate of one request ``gpu`` of Tessera's class."""
    exactly: Obj = {"deviceClassName": DEVICE_CLASS, "count": count}
    requests = {k: v for k, v in (("memory", memory), ("compute", compute)) if v}
    if requests:
        exactly["capacity"] = {"requests": requests}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    devices: Obj = {"requests": [{"name": "gpu", "exactly": exactly}]}
    if distinct:
        devices["constraints"] = [{"distinctAttribute": f"{DRIVER}/uuid"}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"spec": {"devices": devices}},
    }


TEMPLATES: Final[dict[str, Obj]] = {
    t["metadata"]["name"]: t
    for t in (
        template("gpu-whole"),
        template("gpu-whole-x2", count=2, distinct=True),
        template("slice-8g-25", memory="8Gi", compute="25"),
        template("slice-16g-20", memory="16Gi", compute="20"),
        template("slice-4g-10", memory="4Gi", compute="10"),
        template("slice-2g-10", memory="2Gi", compute="10"),
        template("slice-6g-30", memory="6Gi", compute="30"),
        template("slice-10g-30-x2", count=2, memory="10Gi", compute="30"),
        template("t4-4g-20", memory="4Gi", compute="20", selector=T4),
        template("not-a100-4g-20", memory="4Gi", compute="20", selector=f"!{A100}"),
        template("too-big", memory="1000000Mi", compute="10"),
    )
}


def claimed(name: str, claim: str = "gpu", *, cpu: str = "500m", memory: str = "1Gi") -> Obj:
    """A container using the pod's claim ``claim``."""
    spec = container(name, cpu=cpu, memory=memory)
    spec["resources"]["claims"] = [{"name": claim}]
    return spec


def claim_pod(
    name: str,
    containers: list[Obj],
    claims: dict[str, str],
    *,
    annotations: dict[str, str] | None = None,
) -> Obj:
    """A pod whose ``claims`` (pod claim name -> template) are made from templates."""
    made = pod(name, containers, annotations=annotations)
    made["spec"]["resourceClaims"] = [
        {"name": claim, "resourceClaimTemplateName": template_name}
        for claim, template_name in claims.items()
    ]
    return made


def _entry(kind: str, n: int) -> Obj:
    name = f"{kind}-{n}"
    single = {
        "train": ("gpu-whole", {}),
        "train-2gpu": ("gpu-whole-x2", {}),
        "infer": ("slice-8g-25", {}),
        "notebook": ("slice-16g-20", {"tessera.dev/gpu-policy": "binpack"}),
        "spread": ("slice-4g-10", {"tessera.dev/gpu-policy": "spread"}),
        "shard": ("slice-10g-30-x2", {}),
        "t4": ("t4-4g-20", {}),
        "not-a100": ("not-a100-4g-20", {}),
        "too-big": ("too-big", {}),
    }
    if kind in single:
        template_name, annotations = single[kind]
        large = kind.startswith("train")
        main = claimed("main", cpu="4" if large else "500m", memory="16Gi" if large else "1Gi")
        return claim_pod(name, [main], {"gpu": template_name}, annotations=annotations)
    if kind == "pipeline":
        return claim_pod(
            name,
            [
                claimed("reader", "reader"),
                claimed("model", "model"),
                container("sidecar", cpu="100m", memory="128Mi"),
            ],
            {"reader": "slice-2g-10", "model": "slice-6g-30"},
            annotations={"tessera.dev/gpu-policy": "colocate"},
        )
    if kind == "cpu":
        return pod(
            name,
            [container(cpu="2", memory="4Gi")],
            annotations={"tessera.dev/node-policy": "balanced"},
        )
    raise ValueError(kind)


def builtin_dra(count: int = 40) -> list[Obj]:
    """The templates, then ``count`` pods of the mix (the last one no GPU can hold)."""
    pods = dealt(count, _entry)
    used = {
        entry["resourceClaimTemplateName"]
        for made in pods
        for entry in made["spec"].get("resourceClaims") or []
    }
    return [TEMPLATES[name] for name in TEMPLATES if name in used] + pods


def slice_burst(
    count: int,
    *,
    gpu_memory: str = "8Gi",
    compute: str = "25",
    cpu: str = "500m",
    memory: str = "1Gi",
    prefix: str = "burst",
) -> list[Obj]:
    """A template of one slice, then ``count`` identical pods, each with its own claim from it
    (the burst benchmark's DRA side)."""
    shape = template(f"{prefix}-slice", memory=gpu_memory, compute=compute)
    pods = [
        claim_pod(
            f"{prefix}-{i}",
            [claimed("main", cpu=cpu, memory=memory)],
            {"gpu": f"{prefix}-slice"},
        )
        for i in range(count)
    ]
    return [shape, *pods]
