"""Pure: a pod's spec, annotations and labels (docs/design.md §3) into a ``PodPending``, or the
field-precise reasons it cannot be one.

Every problem names the field as ``kubectl explain`` would (``spec.containers[0].resources.limits
[tessera.dev/gpu-cores]``, ``metadata.annotations[tessera.dev/gpu-policy]``) and says what is
allowed, so the Pending message tells the user exactly what to change. All problems are reported at
once. An invalid pod is never published; the binder explains it on the pod instead, and the
placer's scheduler extender answers kube-scheduler with the same reasons (every node fails).

Shared by the binder (pods from its informer) and the placer's extender (the pod kube-scheduler
sends), so a pod is read the same way in both modes.

The pod's scheduling constraints (``nodeSelector``, affinity, tolerations, topology spread) are
read by ``shared.scheduling``: a field or value Tessera does not implement is one more problem.

Rules beyond the placer's own checks (these are refused here so the placer never decides them):
unknown ``tessera.dev/`` resources or annotations (a typo must not be silently ignored), Tessera
resources on init containers (the device plugin hands devices to app containers only), a slice
(memory or cores) on a ``gpu-type: physical`` pod, a ``gpu-type: virtual`` container without
one, and more than ``MAX_GPU_CONTAINERS`` (64) containers with GPUs (an assignment record holds at
most that many: the device plugin would refuse it and the pod fail admission once bound).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final, cast, get_args

import msgspec

from shared import annotations as names
from shared.kubeobjects import Container, Pod, Quantity, epoch
from shared.messages.base import GpuPolicy, GpuType, NodePolicy
from shared.messages.pods import ContainerRequest, PlacementHints, PodPending
from shared.quantity import QuantityError, mebibytes, milli, parse_quantity
from shared.scheduling import constraints_of
from shared.validation import MAX_GPU_CONTAINERS, MAX_GPU_MEMORY_MIB

GPU_POLICIES: Final[tuple[str, ...]] = get_args(GpuPolicy)
NODE_POLICIES: Final[tuple[str, ...]] = get_args(NodePolicy)
GPU_TYPES: Final[tuple[str, ...]] = get_args(GpuType)
MODEL_SEPARATORS: Final = ("|", ",")
_SUFFIX: Final = re.compile(r"^[+-]?[0-9.]+(Ki|Mi|Gi|Ti|Pi|Ei)$")
"""A quantity written with a binary byte-size suffix. Decimal suffixes are not: the API server
itself writes a plain 1000000 as ``1M`` (its canonical form), so they may be nobody's unit."""
_FRACTION: Final = re.compile(r"^[+-]?[0-9.]+(?:([num])|[eE]-[0-9]+)$")
"""A quantity written in thousandths or finer (``2000m``, ``2e-3``): not a count of MiB."""


class FieldError(msgspec.Struct, frozen=True, kw_only=True):
    """One problem: the field, and what is wrong with it and what is allowed."""

    field: str
    problem: str

    def __str__(self) -> str:
        return f"{self.field}: {self.problem}"


class InvalidPod(msgspec.Struct, frozen=True, kw_only=True):
    """A Tessera pod whose request cannot be placed as written."""

    uid: str
    namespace: str
    name: str
    errors: tuple[FieldError, ...]

    @property
    def message(self) -> str:
        return "; ".join(str(e) for e in self.errors)

    @property
    def reason(self) -> str:
        """The one line the binder writes on the pod (``PodScheduled`` message and Event) and
        the admission webhook answers ``kubectl apply`` with."""
        return f"Tessera cannot place this pod as written: {self.message}"


def _allowed(values: tuple[str, ...]) -> str:
    return ", ".join(values)


def _count(
    value: Quantity, field: str, errors: list[FieldError], *, low: int, high: int | None = None
) -> int | None:
    try:
        number = parse_quantity(value)
    except QuantityError:
        errors.append(FieldError(field=field, problem=f"{value!r} is not a quantity"))
        return None
    allowed = f"{low}..{high}" if high is not None else f"a whole number >= {low}"
    if number.denominator != 1 or number < low or (high is not None and number > high):
        errors.append(FieldError(field=field, problem=f"{value} is not allowed; use {allowed}"))
        return None
    return int(number)


def gpu_memory_problem(value: Quantity) -> str | None:
    """Why a ``tessera.dev/gpu-memory`` value is refused before it is counted: written with a
    binary unit (``1Gi`` would ask 1,073,741,824 MiB), in thousandths (``2000m`` is 2 MiB, not
    2000), or above the 1 TiB no GPU has. None when none of these (or when the value is not a
    quantity at all: :func:`_count` says so)."""
    text = value.strip() if isinstance(value, str) else ""
    try:
        number = parse_quantity(value)
        mib = mebibytes(value)
    except QuantityError:
        return None
    if _SUFFIX.match(text):
        return (
            f"{value!r} has a unit, but {names.GPU_MEMORY} counts MiB and takes a plain number; "
            f"for {value} write {mib}"
        )
    fraction = _FRACTION.match(text)
    if fraction:
        shown = f"{number.numerator}" if number.denominator == 1 else f"{float(number):g}"
        meant = text[:-1] if fraction.group(1) else ""
        scale = {"n": "n is billionths", "u": "u is millionths", "m": "m is thousandths"}
        return (
            f"{value!r} means {shown} ({scale.get(fraction.group(1) or '', 'a fraction')}), but "
            f"{names.GPU_MEMORY} counts MiB and takes a plain number"
            + (f"; for {meant} MiB write {meant}" if meant else "")
        )
    if number.denominator == 1 and number > MAX_GPU_MEMORY_MIB:
        return f"asks {number} MiB per GPU; no GPU has more than {MAX_GPU_MEMORY_MIB} MiB (1 TiB)"
    return None


def _tessera_limits(container: Container) -> Mapping[str, Quantity]:
    limits = container.resources.limits or {}
    requests = container.resources.requests or {}
    merged = {k: v for k, v in requests.items() if k.startswith(names.PREFIX)}
    merged.update({k: v for k, v in limits.items() if k.startswith(names.PREFIX)})
    return merged


def container_request(container: Container, resource: str) -> Quantity | None:
    """What ``container`` requests of ``resource``: its request, else its limit (as Kubernetes
    defaults a request from the limit)."""
    requests = container.resources.requests or {}
    limits = container.resources.limits or {}
    return requests.get(resource, limits.get(resource))


def _container(
    container: Container, index: int, gpu_type: str | None, errors: list[FieldError]
) -> ContainerRequest:
    path = f"spec.containers[{index}]"
    limits = _tessera_limits(container)

    def where(resource: str) -> str:
        return f"{path}.resources.limits[{resource}] (container {container.name!r})"

    for resource in limits:
        if resource not in names.RESOURCES:
            errors.append(
                FieldError(
                    field=where(resource),
                    problem=f"unknown Tessera resource; known: {_allowed(names.RESOURCES)}",
                )
            )
    counts: dict[str, int] = {}
    bounds = {
        names.GPU: (0, None),
        names.GPU_MEMORY: (1, None),
        names.GPU_MEMORY_PERCENTAGE: (1, 100),
        names.GPU_CORES: (1, 100),
    }
    for resource, (low, high) in bounds.items():
        if resource not in limits:
            continue
        if resource == names.GPU_MEMORY:
            problem = gpu_memory_problem(limits[resource])
            if problem is not None:
                errors.append(FieldError(field=where(resource), problem=problem))
                continue
        count = _count(limits[resource], where(resource), errors, low=low, high=high)
        if count is not None:
            counts[resource] = count
    shares = counts.get(names.GPU, 0)
    slice_given = [r for r in names.RESOURCES[1:] if r in limits]
    if slice_given and names.GPU not in limits:
        errors.append(
            FieldError(
                field=where(slice_given[0]),
                problem=f"needs {names.GPU} (the number of GPU shares) in the same container "
                f"(for one share, add {names.GPU}: 1)",
            )
        )
    elif slice_given and names.GPU in counts and shares == 0:
        errors.append(
            FieldError(
                field=where(names.GPU),
                problem=f"must be at least 1 when {', '.join(slice_given)} is set",
            )
        )
    if names.GPU_MEMORY in limits and names.GPU_MEMORY_PERCENTAGE in limits:
        errors.append(
            FieldError(
                field=where(names.GPU_MEMORY_PERCENTAGE),
                problem=f"give GPU memory either as {names.GPU_MEMORY} (MiB) or as "
                f"{names.GPU_MEMORY_PERCENTAGE}, not both",
            )
        )
    if shares and gpu_type == "physical" and slice_given:
        errors.append(
            FieldError(
                field=where(slice_given[0]),
                problem=f"{names.GPU_TYPE}: physical takes whole GPUs; remove "
                f"{', '.join(slice_given)} or use {names.GPU_TYPE}: virtual",
            )
        )
    if shares and gpu_type == "virtual" and not slice_given:
        errors.append(
            FieldError(
                field=where(names.GPU),
                problem=f"{names.GPU_TYPE}: virtual needs a slice per share: set "
                f"{names.GPU_MEMORY}, {names.GPU_MEMORY_PERCENTAGE} or {names.GPU_CORES}",
            )
        )
    cpu_milli = memory_mib = 0
    for resource, convert in (("cpu", milli), ("memory", mebibytes)):
        value = container_request(container, resource)
        if value is None:
            continue
        try:
            amount = convert(value)
        except QuantityError:
            errors.append(
                FieldError(
                    field=f"{path}.resources.requests[{resource}]",
                    problem=f"{value!r} is not a quantity",
                )
            )
            continue
        if resource == "cpu":
            cpu_milli = amount
        else:
            memory_mib = amount
    return ContainerRequest(
        name=container.name,
        gpu_shares=shares,
        gpu_memory_mib=counts.get(names.GPU_MEMORY),
        gpu_memory_pct=counts.get(names.GPU_MEMORY_PERCENTAGE),
        gpu_cores=counts.get(names.GPU_CORES),
        cpu_milli=cpu_milli,
        memory_mib=memory_mib,
        resources=dict(counts),
    )


def _choice(
    annotations: Mapping[str, str], key: str, allowed: tuple[str, ...], errors: list[FieldError]
) -> str | None:
    if key not in annotations:
        return None
    value = annotations[key].strip()
    if value not in allowed:
        errors.append(
            FieldError(
                field=f"metadata.annotations[{key}]",
                problem=f"{annotations[key]!r} is not one of {_allowed(allowed)}",
            )
        )
        return None
    return value


def _models(annotations: Mapping[str, str], key: str, errors: list[FieldError]) -> tuple[str, ...]:
    if key not in annotations:
        return ()
    text = annotations[key]
    for separator in MODEL_SEPARATORS[1:]:
        text = text.replace(separator, MODEL_SEPARATORS[0])
    models = tuple(m.strip() for m in text.split(MODEL_SEPARATORS[0]))
    if not models or any(not m for m in models):
        errors.append(
            FieldError(
                field=f"metadata.annotations[{key}]",
                problem=f"{annotations[key]!r} must list GPU models separated by '|' "
                '(for example "A100|H100"), with no empty entry',
            )
        )
        return ()
    return models


def _hints(pod: Pod, errors: list[FieldError]) -> PlacementHints:
    meta = pod.metadata
    annotations = meta.annotations or {}
    labels = meta.labels or {}
    known = (*names.USER_ANNOTATIONS, *names.WRITTEN)
    for key in sorted(annotations):
        if key.startswith(names.PREFIX) and key not in known:
            errors.append(
                FieldError(
                    field=f"metadata.annotations[{key}]",
                    problem=f"unknown Tessera annotation; known: "
                    f"{_allowed(names.USER_ANNOTATIONS)}",
                )
            )
    included = _models(annotations, names.GPU_MODEL, errors)
    excluded = _models(annotations, names.GPU_MODEL_EXCLUDE, errors)
    both = sorted(set(included) & set(excluded))
    if both:
        errors.append(
            FieldError(
                field=f"metadata.annotations[{names.GPU_MODEL_EXCLUDE}]",
                problem=f"excludes {', '.join(both)}, which {names.GPU_MODEL} requires",
            )
        )
    group: str | None = None
    if names.GROUP in annotations:
        group = annotations[names.GROUP].strip()
        if not group:
            errors.append(
                FieldError(
                    field=f"metadata.annotations[{names.GROUP}]",
                    problem="must name a resource group",
                )
            )
            group = None
    gpu_type = cast(GpuType | None, _choice(annotations, names.GPU_TYPE, GPU_TYPES, errors))
    priority_label: int | None = None
    if names.PRIORITY_LABEL in labels:
        try:
            priority_label = int(labels[names.PRIORITY_LABEL])
        except ValueError:
            errors.append(
                FieldError(
                    field=f"metadata.labels[{names.PRIORITY_LABEL}]",
                    problem=f"{labels[names.PRIORITY_LABEL]!r} is not an integer",
                )
            )
    return PlacementHints(
        gpu_policy=cast(
            GpuPolicy | None, _choice(annotations, names.GPU_POLICY, GPU_POLICIES, errors)
        ),
        node_policy=cast(
            NodePolicy | None, _choice(annotations, names.NODE_POLICY, NODE_POLICIES, errors)
        ),
        gpu_models=included,
        gpu_models_excluded=excluded,
        gpu_type=gpu_type,
        group=group,
        tenant=labels.get(names.TENANT_LABEL, ""),
        priority_label=priority_label,
    )


def requests_tessera(pod: Pod) -> bool:
    """Whether any container (init containers too) asks for a ``tessera.dev/*`` resource: the
    pods kube-scheduler sends to the extender (its ``managedResources`` test)."""
    for container in (*pod.spec.containers, *(pod.spec.init_containers or ())):
        if _tessera_limits(container):
            return True
    return False


def parse_pending(
    pod: Pod,
    namespaces: Mapping[str, Mapping[str, str]] | None = None,
    *,
    strict_constraints: bool = True,
) -> PodPending | InvalidPod:
    """The pod as the placer's input, or every reason it cannot be placed as written.

    ``namespaces``: every namespace's labels, for pod-affinity namespace selectors
    (``shared.scheduling``). Without ``strict_constraints`` (a pod kube-scheduler schedules,
    extender mode, or one bound already), constraints Tessera cannot read are kube-scheduler's
    business, not a reason to refuse the pod: the pod then carries none."""
    errors: list[FieldError] = []
    hints = _hints(pod, errors)
    constraints, problems = constraints_of(pod, namespaces)
    if strict_constraints:
        errors.extend(FieldError(field=field, problem=problem) for field, problem in problems)
    elif problems:
        constraints = None
    for index, container in enumerate(pod.spec.init_containers or ()):
        for resource in _tessera_limits(container):
            errors.append(
                FieldError(
                    field=f"spec.initContainers[{index}].resources.limits[{resource}] "
                    f"(container {container.name!r})",
                    problem="init containers cannot ask for Tessera GPUs; move the request to "
                    "an app container",
                )
            )
    containers = tuple(
        _container(c, i, hints.gpu_type, errors) for i, c in enumerate(pod.spec.containers)
    )
    with_gpus = sum(1 for c in containers if c.gpu_shares)
    if with_gpus > MAX_GPU_CONTAINERS:
        errors.append(
            FieldError(
                field="spec.containers",
                problem=f"{with_gpus} containers ask for {names.GPU}; at most "
                f"{MAX_GPU_CONTAINERS} per pod can be handed GPUs",
            )
        )
    meta = pod.metadata
    if errors:
        return InvalidPod(
            uid=meta.uid, namespace=meta.namespace, name=meta.name, errors=tuple(errors)
        )
    return PodPending(
        uid=meta.uid,
        namespace=meta.namespace,
        name=meta.name,
        containers=containers,
        priority=pod.spec.priority or 0,
        hints=hints,
        created_at=epoch(meta.creation_timestamp),
        resource_version=meta.resource_version,
        labels=dict(meta.labels or {}),
        constraints=constraints,
    )
