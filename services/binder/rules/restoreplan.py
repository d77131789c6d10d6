"""What to restore of a bound pod when NATS lost its store (pure; docs/design.md §12).

The Kubernetes API is the durable truth for what is bound: a pod the binder bound carries its
placement in ``tessera.dev/assignment`` (node, per-container GPU slices, decision time, placer,
commit). :func:`restore_of` turns such a pod into the :class:`PodRestore` a placer books, claims
and records again, or says why it cannot: an annotation a pod's owner altered into nonsense is
refused, never guessed at (its pod keeps running; it is counted and logged).
"""

from __future__ import annotations

from shared import annotations as names
from shared import codec
from shared.kubeobjects import Pod, epoch
from shared.messages.base import ContainerSlices
from shared.messages.pods import PodRestore
from shared.podspec import InvalidPod, parse_pending


def restore_of(pod: Pod, *, store_epoch: str) -> PodRestore | str:
    """The placement of bound pod ``pod`` to restore into the store of ``store_epoch``, or why
    there is none to restore."""
    meta = pod.metadata
    if not pod.node:
        return "not bound"
    raw = (meta.annotations or {}).get(names.ASSIGNMENT)
    if raw is None:
        return f"bound without a {names.ASSIGNMENT} annotation"
    try:
        placed = codec.decode(raw, names.AssignmentAnnotation)
    except codec.DecodeError as error:
        return f"{names.ASSIGNMENT} does not read: {error}"
    if placed.node != pod.node:
        return f"{names.ASSIGNMENT} names node {placed.node}, the pod is bound to {pod.node}"
    request = parse_pending(pod, strict_constraints=False)
    if isinstance(request, InvalidPod):
        return f"its spec no longer reads as a Tessera request: {request.errors[0].problem}"
    asked = {c.name: c for c in request.containers}
    containers = []
    for annotated in placed.containers:
        container = asked.get(annotated.container)
        if container is None or container.gpu_shares != len(annotated.gpus):
            return (
                f"{names.ASSIGNMENT} gives container {annotated.container!r} "
                f"{len(annotated.gpus)} GPU shares; its spec asks for "
                f"{container.gpu_shares if container else 0}"
            )
        if len({g.uuid for g in annotated.gpus}) != len(annotated.gpus):
            return f"{names.ASSIGNMENT} puts two shares of {annotated.container!r} on one GPU"
        containers.append(
            ContainerSlices(
                container=annotated.container, gpus=annotated.gpus, resources=container.resources
            )
        )
    if sum(c.gpu_shares for c in request.containers) != sum(len(c.gpus) for c in containers):
        return f"{names.ASSIGNMENT} leaves GPU containers of the pod without slices"
    annotations = meta.annotations or {}
    # The kubelet runs a pod only once its device plugin allocated every container: a Running
    # pod's record was allocated, marked (``tessera.dev/assigned``) or not yet when the store
    # was lost. Restored ``bound``, it held its node's ambiguity gate shut, nobody to allocate it.
    allocated = annotations.get(names.ASSIGNED) == "true" or pod.status.phase == "Running"
    return PodRestore(
        pod=request,
        node=pod.node,
        containers=tuple(containers),
        decided_at=placed.decided_at,
        placer_id=placed.placer_id,
        commit=placed.commit or f"restored.{meta.uid}",
        state="allocated" if allocated else "bound",
        bound_at=epoch(annotations.get(names.BIND_TIME)) or None,
        epoch=store_epoch,
    )
