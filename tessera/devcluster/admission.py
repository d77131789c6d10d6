"""Dynamic admission as the API server does it: the registered webhooks called on a write.

For an object created or changed (PUT, PATCH) over HTTP, :class:`AdmissionChain` calls every
matching webhook of every ``MutatingWebhookConfiguration`` (configurations by name, webhooks in
order), applying each one's JSONPatch to the object the next one sees, then every matching
``ValidatingWebhookConfiguration`` webhook on the result. The review carries who asks
(``userInfo``: the user the request authenticated as) and, on an UPDATE, the ``oldObject``. Each
call is an ``admission.k8s.io/v1`` AdmissionReview POSTed over HTTPS to ``clientConfig.url``, the
server certificate verified against ``clientConfig.caBundle``, within ``timeoutSeconds`` (10).
What the API server does with the answers, this does too:

- a refusal is an error to the client: ``admission webhook "NAME" denied the request: MESSAGE``
  with the webhook's status code (at least 400) and reason;
- an answer's ``warnings`` reach the client of a write that succeeds as ``Warning`` headers
  (:data:`WARNINGS`), which kubectl prints;
- a webhook that cannot be called (connection refused, TLS, timeout, an answer that is not a
  review of this request) fails the request with 500 ``failed calling webhook`` under
  ``failurePolicy: Fail`` (the default) and is skipped under ``Ignore``;
- ``rules`` (operations, apiGroups, apiVersions, resources, scope), ``namespaceSelector`` (over
  the namespace's labels, ``kubernetes.io/metadata.name`` included) and ``objectSelector``
  choose which webhooks are called. ``matchConditions`` (CEL) are not evaluated: such a webhook
  is called, and it must answer for the objects it does not care about (Tessera's does).

``clientConfig.service`` needs cluster DNS, which the test double has not: such a webhook cannot
be called (and fails or is skipped by its policy).
"""

from __future__ import annotations

import base64
import json
import logging
import ssl
import uuid
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Final, Literal

import aiohttp

from tessera.devcluster import patches
from tessera.devcluster.resources import ApiError, Obj, ResourceType
from tessera.devcluster.selectors import SelectorError, structured_label_selector

log = logging.getLogger(__name__)

WARNINGS: Final[ContextVar[list[str] | None]] = ContextVar("admission_warnings", default=None)
"""The warnings the webhooks answered while admitting the request being served: the REST layer
sets a list per request and returns it in ``Warning`` headers, as the API server does (kubectl
prints them)."""

DEFAULT_TIMEOUT_S: Final = 10
REVIEW_VERSION: Final = "admission.k8s.io/v1"

Phase = Literal["mutating", "validating"]


@dataclass(frozen=True)
class Review:
    """What an AdmissionReview says besides the object: what is asked, where, and by whom."""

    resource: ResourceType
    namespace: str
    operation: str
    user: Obj
    """``userInfo``: username and groups of the authenticated client."""
    old: Obj | None
    """``oldObject``: the object an UPDATE replaces (None on a CREATE)."""


class CallError(Exception):
    """The webhook could not be called, or did not answer with a review of the request."""


def _listed(values: list[str] | None, value: str) -> bool:
    return "*" in (values or ()) or value in (values or ())


def rules_match(hook: Obj, resource: ResourceType, operation: str) -> bool:
    """Whether one of the webhook's rules covers ``operation`` on ``resource`` (the resource
    itself, not a subresource: ``*`` or its plural, ``*/*`` too)."""
    scope = "Namespaced" if resource.namespaced else "Cluster"
    for rule in hook.get("rules") or []:
        resources = rule.get("resources") or []
        if (
            _listed(rule.get("operations"), operation)
            and _listed(rule.get("apiGroups"), resource.group)
            and _listed(rule.get("apiVersions"), resource.version)
            and (_listed(resources, resource.plural) or "*/*" in resources)
            and rule.get("scope", "*") in ("*", scope)
        ):
            return True
    return False


def selected(hook: Obj, namespace_labels: dict[str, str], object_labels: dict[str, str]) -> bool:
    """The webhook's namespace and object selectors (a malformed one selects nothing)."""
    try:
        return structured_label_selector(hook.get("namespaceSelector")).matches(
            namespace_labels
        ) and structured_label_selector(hook.get("objectSelector")).matches(object_labels)
    except SelectorError:
        return False


def denied(name: str, status: Obj | None) -> ApiError:
    """The client's error for a refusal (the API server's ``ToStatusErr``)."""
    status = status or {}
    code = int(status.get("code") or 0)
    message = status.get("message") or status.get("reason") or ""
    text = f'admission webhook "{name}" denied the request'
    text = f"{text}: {message}" if message else f"{text} without explanation"
    reason = status.get("reason") or "BadRequest"
    return ApiError(max(code, 400), reason, text)


class AdmissionChain:
    """Calls the webhooks registered in the store of ``configurations`` (see the module doc)."""

    def __init__(self, configurations: Callable[[Phase], list[Obj]]) -> None:
        self._configurations = configurations
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def admit(
        self,
        phase: Phase,
        resource: ResourceType,
        obj: Obj,
        *,
        namespace: str,
        namespace_labels: dict[str, str],
        user: Obj,
        operation: str = "CREATE",
        old: Obj | None = None,
    ) -> Obj:
        """``obj`` after every matching webhook of ``phase`` (mutated when mutating); ApiError
        when one refuses it or cannot be called under ``failurePolicy: Fail``. ``user`` is the
        review's ``userInfo`` (who asks); ``old`` the object an UPDATE replaces."""
        labels = (obj.get("metadata") or {}).get("labels") or {}
        for configuration in sorted(
            self._configurations(phase), key=lambda c: c["metadata"]["name"]
        ):
            for hook in configuration.get("webhooks") or []:
                if not rules_match(hook, resource, operation) or not selected(
                    hook, namespace_labels, labels
                ):
                    continue
                review = Review(resource, namespace, operation, user, old)
                obj = await self._call(phase, hook, review, obj)
        return obj

    async def _call(self, phase: Phase, hook: Obj, asked: Review, obj: Obj) -> Obj:
        name, resource, operation = hook["name"], asked.resource, asked.operation
        uid = str(uuid.uuid4())
        gvk = {"group": resource.group, "version": resource.version, "kind": resource.kind}
        gvr = {"group": resource.group, "version": resource.version, "resource": resource.plural}
        review = {
            "apiVersion": REVIEW_VERSION,
            "kind": "AdmissionReview",
            "request": {
                "uid": uid,
                "kind": gvk,
                "resource": gvr,
                "requestKind": gvk,
                "requestResource": gvr,
                "name": (obj.get("metadata") or {}).get("name", ""),
                "namespace": asked.namespace,
                "operation": operation,
                "userInfo": asked.user,
                "object": obj,
                "oldObject": asked.old,
                "dryRun": False,
                "options": {
                    "apiVersion": "meta.k8s.io/v1",
                    "kind": "CreateOptions" if operation == "CREATE" else "UpdateOptions",
                },
            },
        }
        try:
            response = await self._post(hook, review, uid)
        except CallError as error:
            if hook.get("failurePolicy", "Fail") == "Ignore":
                log.warning("webhook %s failed and is ignored: %s", name, error)
                return obj
            raise ApiError(
                500,
                "InternalError",
                f'Internal error occurred: failed calling webhook "{name}": failed to call '
                f"webhook: {error}",
            ) from None
        warnings = WARNINGS.get()
        if warnings is not None:
            warnings.extend(str(warning) for warning in response.get("warnings") or ())
        if not response.get("allowed"):
            raise denied(name, response.get("status"))
        patch = response.get("patch")
        if phase == "validating" or not patch:
            return obj
        if response.get("patchType") != "JSONPatch":
            raise ApiError(
                500, "InternalError", f'webhook "{name}" answered an unsupported patchType'
            )
        try:
            operations = json.loads(base64.b64decode(patch))
            return patches.apply_patch(obj, operations, "application/json-patch+json")
        except (ValueError, patches.PatchError) as error:
            raise ApiError(
                500,
                "InternalError",
                f'Internal error occurred: failed calling webhook "{name}": the patch does not '
                f"apply: {error}",
            ) from None

    async def _post(self, hook: Obj, review: Obj, uid: str) -> Obj:
        client = hook.get("clientConfig") or {}
        url = client.get("url")
        if not url:
            service = client.get("service") or {}
            raise CallError(
                f'service "{service.get("namespace")}/{service.get("name")}" cannot be reached '
                "from the API test double (no cluster DNS); register the webhook by url"
            )
        try:
            context = ssl.create_default_context(
                cadata=base64.b64decode(client["caBundle"]).decode()
                if client.get("caBundle")
                else None
            )
        except (ValueError, ssl.SSLError) as error:
            raise CallError(f"caBundle is not a PEM certificate: {error}") from None
        if self._session is None:
            self._session = aiohttp.ClientSession(trust_env=False)
        timeout = aiohttp.ClientTimeout(
            total=float(hook.get("timeoutSeconds") or DEFAULT_TIMEOUT_S)
        )
        try:
            async with self._session.post(url, json=review, ssl=context, timeout=timeout) as answer:
                if answer.status != 200:
                    raise CallError(
                        f"Post {url!r}: HTTP {answer.status}: {(await answer.text())[:300]}"
                    )
                body = await answer.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as error:
            raise CallError(f"Post {url!r}: {error or type(error).__name__}") from None
        response = body.get("response") if isinstance(body, dict) else None
        if not isinstance(response, dict) or response.get("uid") != uid:
            raise CallError(f"expected a response with uid {uid!r}, got {str(body)[:200]}")
        return response
