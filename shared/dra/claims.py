"""Pure: a pod's ``gpu.tessera.dev`` ResourceClaims -> what the placement core judges, or every
reason Tessera cannot honour them (docs/design.md §14).

Each request of a claim becomes a :class:`ClaimAsk`: ``count`` GPUs, each a distinct physical GPU,
with ``capacity.requests`` per GPU rounded as the devices' request policy rounds it
(``devices.consumed``), or the whole GPU when it requests no capacity. The core places an ask as
it places a container's shares; the assignment record carries its slices as a container named
``resourceclaims/<claim>/<request>`` (:func:`ask_container`), so the commit rule
(``shared.commits``) covers them unchanged and the node plugin finds a claim's GPUs by name.

What is honoured, and how:

- ``count`` with ``allocationMode: ExactCount``: distinct GPUs (DRA would allow the same shared
  device twice; distinct ones are always a valid allocation).
- CEL selectors of the request and of its DeviceClass: each is compiled here (one that does not
  parse, or calls what the evaluator lacks, is refused now); they are evaluated on each GPU when
  it is chosen (:func:`admits`; the placer: ``PodRequest.gpu_selectors``).
- ``distinctAttribute`` on ``uuid`` or ``index`` (one GPU per value): within a request it holds
  already; across requests of one shape they become one ask of the summed count.
- ``matchAttribute``: kept in the plan and checked on the chosen GPUs
  (:func:`constraint_problem`).
- A claim already allocated (shared by several pods, DRA gives them the same devices): it asks
  for nothing more, and pins the pod to the claim's node.

Refused with the reason (a :class:`~shared.podspec.FieldError` each, all at once): a request of
another device class, ``firstAvailable``, ``allocationMode: All``, ``adminAccess``, tolerations
(Tessera taints only unhealthy GPUs, and never places on them), a capacity other than memory and
compute or not a quantity, ``distinctAttribute`` on another attribute or across requests of
different shapes, a container using two asks (one container's environment holds one slice), a
claim not created yet, claims allocated on different nodes, and a pod that also asks for GPUs
through ``tessera.dev/*`` resources.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Final

import msgspec

from shared.dra import cel
from shared.dra.devices import (
    COMPUTE,
    COMPUTE_TOTAL,
    DEVICE_CLASS,
    DRIVER,
    INDEX,
    MEMORY,
    UUID,
    DeviceDescription,
    MemoryPolicy,
    qualified,
    round_memory,
)
from shared.messages.resourceclaims import DeviceConstraint, DeviceRequest, PodResourceClaim
from shared.podspec import FieldError
from shared.quantity import MIB, QuantityError, parse_quantity

CLAIM_CONTAINER_PREFIX: Final = "resourceclaims/"
NOT_CREATED: Final = "ResourceClaim not created yet"
"""Why a pod whose template's claim the controller has yet to make waits (not a refusal)."""
DISTINCT_PER_GPU: Final = frozenset({qualified(UUID), qualified(INDEX)})
"""Attributes that differ between any two GPUs of a node."""


class ClaimAsk(msgspec.Struct, frozen=True, kw_only=True):
    """GPUs one request (or requests merged by ``distinctAttribute``) of a claim asks for."""

    container: str
    """The name its slices carry in the booking and the record (:func:`ask_container`)."""
    claim: str
    claim_uid: str
    requests: tuple[str, ...]
    count: int
    memory_mib: int | None
    """MiB per GPU as the request policy rounds it; None: all of the GPU's (DRA's default for
    an unrequested capacity), and with ``compute`` None too the whole GPU, exclusively."""
    compute: int | None
    """Percent of each GPU's SMs (100 when only memory is requested); None: the whole GPU."""
    selectors: tuple[str, ...] = ()
    """Every CEL expression each of its GPUs must satisfy (class's, then request's)."""

    @property
    def whole(self) -> bool:
        return self.memory_mib is None and self.compute is None


class ClaimConstraint(msgspec.Struct, frozen=True, kw_only=True):
    """A ``matchAttribute`` to check on the GPUs chosen for the asks it covers."""

    claim: str
    containers: tuple[str, ...]
    """The asks it covers, by :attr:`ClaimAsk.container`."""
    attribute: str
    """Fully qualified."""


class ClaimPlan(msgspec.Struct, frozen=True, kw_only=True):
    """What the pod's Tessera claims ask of the placement."""

    asks: tuple[ClaimAsk, ...] = ()
    node: str = ""
    """The node its already allocated claims are on ("": none is allocated)."""
    constraints: tuple[ClaimConstraint, ...] = ()
    claims: tuple[str, ...] = ()
    """The Tessera claims it covers, by ResourceClaim name."""


def ask_container(claim: str, request: str) -> str:
    """The container name the slices of ``request`` of ``claim`` are booked and recorded under."""
    return f"{CLAIM_CONTAINER_PREFIX}{claim}/{request}"


def claim_of_container(container: str) -> tuple[str, str] | None:
    """``(claim, request)`` of a name made by :func:`ask_container`; None for a real container."""
    if not container.startswith(CLAIM_CONTAINER_PREFIX):
        return None
    claim, _, request = container[len(CLAIM_CONTAINER_PREFIX) :].partition("/")
    return (claim, request) if claim and request else None


def is_tessera_claim(claim: PodResourceClaim) -> bool:
    """Whether any request of ``claim`` is of Tessera's DeviceClass, or its allocation is of
    Tessera's driver: the claims Tessera allocates (or must account for)."""
    return any(r.device_class == DEVICE_CLASS for r in claim.requests) or any(
        d.driver == DRIVER for d in claim.allocated
    )


def _where(index: int, claim: PodResourceClaim) -> str:
    return f"spec.resourceClaims[{index}] (claim {claim.name!r})"


def _capacity(
    request: DeviceRequest, policy: MemoryPolicy, field: str, errors: list[FieldError]
) -> tuple[int | None, int | None]:
    if not request.capacity:
        return None, None
    memory: int | None = None
    compute: int | None = None
    for name, value in sorted(request.capacity.items()):
        short = name.rsplit("/", 1)[-1] if name in (qualified(MEMORY), qualified(COMPUTE)) else name
        where = f"{field}.capacity.requests[{name}]"
        if short not in (MEMORY, COMPUTE):
            errors.append(
                FieldError(
                    field=where, problem=f"not a capacity of {DRIVER}; use {MEMORY} or {COMPUTE}"
                )
            )
            continue
        try:
            amount = parse_quantity(value)
        except QuantityError:
            errors.append(FieldError(field=where, problem=f"{value!r} is not a quantity"))
            continue
        if amount <= 0:
            errors.append(FieldError(field=where, problem=f"{value} must be positive"))
        elif short == MEMORY:
            memory = round_memory(math.ceil(amount / MIB), policy)
        elif amount > COMPUTE_TOTAL:
            errors.append(
                FieldError(field=where, problem=f"{value} is more than {COMPUTE_TOTAL} (percent)")
            )
        else:
            compute = math.ceil(amount)
    # DRA's default for a capacity a slice leaves out: the whole of it.
    return memory, COMPUTE_TOTAL if compute is None else compute


def _request_problems(request: DeviceRequest, field: str, errors: list[FieldError]) -> None:
    unsupported = (
        (request.first_available > 0, "firstAvailable: Tessera allocates exact requests only"),
        (
            request.allocation_mode != "ExactCount",
            f"allocationMode {request.allocation_mode}: ask for a count of GPUs",
        ),
        (request.admin_access, "adminAccess is not supported by Tessera"),
        (
            request.tolerations > 0,
            "tolerations: Tessera taints only unhealthy GPUs and never places on them",
        ),
        (request.count < 1, f"count {request.count} must be at least 1"),
    )
    errors.extend(FieldError(field=field, problem=p) for bad, p in unsupported if bad)
    for expression in (*request.class_selectors, *request.selectors):
        compiled = cel.compile_selector(expression)
        if isinstance(compiled, cel.SelectorProblem):
            errors.append(FieldError(field=f"{field}.selectors", problem=str(compiled)))


def _merged(
    asks: list[ClaimAsk], constraint: DeviceConstraint, field: str, errors: list[FieldError]
) -> list[ClaimAsk]:
    """``asks`` with those a ``distinctAttribute`` on a per-GPU attribute covers made one."""
    covered = [
        a for a in asks if not constraint.requests or set(a.requests) & set(constraint.requests)
    ]
    if len(covered) < 2:
        return asks
    shapes = {(a.memory_mib, a.compute, a.selectors) for a in covered}
    if len(shapes) > 1:
        names = ", ".join(r for a in covered for r in a.requests)
        errors.append(
            FieldError(
                field=field,
                problem=f"distinctAttribute across requests {names} of different sizes or "
                "selectors: Tessera keeps GPUs distinct only within requests of one shape",
            )
        )
        return asks
    first = covered[0]
    merged = msgspec.structs.replace(
        first,
        requests=tuple(r for a in covered for r in a.requests),
        count=sum(a.count for a in covered),
    )
    return [merged if a is first else a for a in asks if a is first or a not in covered]


def _claim(
    index: int,
    claim: PodResourceClaim,
    policy: MemoryPolicy,
    errors: list[FieldError],
) -> tuple[list[ClaimAsk], list[ClaimConstraint]]:
    where = _where(index, claim)
    asks: list[ClaimAsk] = []
    for position, request in enumerate(claim.requests):
        field = f"{where}.spec.devices.requests[{position}] (request {request.name!r})"
        if request.device_class != DEVICE_CLASS:
            errors.append(
                FieldError(
                    field=f"{field}.deviceClassName",
                    problem=f"{request.device_class or 'no class'}: a pod Tessera schedules "
                    f"gets devices of DeviceClass {DEVICE_CLASS} only",
                )
            )
            continue
        _request_problems(request, field, errors)
        memory, compute = _capacity(request, policy, field, errors)
        asks.append(
            ClaimAsk(
                container=ask_container(claim.claim, request.name),
                claim=claim.claim,
                claim_uid=claim.uid,
                requests=(request.name,),
                count=request.count,
                memory_mib=memory,
                compute=compute,
                selectors=(*request.class_selectors, *request.selectors),
            )
        )
    constraints: list[ClaimConstraint] = []
    for position, constraint in enumerate(claim.constraints):
        field = f"{where}.spec.devices.constraints[{position}]"
        if constraint.distinct_attribute:
            attribute = qualified(constraint.distinct_attribute)
            if attribute not in DISTINCT_PER_GPU:
                errors.append(
                    FieldError(
                        field=f"{field}.distinctAttribute",
                        problem=f"{constraint.distinct_attribute}: Tessera keeps GPUs distinct "
                        f"by {UUID} or {INDEX} only",
                    )
                )
                continue
            asks = _merged(asks, constraint, field, errors)
        if constraint.match_attribute:
            covered = tuple(
                a.container
                for a in asks
                if not constraint.requests or set(a.requests) & set(constraint.requests)
            )
            constraints.append(
                ClaimConstraint(
                    claim=claim.claim,
                    containers=covered,
                    attribute=qualified(constraint.match_attribute),
                )
            )
    return asks, constraints


def _containers_problems(
    claims: Sequence[tuple[int, PodResourceClaim]],
    asks: Sequence[ClaimAsk],
    errors: list[FieldError],
) -> None:
    """A container may use one ask: its environment carries one slice's numbers."""
    used: dict[str, set[str]] = {}
    for _, claim in claims:
        for use in claim.used_by:
            for ask in asks:
                if ask.claim == claim.claim and (not use.request or use.request in ask.requests):
                    used.setdefault(use.container, set()).add(ask.container)
    for container, containers in sorted(used.items()):
        if len(containers) > 1:
            errors.append(
                FieldError(
                    field=f"spec.containers (container {container!r}).resources.claims",
                    problem=f"uses {len(containers)} {DRIVER} requests "
                    f"({', '.join(sorted(containers))}); a container takes one",
                )
            )


def plan_claims(
    claims: Iterable[PodResourceClaim],
    *,
    policy: MemoryPolicy,
    gpu_containers: Sequence[str] = (),
) -> ClaimPlan | tuple[FieldError, ...]:
    """The asks of the pod's Tessera claims, or every reason they cannot be honoured.

    ``gpu_containers``: the pod's containers that ask for ``tessera.dev/*`` GPUs (a pod gets its
    GPUs one way or the other, never both).
    """
    errors: list[FieldError] = []
    ours = [(i, c) for i, c in enumerate(claims) if is_tessera_claim(c)]
    if not ours:
        return ClaimPlan()
    if gpu_containers:
        errors.append(
            FieldError(
                field=f"spec.containers (container {gpu_containers[0]!r}).resources.limits",
                problem=f"asks for tessera.dev GPUs beside {DEVICE_CLASS} claims; ask one way",
            )
        )
    asks: list[ClaimAsk] = []
    constraints: list[ClaimConstraint] = []
    nodes: set[str] = set()
    for index, claim in ours:
        if not claim.claim:
            errors.append(FieldError(field=_where(index, claim), problem=NOT_CREATED))
            continue
        if claim.allocated:
            nodes.add(claim.allocated_node)
            continue
        more, checks = _claim(index, claim, policy, errors)
        asks.extend(more)
        constraints.extend(checks)
    if len(nodes) > 1:
        errors.append(
            FieldError(
                field="spec.resourceClaims",
                problem=f"claims are allocated on different nodes: {', '.join(sorted(nodes))}",
            )
        )
    _containers_problems(ours, asks, errors)
    if errors:
        return tuple(errors)
    return ClaimPlan(
        asks=tuple(asks),
        node=next(iter(nodes), ""),
        constraints=tuple(constraints),
        claims=tuple(c.claim for _, c in ours),
    )


def admits(ask: ClaimAsk, device: DeviceDescription) -> bool | cel.SelectorProblem:
    """Whether ``device`` may serve ``ask`` (its selectors), or why that cannot be told."""
    return cel.select(ask.selectors, device)


def constraint_problem(
    plan: ClaimPlan, chosen: Mapping[str, Sequence[DeviceDescription]]
) -> str | None:
    """Why the GPUs ``chosen`` for each ask (by container name) break a ``matchAttribute`` of
    the plan; None when they keep them all."""
    for constraint in plan.constraints:
        values = {
            repr(device.attributes.get(constraint.attribute))
            for container in constraint.containers
            for device in chosen.get(container, ())
        }
        if len(values) > 1 or "None" in values:
            return (
                f"claim {constraint.claim}: matchAttribute {constraint.attribute} does not hold "
                f"on the chosen GPUs ({', '.join(sorted(values))})"
            )
    return None
