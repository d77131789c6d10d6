"""Pure: the binder's side of extender mode (issue 14): which pods are Tessera's, and the answer
to the placer's extender when it asks for the pod kube-scheduler is binding.

In extender mode kube-scheduler schedules ordinary pods (``spec.schedulerName`` one of
``extender_scheduler_names``, ``default-scheduler`` unless configured) that ask for
``tessera.dev/*`` resources, and calls the placer's extender to filter, prioritize and bind them.
The binder watches these pods like its own (:func:`is_ours`): it never publishes them as pending
(kube-scheduler picks their node), but publishes ``PodDeleted`` when they go, binds them once the
extender commits their placement (their claim), and counts their CPU and memory as Tessera's (the
placer booked it). kube-scheduler itself writes their ``PodScheduled`` condition and
``FailedScheduling`` Events, with the extender's reasons in them.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import msgspec

from shared import annotations as names
from shared.kubeobjects import Pod
from shared.messages.extender import PodLookup, PodLookupReply
from shared.podspec import InvalidPod, parse_pending, requests_tessera
from shared.scheduling import uses_namespace_selector


def is_extender_pod(pod: Pod, extender_scheduler_names: Collection[str]) -> bool:
    """A pod kube-scheduler schedules with Tessera's extender deciding its GPUs."""
    return pod.spec.scheduler_name in extender_scheduler_names and requests_tessera(pod)


def is_ours(pod: Pod, *, scheduler_name: str, extender_scheduler_names: Collection[str]) -> bool:
    """A pod Tessera places: by its own scheduler name, or through the extender."""
    return pod.spec.scheduler_name == scheduler_name or is_extender_pod(
        pod, extender_scheduler_names
    )


def lookup_reply(
    lookup: PodLookup,
    pod: Pod | None,
    *,
    namespaces: Mapping[str, Mapping[str, str]] | None,
    scheduler_name: str,
    extender_scheduler_names: Collection[str],
) -> PodLookupReply:
    """What the extender gets for ``lookup``, given the pod of that namespace and name (None:
    there is none) and every namespace's labels (None: not listed yet), which resolve its
    pod-affinity namespace selectors as for every pod the binder publishes."""
    where = f"pod {lookup.namespace}/{lookup.name}"
    if pod is None:
        return PodLookupReply(uid=lookup.uid, error=f"{where} does not exist")
    if pod.metadata.uid != lookup.uid:
        return PodLookupReply(
            uid=lookup.uid,
            error=f"{where} is another pod now (uid {pod.metadata.uid}, not {lookup.uid})",
        )
    if pod.node:
        return PodLookupReply(uid=lookup.uid, node=pod.node)
    if pod.terminating:
        return PodLookupReply(uid=lookup.uid, error=f"{where} is being deleted")
    if not requests_tessera(pod):
        return PodLookupReply(
            uid=lookup.uid,
            error=f"{where} asks for no {names.PREFIX}* resource: the extender binds only pods "
            "that do (list them in the extender's managedResources)",
        )
    scheduler = pod.spec.scheduler_name or "default-scheduler"
    if scheduler == scheduler_name:
        return PodLookupReply(
            uid=lookup.uid,
            error=f"{where} has schedulerName {scheduler}: Tessera schedules it itself",
        )
    if scheduler not in extender_scheduler_names:
        known = ", ".join(extender_scheduler_names) or "none"
        return PodLookupReply(
            uid=lookup.uid,
            error=f"{where} has schedulerName {scheduler}, which is not one of the binder's "
            f"--extender-scheduler-names ({known}): add it, or the binder never sees the pod "
            "go and its GPUs are never given back",
        )
    if namespaces is None and uses_namespace_selector(pod):
        return PodLookupReply(
            uid=lookup.uid,
            error=f"{where} names a namespaceSelector, and the binder has not listed the "
            "cluster's namespaces yet",
        )
    parsed = parse_pending(pod, namespaces, strict_constraints=False)
    if isinstance(parsed, InvalidPod):
        return PodLookupReply(uid=lookup.uid, error=f"invalid request: {parsed.message}")
    return PodLookupReply(uid=lookup.uid, pod=msgspec.structs.replace(parsed, extender=True))
