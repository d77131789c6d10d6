"""Pure: kube-scheduler's extender v1 JSON and the placer's answers to it (issue 14).

The types are ``k8s.io/kube-scheduler/extender/v1`` as kube-scheduler's ``HTTPExtender`` sends and
reads them: Go's ``encoding/json`` without tags, so the keys are the Go field names (``Pod``,
``Nodes``, ``NodeNames``, ``FailedNodes``, ``FailedAndUnresolvableNodes``, ``Error``, ``Host``,
``Score``, ``PodName``, ``PodNamespace``, ``PodUID``, ``Node``). kube-scheduler POSTs to
``<urlPrefix>/<verb>``:

- ``filter`` and ``prioritize`` take :class:`ExtenderArgs`: the pod, and the candidate nodes as
  full objects (``Nodes``, a ``v1.NodeList``) or, when the extender is ``nodeCacheCapable``, by
  name only (``NodeNames``); the other one is ``null``. ``filter`` answers
  :class:`ExtenderFilterResult` in the same form it was asked in (kube-scheduler reads
  ``NodeNames`` only from a node-cache-capable extender, and takes the node objects of ``Nodes``
  as they come back, so those are echoed byte for byte). ``prioritize`` answers a list of
  :class:`HostPriority`, scores 0..:data:`MAX_PRIORITY`, which kube-scheduler multiplies by the
  extender's weight and by 10 (its own plugins score 0..100).
- ``bind`` takes :class:`ExtenderBindingArgs` (the pod by namespace, name and UID, and the node
  kube-scheduler chose) and answers :class:`ExtenderBindingResult`, ``Error`` empty on success.

kube-scheduler counts the ``FailedNodes`` messages into its ``FailedScheduling`` Event and the
pod's ``PodScheduled`` condition (``0/5 nodes are available: 3 insufficient GPU memory or cores,
2 node(s) had untolerated taint``), which is why each failed node carries the reason the placer's
rejections count. A node that no eviction can make fit goes to ``FailedAndUnresolvableNodes``
instead, so kube-scheduler's preemption leaves it alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import msgspec

from services.placer.rules.decider import NodeVerdict
from shared.kubeobjects import Pod

MAX_PRIORITY: Final = 10
"""``extenderv1.MaxExtenderPriority``."""


class BadRequestError(ValueError):
    """A request kube-scheduler would never send: answered 400 with this reason."""


class _Name(msgspec.Struct, frozen=True):
    name: str = ""


class _Named(msgspec.Struct, frozen=True):
    metadata: _Name = _Name()


_node_name = msgspec.json.Decoder(_Named)


class NodeList(msgspec.Struct, frozen=True, kw_only=True):
    """A ``v1.NodeList`` whose items are kept as sent (kube-scheduler reads them back)."""

    metadata: dict[str, Any] = {}
    items: list[msgspec.Raw] | None = None


class ExtenderArgs(msgspec.Struct, frozen=True, kw_only=True, rename="pascal"):
    """What ``filter`` and ``prioritize`` receive."""

    pod: Pod
    nodes: NodeList | None = None
    node_names: list[str] | None = None

    def candidates(self) -> list[str]:
        """The candidate nodes' names, in kube-scheduler's order."""
        if self.node_names is not None:
            return self.node_names
        if self.nodes is not None:
            names = []
            for item in self.nodes.items or ():
                try:
                    name = _node_name.decode(item).metadata.name
                except msgspec.DecodeError as error:
                    raise BadRequestError(f"Nodes.items: {error}") from None
                if not name:
                    raise BadRequestError("Nodes.items: a node without metadata.name")
                names.append(name)
            return names
        raise BadRequestError("neither Nodes nor NodeNames lists the candidate nodes")


class ExtenderFilterResult(msgspec.Struct, kw_only=True, rename="pascal", omit_defaults=False):
    nodes: NodeList | None = None
    node_names: list[str] | None = None
    failed_nodes: dict[str, str] = {}
    failed_and_unresolvable_nodes: dict[str, str] = {}
    error: str = ""


class HostPriority(msgspec.Struct, frozen=True, kw_only=True, rename="pascal"):
    host: str
    score: int


class ExtenderBindingArgs(msgspec.Struct, frozen=True, kw_only=True, rename="pascal"):
    pod_name: str
    pod_namespace: str
    pod_uid: str = msgspec.field(name="PodUID")
    node: str

    def check(self) -> None:
        for field, value in (
            ("PodName", self.pod_name),
            ("PodNamespace", self.pod_namespace),
            ("PodUID", self.pod_uid),
            ("Node", self.node),
        ):
            if not value:
                raise BadRequestError(f"{field} must not be empty")


class ExtenderBindingResult(msgspec.Struct, frozen=True, kw_only=True, rename="pascal"):
    error: str = ""


_filter_args = msgspec.json.Decoder(ExtenderArgs)
_binding_args = msgspec.json.Decoder(ExtenderBindingArgs)


def filter_args(body: bytes) -> ExtenderArgs:
    """The decoded ``filter``/``prioritize`` request; BadRequestError says what is wrong."""
    try:
        return _filter_args.decode(body)
    except msgspec.DecodeError as error:
        raise BadRequestError(f"not an ExtenderArgs: {error}") from None


def binding_args(body: bytes) -> ExtenderBindingArgs:
    """The decoded ``bind`` request; BadRequestError says what is wrong."""
    try:
        args = _binding_args.decode(body)
    except msgspec.DecodeError as error:
        raise BadRequestError(f"not an ExtenderBindingArgs: {error}") from None
    args.check()
    return args


def passed(
    args: ExtenderArgs, candidates: Sequence[str], names: Sequence[str]
) -> ExtenderFilterResult:
    """``names`` (of ``args.candidates()``, given as ``candidates``) pass, in the form they were
    asked in; nothing is said of the others."""
    if args.node_names is not None or args.nodes is None:
        return ExtenderFilterResult(node_names=list(names))
    kept = set(names)
    items = [
        item for item, name in zip(args.nodes.items or (), candidates, strict=True) if name in kept
    ]
    return ExtenderFilterResult(nodes=NodeList(metadata=args.nodes.metadata, items=items))


def filter_result(
    args: ExtenderArgs, candidates: Sequence[str], verdicts: Sequence[NodeVerdict]
) -> ExtenderFilterResult:
    """The nodes that fit pass; every other one fails with its reason (``verdicts`` judge
    ``candidates``, in order)."""
    result = passed(args, candidates, [v.node for v in verdicts if v.fits])
    for verdict in verdicts:
        if verdict.fits:
            continue
        if verdict.unresolvable:
            result.failed_and_unresolvable_nodes[verdict.node] = verdict.reason
        else:
            result.failed_nodes[verdict.node] = verdict.reason
    return result


def refused(args: ExtenderArgs, candidates: Sequence[str], reason: str) -> ExtenderFilterResult:
    """Every candidate fails with ``reason``, which no node and no eviction can change (an
    invalid request)."""
    result = passed(args, candidates, [])
    result.failed_and_unresolvable_nodes = dict.fromkeys(candidates, reason)
    return result


def priorities(verdicts: Sequence[NodeVerdict]) -> list[HostPriority]:
    """Scores 0..10: the fitting nodes' totals rescaled so that the node the profile prefers
    most gets 10 and the one it prefers least 0 (all 10 when they are equal); a node that does
    not fit gets 0."""
    fitting = [v.score for v in verdicts if v.fits]
    low, high = (min(fitting), max(fitting)) if fitting else (0.0, 0.0)
    span = high - low

    def scaled(verdict: NodeVerdict) -> int:
        if not verdict.fits:
            return 0
        if span <= 0:
            return MAX_PRIORITY
        return round(MAX_PRIORITY * (verdict.score - low) / span)

    return [HostPriority(host=v.node, score=scaled(v)) for v in verdicts]


def indifferent(names: Sequence[str]) -> list[HostPriority]:
    """No preference (a pod Tessera has no say in)."""
    return [HostPriority(host=name, score=0) for name in names]
