"""What kube-controller-manager does for ResourceClaims, simulated beside the API test double: the
resourceclaim controller (``pkg/controller/resourceclaim/controller.go``) and, for the claims it
generates, the garbage collector.

- **A claim per pod from a template.** For each ``spec.resourceClaims`` entry of a pod that
  names a ResourceClaimTemplate and has no entry in ``status.resourceClaimStatuses`` yet, it
  creates a claim from the template (``generateName: <pod>-<claim>-``, both parts shortened to
  fit; the template's labels and annotations plus ``resource.kubernetes.io/pod-claim-name``;
  owned by the pod as its controller) and records the claim's name in the pod's status. A claim
  it created before its status write was lost is found again by that annotation and owner. A
  missing template is a ``FailedResourceClaimCreation`` warning on the pod; the pod is looked at
  again when the template appears.
- **Reservations.** A claim allocated for a pod bound to a node, not yet reserved for it and
  with room in ``reservedFor`` (256), is reserved for it.
- **Cleanup.** ``reservedFor`` entries of pods that are gone, replaced (another uid) or done
  (Succeeded or Failed, or deleted before they were bound) are removed; a claim no one reserves
  any more is deallocated (``status.allocation`` cleared) when it carries the
  ``resource.kubernetes.io/delete-protection`` finalizer, which is then removed. A claim being
  deleted with that finalizer and no consumer is deallocated and released the same way. A
  generated claim whose pod is done or replaced is deleted; one whose pod is gone is deleted by
  the garbage collector (which this also plays).

It follows pods, claims and templates through in-process watches of the double's store and writes
through its in-process operations, one change at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Final

from tessera.devcluster import dra
from tessera.devcluster.objects import ApiObjects
from tessera.devcluster.patches import STRATEGIC_MERGE_PATCH
from tessera.devcluster.recorder import record_event
from tessera.devcluster.resources import (
    POD,
    RESOURCE_CLAIM,
    RESOURCE_CLAIM_TEMPLATE,
    ApiError,
    Obj,
    ResourceType,
)
from tessera.devcluster.store import Closed, Watcher

log = logging.getLogger(__name__)

CONTROLLER: Final = "resourceclaim-controller"
GENERATE_NAME_MAX: Final = 57
"""A generated name leaves room for the 5 random characters within 63."""


def _everything(_fields: Any, _labels: Any) -> bool:
    return True


def generate_name(pod: str, claim: str) -> str:
    """``<pod>-<claim>-``, both parts shortened in proportion when that is too long."""
    base = f"{pod}-{claim}-"
    if len(base) <= GENERATE_NAME_MAX:
        return base
    return (
        pod[: len(pod) * GENERATE_NAME_MAX // len(base)]
        + "-"
        + claim[: len(claim) * GENERATE_NAME_MAX // len(base)]
    )


def pod_done(pod: Obj) -> bool:
    """``isPodDone``: it will never run (again)."""
    phase = (pod.get("status") or {}).get("phase")
    deleted_unbound = (pod.get("metadata") or {}).get("deletionTimestamp") and not (
        pod.get("spec") or {}
    ).get("nodeName")
    return phase in ("Succeeded", "Failed") or bool(deleted_unbound)


def owning_pod(claim: Obj) -> tuple[str, str]:
    """(name, uid) of the pod that controls the claim, or ("", "")."""
    for ref in (claim.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller") and ref.get("apiVersion") == "v1" and ref.get("kind") == "Pod":
            return ref.get("name", ""), ref.get("uid", "")
    return "", ""


class ClaimController:
    """The resourceclaim controller and the claims' garbage collector (see the module doc)."""

    def __init__(self, api: ApiObjects) -> None:
        self.api = api
        self._queue: asyncio.Queue[tuple[ResourceType, str, Obj] | Closed] = asyncio.Queue()
        self._watchers: list[Watcher] = []
        self._tasks: list[asyncio.Task[None]] = []
        self.created = 0
        """Claims created from templates."""

    def start(self) -> None:
        for resource in (RESOURCE_CLAIM_TEMPLATE, RESOURCE_CLAIM, POD):
            initial, watcher = self.api.store.watch(
                resource, namespace="", match=_everything, since=None
            )
            self._watchers.append(watcher)
            for kind, obj in initial:
                self._queue.put_nowait((resource, kind, obj))
            self._tasks.append(
                asyncio.create_task(
                    self._forward(resource, watcher), name=f"claims-{resource.plural}"
                )
            )
        self._tasks.append(asyncio.create_task(self._work(), name="claim-controller"))

    async def stop(self) -> None:
        for watcher in self._watchers:
            self.api.store.stop_watch(watcher)
        self._watchers.clear()
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()

    async def _forward(self, resource: ResourceType, watcher: Watcher) -> None:
        while True:
            change = await watcher.queue.get()
            if isinstance(change, Closed):
                return
            seen = watcher.translate(change)
            if seen is None:
                continue
            kind, obj = seen
            if kind == "DELETED" and change.previous is not None:
                obj = change.previous  # the last state, with its uid and owner references
            self._queue.put_nowait((resource, kind, obj))

    async def _work(self) -> None:
        while True:
            item = await self._queue.get()
            if isinstance(item, Closed):
                return
            resource, kind, obj = item
            try:
                self._handle(resource, kind, obj)
            except ApiError as error:  # a conflicting write meanwhile: the next change retries
                log.info("claim controller write refused", extra={"error": error.message})
            except Exception:  # a bug here must not stop the controller
                log.exception("claim controller failed on a change")

    def _handle(self, resource: ResourceType, kind: str, obj: Obj) -> None:
        meta = obj.get("metadata") or {}
        namespace = meta.get("namespace", "")
        if resource is RESOURCE_CLAIM_TEMPLATE:
            if kind == "ADDED":
                for pod in self.api.objects(POD, namespace):
                    self.sync_pod(pod)
            return
        if resource is RESOURCE_CLAIM:
            if kind != "DELETED":
                self.sync_claim(namespace, meta.get("name", ""))
            return
        if kind != "DELETED":
            current = self.api.find(POD, namespace, meta.get("name", ""))
            if current is not None:
                self.sync_pod(current)
        if kind == "DELETED" or pod_done(obj):
            for claim in self.api.objects(RESOURCE_CLAIM, namespace):
                uid = str(meta.get("uid", ""))
                if dra.reserved_for(claim, uid) or owning_pod(claim)[1] == uid:
                    self.sync_claim(namespace, claim["metadata"]["name"])

    # --- pods ---------------------------------------------------------------------------------

    def sync_pod(self, pod: Obj) -> None:
        """``syncPod``: generate the pod's claims, then reserve allocated ones for a bound pod."""
        meta = pod["metadata"]
        if meta.get("deletionTimestamp") or not (pod.get("spec") or {}).get("resourceClaims"):
            return
        generated: dict[str, str] = {}
        for pod_claim in pod["spec"]["resourceClaims"]:
            name = self._generate(pod, pod_claim)
            if name:
                generated[pod_claim["name"]] = name
        if generated:
            statuses = [{"name": k, "resourceClaimName": v} for k, v in sorted(generated.items())]
            pod = self.api.patch(
                POD,
                meta["namespace"],
                meta["name"],
                {"metadata": {"uid": meta["uid"]}, "status": {"resourceClaimStatuses": statuses}},
                STRATEGIC_MERGE_PATCH,
                "status",
            )
        if not pod["spec"].get("nodeName"):
            return  # the scheduler (Tessera's binder) reserves claims while binding
        for pod_claim in pod["spec"]["resourceClaims"]:
            claim_name, check_owner, _ = dra.claim_name(pod, pod_claim)
            claim = (
                self.api.find(RESOURCE_CLAIM, meta["namespace"], claim_name) if claim_name else None
            )
            if claim is None or (check_owner and not dra.owned_by(claim, pod)):
                continue
            status = claim.get("status") or {}
            reserved = status.get("reservedFor") or []
            if (
                status.get("allocation") is not None
                and not dra.reserved_for(claim, meta["uid"])
                and len(reserved) < 256
            ):
                reserve = {
                    "status": {
                        "reservedFor": [
                            *reserved,
                            {"resource": "pods", "name": meta["name"], "uid": meta["uid"]},
                        ]
                    }
                }
                self._write_status(claim, reserve)

    def _generate(self, pod: Obj, pod_claim: Obj) -> str:
        """``handleClaim``: the name of the claim created (or found) for ``pod_claim``, "" when
        none is needed or its template is missing."""
        name, check_owner, _ = dra.claim_name(pod, pod_claim)
        meta = pod["metadata"]
        if name is not None:
            claim = self.api.find(RESOURCE_CLAIM, meta["namespace"], name)
            if claim is not None and (not check_owner or dra.owned_by(claim, pod)):
                return ""  # created already
        template_name = pod_claim.get("resourceClaimTemplateName")
        if template_name is None:
            return ""
        for claim in self.api.objects(RESOURCE_CLAIM, meta["namespace"]):
            annotations = claim["metadata"].get("annotations") or {}
            if (
                dra.owned_by(claim, pod)
                and annotations.get(dra.POD_CLAIM_ANNOTATION) == (pod_claim["name"])
            ):
                return str(claim["metadata"]["name"])
        template = self.api.find(RESOURCE_CLAIM_TEMPLATE, meta["namespace"], template_name)
        if template is None:
            self._warn(
                pod,
                "FailedResourceClaimCreation",
                f"PodResourceClaim {pod_claim['name']}: resource claim template "
                f'"{template_name}": resourceclaimtemplate.resource.k8s.io "{template_name}" '
                "not found",
            )
            return ""
        template_meta = (template.get("spec") or {}).get("metadata") or {}
        annotations = dict(template_meta.get("annotations") or {})
        annotations[dra.POD_CLAIM_ANNOTATION] = pod_claim["name"]
        claim_meta: Obj = {
            "generateName": generate_name(meta["name"], pod_claim["name"]),
            "namespace": meta["namespace"],
            "annotations": annotations,
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        }
        if template_meta.get("labels"):
            claim_meta["labels"] = dict(template_meta["labels"])
        created = self.api.create(
            RESOURCE_CLAIM,
            {"metadata": claim_meta, "spec": (template.get("spec") or {}).get("spec") or {}},
            meta["namespace"],
        )
        self.created += 1
        return str(created["metadata"]["name"])

    # --- claims -------------------------------------------------------------------------------

    def sync_claim(self, namespace: str, name: str) -> None:
        """``syncClaim``: drop reservations of pods that will not run, deallocate and release an
        unused claim, delete a generated claim its pod no longer needs."""
        claim = self.api.find(RESOURCE_CLAIM, namespace, name)
        if claim is None:
            return
        status = claim.get("status") or {}
        reserved = status.get("reservedFor") or []
        valid = [r for r in reserved if self._still_used(namespace, r)]
        protected = dra.FINALIZER in (claim["metadata"].get("finalizers") or [])
        if len(valid) < len(reserved):
            change: Obj = {"reservedFor": valid or None}
            if not valid and protected:
                change["allocation"] = None  # deallocate: it can be allocated anew elsewhere
            claim = self._write_status(claim, {"status": change})
            if protected and (claim.get("status") or {}).get("allocation") is None:
                claim = self._release(claim)
        elif protected and claim["metadata"].get("deletionTimestamp") and not valid:
            if status.get("allocation") is not None:
                claim = self._write_status(claim, {"status": {"allocation": None}})
            claim = self._release(claim)
        if claim is None or valid:
            return
        pod_name, pod_uid = owning_pod(claim)
        if not pod_name:
            return
        pod = self.api.find(POD, namespace, pod_name)
        if pod is None or pod["metadata"]["uid"] != pod_uid or pod_done(pod):
            # Done or replaced: this controller; gone: the garbage collector.
            with contextlib.suppress(ApiError):
                self.api.delete(RESOURCE_CLAIM, namespace, claim["metadata"]["name"])

    def _still_used(self, namespace: str, reference: Obj) -> bool:
        if reference.get("apiGroup") or reference.get("resource") != "pods":
            return True  # only pods are understood; others are kept
        pod = self.api.find(POD, namespace, reference.get("name", ""))
        return (
            pod is not None
            and pod["metadata"]["uid"] == reference.get("uid")
            and not (pod_done(pod))
        )

    def _write_status(self, claim: Obj, patch: Obj) -> Obj:
        meta = claim["metadata"]
        patch = {**patch, "metadata": {"resourceVersion": meta["resourceVersion"]}}
        return self.api.patch(
            RESOURCE_CLAIM,
            meta["namespace"],
            meta["name"],
            patch,
            "application/merge-patch+json",
            "status",
        )

    def _release(self, claim: Obj) -> Obj | None:
        """Remove the delete-protection finalizer; None when that completed the delete."""
        meta = claim["metadata"]
        finalizers = [f for f in meta.get("finalizers") or [] if f != dra.FINALIZER]
        self.api.patch(
            RESOURCE_CLAIM,
            meta["namespace"],
            meta["name"],
            {
                "metadata": {
                    "finalizers": finalizers or None,
                    "resourceVersion": meta["resourceVersion"],
                }
            },
            "application/merge-patch+json",
        )
        return self.api.find(RESOURCE_CLAIM, meta["namespace"], meta["name"])

    def _warn(self, pod: Obj, reason: str, note: str) -> None:
        record_event(
            self.api,
            pod,
            kind="Pod",
            reason=reason,
            note=note,
            controller=CONTROLLER,
            instance=CONTROLLER,
            action="CreateResourceClaim",
        )
