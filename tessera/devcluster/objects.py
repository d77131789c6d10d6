"""The API test double's operations on objects, in process: what every verb does to the store
(create with defaults, validation and admission; update and patch with their preconditions and
immutable fields; delete, graceful for a bound pod; pods/binding as ``BindingREST``). The HTTP
front (``rest.py``) calls these, and tests and simulated components call them directly.
"""

from __future__ import annotations

import functools
import random
import string
from collections.abc import Callable
from datetime import datetime
from typing import Any, Final

from tessera.devcluster import patches, resources, schema
from tessera.devcluster.admission import AdmissionChain, Phase
from tessera.devcluster.jsoncopy import clone
from tessera.devcluster.resources import (
    MUTATING_WEBHOOKS,
    NAMESPACE,
    POD,
    VALIDATING_WEBHOOKS,
    ApiError,
    Obj,
    ResourceType,
    conflict,
    invalid,
    not_found,
    timestamp,
)
from tessera.devcluster.store import Key, Store

DEFAULT_NAMESPACES: Final = ("default", "kube-system")
ADMIN_INFO: Final[Obj] = {"username": "tessera-dev", "groups": ["system:masters"]}
"""The ``userInfo`` of a write made in process (tests, simulated components): an admin."""
NAMESPACE_NAME_LABEL: Final = "kubernetes.io/metadata.name"
"""The label the API server gives every namespace (webhooks' namespaceSelector keys on it)."""


def _random_suffix() -> str:
    return "".join(random.choices(string.ascii_lowercase + string.digits, k=5))


class ApiObjects:
    """The objects of the API test double and every operation on them (no HTTP)."""

    def __init__(
        self,
        *,
        graceful_deletion: bool,
        history_limit: int,
        clock: Callable[[], float],
    ) -> None:
        self.graceful_deletion = graceful_deletion
        self.clock = clock
        self.store = Store(history_limit=history_limit)
        self.admission = AdmissionChain(self._webhook_configurations)

    def _webhook_configurations(self, phase: Phase) -> list[Obj]:
        kind = MUTATING_WEBHOOKS if phase == "mutating" else VALIDATING_WEBHOOKS
        return self.objects(kind)

    # --- operations (also used directly by tests and simulated components) ----------------------

    def get(self, resource: ResourceType, namespace: str, name: str) -> Obj:
        obj = self.store.get(resource, self._key(resource, namespace, name))
        if obj is None:
            raise not_found(resource.plural, name, resource.group)
        return obj

    def find(self, resource: ResourceType, namespace: str, name: str) -> Obj | None:
        return self.store.get(resource, self._key(resource, namespace, name))

    def objects(self, resource: ResourceType, namespace: str = "") -> list[Obj]:
        return list(self.store.objects(resource, namespace))

    def create(self, resource: ResourceType, obj: Obj, namespace: str = "") -> Obj:
        """Create ``obj`` as the API server would (defaults, validation, implicit namespace).

        In process: no admission webhook is called (a create over HTTP calls them)."""
        prepared, namespace = self._prepare_create(resource, obj, namespace)
        return self._store_created(resource, prepared, namespace)

    async def create_admitted(
        self, resource: ResourceType, obj: Obj, namespace: str = "", *, user: Obj = ADMIN_INFO
    ) -> Obj:
        """Create ``obj`` as a client's create over HTTP is: defaults, the mutating admission
        webhooks, validation, the validating webhooks (``admission.py``), then stored.
        ``user``: the review's ``userInfo``."""
        meta = obj.get("metadata") or {}
        if resource.namespaced:
            namespace = namespace or meta.get("namespace") or "default"
        labels = self._namespace_labels(namespace)
        defaulted = clone(obj)
        self._decode(resource, defaulted)
        resource.defaults(defaulted, self.clock())  # the API server defaults when it decodes
        mutated = await self.admission.admit(
            "mutating", resource, defaulted, namespace=namespace, namespace_labels=labels, user=user
        )
        prepared, namespace = self._prepare_create(resource, mutated, namespace)
        await self.admission.admit(
            "validating",
            resource,
            prepared,
            namespace=namespace,
            namespace_labels=labels,
            user=user,
        )
        # Another create of the name may have been stored while the webhooks were called.
        self._refuse_existing(resource, namespace, prepared["metadata"]["name"])
        return self._store_created(resource, prepared, namespace)

    async def update_admitted(
        self,
        resource: ResourceType,
        namespace: str,
        name: str,
        obj: Obj,
        subresource: str = "",
        *,
        user: Obj = ADMIN_INFO,
    ) -> Obj:
        """:meth:`update` as a client's PUT over HTTP is: through the admission webhooks."""
        return await self._replace_admitted(
            resource,
            (namespace, name),
            lambda current: self._updated(current, obj),
            subresource,
            user,
        )

    async def patch_admitted(
        self,
        resource: ResourceType,
        namespace: str,
        name: str,
        patch: Any,
        content_type: str,
        subresource: str = "",
        *,
        user: Obj = ADMIN_INFO,
    ) -> Obj:
        """:meth:`patch` as a client's PATCH over HTTP is: through the admission webhooks."""
        return await self._replace_admitted(
            resource,
            (namespace, name),
            lambda current: self._patched(resource, current, patch, content_type),
            subresource,
            user,
        )

    async def _replace_admitted(
        self,
        resource: ResourceType,
        key: tuple[str, str],
        change: Callable[[Obj], Obj],
        subresource: str,
        user: Obj,
    ) -> Obj:
        """An UPDATE of the main resource meets the mutating webhooks, then validation, then
        the validating webhooks (a subresource, such as pods/status, meets none: webhooks name
        ``pods``, not ``pods/status``). The object may change while the webhooks are called (a
        kubelet's status): as the API server's ``GuaranteedUpdate``, the change is then made
        again on the new object and admitted again, never written over it."""
        namespace, name = key
        while True:
            current = self.get(resource, namespace, name)
            new = change(current)
            if subresource:
                return self._replace(resource, current, new, subresource)
            admit = functools.partial(
                self.admission.admit,
                namespace=namespace,
                namespace_labels=self._namespace_labels(namespace),
                user=user,
                operation="UPDATE",
                old=current,
            )
            mutated = await admit("mutating", resource, new)
            replacement = self._replacement(resource, current, mutated, subresource)
            await admit("validating", resource, replacement)
            if self.get(resource, namespace, name) is current:
                return self._store_replaced(resource, current, replacement)

    def _namespace_labels(self, namespace: str) -> dict[str, str]:
        found = self.store.get(NAMESPACE, ("", namespace)) if namespace else None
        labels = dict(((found or {}).get("metadata") or {}).get("labels") or {})
        if namespace:
            labels.setdefault(NAMESPACE_NAME_LABEL, namespace)
        return labels

    def _store_created(self, resource: ResourceType, obj: Obj, namespace: str) -> Obj:
        if resource.namespaced:
            self._ensure_namespace(namespace)
        return self.store.put(resource, obj)

    def _prepare_create(self, resource: ResourceType, obj: Obj, namespace: str) -> tuple[Obj, str]:
        """``obj`` ready to store (name, uid, defaults, validated), and its namespace."""
        obj = clone(obj)
        meta = obj.setdefault("metadata", {})
        if resource.namespaced:
            namespace = namespace or meta.get("namespace") or "default"
            if meta.get("namespace") not in (None, "", namespace):
                raise ApiError(
                    400,
                    "BadRequest",
                    "the namespace of the provided object does not match the namespace sent on "
                    "the request",
                )
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise invalid(
                    resource.kind,
                    "",
                    ["metadata.name: Required value: name or generateName is required"],
                )
            meta["name"] = meta["generateName"] + _random_suffix()
        name = meta["name"]
        if not resources.valid_name(name):
            raise invalid(
                resource.kind,
                name,
                [
                    f"metadata.name: Invalid value: {name!r}: a "
                    "lowercase RFC 1123 subdomain must consist of "
                    "lower case alphanumeric characters, '-' or '.'"
                ],
            )
        self._refuse_existing(resource, namespace, name)
        now = self.clock()
        missing = self._decode(resource, obj)
        obj["apiVersion"], obj["kind"] = resource.api_version, resource.kind
        meta["uid"] = resources.new_uid()
        meta["creationTimestamp"] = timestamp(now)
        meta.pop("resourceVersion", None)
        meta.pop("deletionTimestamp", None)
        resource.defaults(obj, now)
        errors = _distinct(missing + resource.validate(obj))
        if errors:
            raise invalid(resource.kind, name, errors)
        return obj, namespace

    def _decode(self, resource: ResourceType, obj: Obj) -> list[str]:
        """Decode ``obj`` in place by its kind's strict schema (when it has one): unknown fields
        dropped, 400 for a value of the wrong type; the required fields that are missing."""
        if not resource.schema:
            return []
        decoded = schema.decode(resource.kind, obj)
        if decoded.type_errors:
            raise ApiError(
                400,
                "BadRequest",
                f'{resource.kind} in version "{resource.version}" cannot be handled as a '
                f"{resource.kind}: {'; '.join(decoded.type_errors)}",
            )
        return decoded.missing

    def _refuse_existing(self, resource: ResourceType, namespace: str, name: str) -> None:
        if self.store.get(resource, self._key(resource, namespace, name)) is not None:
            raise ApiError(
                409,
                "AlreadyExists",
                f'{resource.plural}{"." + resource.group if resource.group else ""} "{name}" '
                "already exists",
                kind=resource.plural,
                name=name,
            )

    def update(
        self, resource: ResourceType, namespace: str, name: str, obj: Obj, subresource: str = ""
    ) -> Obj:
        """Replace the object (PUT): a ``metadata.resourceVersion`` must be the current one."""
        current = self.get(resource, namespace, name)
        return self._replace(resource, current, self._updated(current, obj), subresource)

    def _updated(self, current: Obj, obj: Obj) -> Obj:
        new: Obj = clone(obj)
        meta = new.setdefault("metadata", {})
        if meta.get("name", current["metadata"]["name"]) != current["metadata"]["name"]:
            raise ApiError(
                400, "BadRequest", "the name of the object does not match the name on the URL"
            )
        return new

    def patch(
        self,
        resource: ResourceType,
        namespace: str,
        name: str,
        patch: Any,
        content_type: str,
        subresource: str = "",
    ) -> Obj:
        """Apply a patch of ``content_type`` to the object (or its status)."""
        current = self.get(resource, namespace, name)
        patched = self._patched(resource, current, patch, content_type)
        return self._replace(resource, current, patched, subresource)

    def _patched(self, resource: ResourceType, current: Obj, patch: Any, content_type: str) -> Obj:
        try:
            patched = patches.apply_patch(resource.to_view(current), patch, content_type)
        except patches.PatchError as error:
            reason = {400: "BadRequest", 415: "UnsupportedMediaType"}.get(error.status, "Invalid")
            raise ApiError(error.status, reason, error.message) from None
        # A patch result shares untouched parts with the stored object: work on a copy.
        copy: Obj = clone(resource.from_view(patched))
        return copy

    def _replace(self, resource: ResourceType, current: Obj, new: Obj, subresource: str) -> Obj:
        replacement = self._replacement(resource, current, new, subresource)
        return self._store_replaced(resource, current, replacement)

    def _store_replaced(self, resource: ResourceType, current: Obj, replacement: Obj) -> Obj:
        if replacement == current:
            return current  # a no-op write keeps the resourceVersion, as the API server does
        meta = replacement["metadata"]
        if _finished(current["metadata"], meta):
            # The last finalizer of an object being deleted is gone: the delete completes.
            key = self._key(resource, meta.get("namespace", ""), meta["name"])
            self.store.delete(resource, key)
            return replacement
        return self.store.put(resource, replacement)

    def _replacement(self, resource: ResourceType, current: Obj, new: Obj, subresource: str) -> Obj:
        """``new`` checked (preconditions, immutable fields, validation) and ready to store."""
        name = current["metadata"]["name"]
        meta = new.setdefault("metadata", {})
        current_meta = current["metadata"]
        wanted = meta.get("resourceVersion")
        if wanted and wanted != current_meta["resourceVersion"]:
            raise conflict(resource.plural, name, resource.group)
        causes = [
            f"metadata.{key}: Invalid value: {meta.get(key)!r}: field is immutable"
            for key in ("name", "namespace", "uid", "creationTimestamp")
            if key in meta and not _same(key, meta[key], current_meta.get(key))
        ]
        if causes:
            raise invalid(resource.kind, name, causes)
        for key in (
            "name",
            "namespace",
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
        ):
            if key in current_meta and key not in meta:
                meta[key] = current_meta[key]
        if "creationTimestamp" in current_meta:  # stored as the API server writes a time
            meta["creationTimestamp"] = current_meta["creationTimestamp"]
        missing = self._decode(resource, new)
        new["apiVersion"], new["kind"] = resource.api_version, resource.kind
        errors = resource.update_rules(current, new, subresource) + resource.validate(new)
        errors = _distinct(missing + errors + _finalizers_added(current_meta, meta))
        if errors:
            raise invalid(resource.kind, name, errors)
        meta["resourceVersion"] = current_meta["resourceVersion"]
        return new

    def delete(
        self,
        resource: ResourceType,
        namespace: str,
        name: str,
        *,
        grace_period_s: int | None = None,
        uid: str | None = None,
        resource_version: str | None = None,
    ) -> Obj:
        """Delete (or, for a bound pod under ``graceful_deletion``, mark for deletion)."""
        current = self.get(resource, namespace, name)
        meta = current["metadata"]
        if uid is not None and uid != meta.get("uid"):
            raise conflict(
                resource.plural,
                name,
                resource.group,
                f"Precondition failed: UID in precondition: {uid}, UID in object meta: "
                f"{meta.get('uid')}",
            )
        if resource_version is not None and resource_version != meta.get("resourceVersion"):
            raise conflict(
                resource.plural,
                name,
                resource.group,
                f"Precondition failed: ResourceVersion in precondition: {resource_version}, "
                f"ResourceVersion in object meta: {meta.get('resourceVersion')}",
            )
        graceful = (
            resource is POD
            and self.graceful_deletion
            and current.get("spec", {}).get("nodeName")
            and grace_period_s != 0
            and not meta.get("deletionTimestamp")
        )
        if graceful:
            grace = grace_period_s
            if grace is None:
                grace = int(current["spec"].get("terminationGracePeriodSeconds", 30))
            marked = clone(current)
            marked["metadata"]["deletionTimestamp"] = timestamp(self.clock() + grace)
            marked["metadata"]["deletionGracePeriodSeconds"] = grace
            return self.store.put(resource, marked)
        if meta.get("finalizers"):
            # Finalizers hold the object: it is only marked, and goes when the last is removed.
            if meta.get("deletionTimestamp") and not meta.get("deletionGracePeriodSeconds"):
                return current
            marked = clone(current)
            marked["metadata"]["deletionTimestamp"] = timestamp(self.clock())
            marked["metadata"]["deletionGracePeriodSeconds"] = 0
            return self.store.put(resource, marked)
        self.store.delete(resource, self._key(resource, namespace, name))
        return current

    def bind(self, namespace: str, name: str, binding: Obj) -> Obj:
        """pods/binding as ``BindingREST.Create``: the bound pod, or ApiError."""
        meta = binding.get("metadata") or {}
        if meta.get("name", name) != name:
            raise ApiError(400, "BadRequest", "name in URL does not match name in Binding object")
        target = binding.get("target") or {}
        if target.get("kind") not in (None, "", "Node"):
            raise invalid("Binding", name, ["target.kind: Invalid value: must be empty or 'Node'"])
        node = target.get("name") or ""
        if not node:
            raise invalid("Binding", name, ["target.name: Required value"])
        pod = self.get(POD, namespace, name)

        def refused(message: str) -> ApiError:
            return conflict("pods/binding", name, message=message)

        if meta.get("uid") and meta["uid"] != pod["metadata"]["uid"]:
            raise refused(
                f"Precondition failed: UID in precondition: {meta['uid']}, UID in object meta: "
                f"{pod['metadata']['uid']}"
            )
        if (
            meta.get("resourceVersion")
            and meta["resourceVersion"] != pod["metadata"]["resourceVersion"]
        ):
            raise refused(
                "the object has been modified; please apply your changes to the "
                "latest version and try again"
            )
        if pod["metadata"].get("deletionTimestamp"):
            raise refused(f"pod {name} is being deleted, cannot be assigned to a host")
        if pod.get("spec", {}).get("nodeName"):
            raise refused(f'pod {name} is already assigned to node "{pod["spec"]["nodeName"]}"')
        bound = clone(pod)
        bound["spec"]["nodeName"] = node
        if meta.get("annotations"):
            bound["metadata"].setdefault("annotations", {}).update(meta["annotations"])
        set_condition(bound, {"type": "PodScheduled", "status": "True"}, self.clock())
        return self.store.put(POD, bound)

    def _key(self, resource: ResourceType, namespace: str, name: str) -> Key:
        return (namespace if resource.namespaced else "", name)

    def _ensure_namespace(self, namespace: str) -> None:
        if self.store.get(NAMESPACE, ("", namespace)) is None:
            obj: Obj = {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {
                    "name": namespace,
                    "labels": {NAMESPACE_NAME_LABEL: namespace},
                    "uid": resources.new_uid(),
                    "creationTimestamp": timestamp(self.clock()),
                },
            }
            NAMESPACE.defaults(obj, self.clock())
            self.store.put(NAMESPACE, obj)


def _same(key: str, sent: Any, stored: Any) -> bool:
    """Whether an immutable metadata field is unchanged; a time is compared as a time (a client
    may write ``2026-01-02T03:04:05+00:00`` for the stored ``2026-01-02T03:04:05Z``)."""
    if sent == stored:
        return True
    if key != "creationTimestamp" or not isinstance(sent, str) or not isinstance(stored, str):
        return False
    try:
        return datetime.fromisoformat(sent) == datetime.fromisoformat(stored)
    except ValueError:
        return False


def _distinct(errors: list[str]) -> list[str]:
    """Each error once (the schema and a validation rule may both find a missing field)."""
    return list(dict.fromkeys(errors))


def _finalizers_added(old_meta: Obj, new_meta: Obj) -> list[str]:
    """``ValidateObjectMetaUpdate``: no finalizer may be added to an object being deleted."""
    if not old_meta.get("deletionTimestamp"):
        return []
    before = old_meta.get("finalizers") or []
    added = [f for f in new_meta.get("finalizers") or [] if f not in before]
    if not added:
        return []
    shown = ", ".join(f'"{f}"' for f in added)
    return [
        "metadata.finalizers: Forbidden: no new finalizers can be added if the object is being "
        f"deleted, found new finalizers []string{{{shown}}}"
    ]


def _finished(old_meta: Obj, new_meta: Obj) -> bool:
    """``shouldDeleteDuringUpdate``: the object was being deleted with no grace period left and
    the update removes its last finalizer."""
    return (
        bool(old_meta.get("deletionTimestamp"))
        and not new_meta.get("finalizers")
        and not old_meta.get("deletionGracePeriodSeconds")
    )


def set_condition(pod: Obj, condition: Obj, now: float) -> None:
    """Set a status condition by type, as ``podutil.UpdatePodCondition`` does: the transition
    time moves only when the status changes."""
    conditions = pod.setdefault("status", {}).setdefault("conditions", [])
    for existing in conditions:
        if existing.get("type") == condition["type"]:
            if existing.get("status") != condition.get("status"):
                existing["lastTransitionTime"] = timestamp(now)
            existing.update({k: v for k, v in condition.items() if k != "lastTransitionTime"})
            existing.setdefault("lastProbeTime", None)
            return
    conditions.append({"lastProbeTime": None, "lastTransitionTime": timestamp(now), **condition})
