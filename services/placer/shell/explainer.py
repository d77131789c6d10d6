"""``tessera explain`` and ``GET /v1/pods/{uid}``: everything one replica knows about a pod (its
last outcome here, its claim and record) and every node's verdict for it now."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any

import msgspec
from aiohttp import web

from services.placer.rules import decider, translate
from services.placer.shell.context import Shell
from services.placer.shell.held import Held
from shared import codec, subjects
from shared.messages.explain import ExplainReply, ExplainRequest
from shared.runtime.bus import Delivery

VERDICTS_SHOWN = 20
EXPLAIN_DEFER_S = 0.3
"""A replica not holding a waiting pod answers ``tessera explain`` this much later than the one
holding it, whose answer (with its last rejection) the asker takes first."""


class Explainer:
    """Answers what this replica knows about a pod (see the module docstring)."""

    def __init__(self, *, shell: Shell, held: Held) -> None:
        self._shell = shell
        self._held = held

    async def route(self, request: web.Request, params: Mapping[str, str]) -> web.StreamResponse:
        return web.json_response(self.explain(params["uid"]))

    async def on_request(self, delivery: Delivery) -> None:
        """Answer ``tessera explain`` for a pod this replica knows; stay silent otherwise (another
        replica may know it: the asker takes the first answer)."""
        shell = self._shell
        request = await shell.edge.accept(delivery, ExplainRequest, family="explain")
        if request is None or not delivery.reply:
            return
        uid = self.find_pod(request.namespace, request.name)
        if uid is None:
            return
        posted = shell.board.get(uid)
        if uid not in self._held.items and posted is not None and posted.waiting.holder:
            # Another replica holds it and knows its last rejection: let it answer first.
            await asyncio.sleep(EXPLAIN_DEFER_S)
        reply = ExplainReply(
            pod_uid=uid,
            namespace=request.namespace,
            name=request.name,
            replica=shell.config.placer_id,
            explanation=self.explain(uid),
        )
        with contextlib.suppress(Exception):  # the asker gave up, or NATS is away
            await shell.bus.publish(delivery.reply, codec.encode(reply))

    def find_pod(self, namespace: str, name: str) -> str | None:
        """The UID of pod ``namespace/name`` as this replica knows it (held here, waiting on the
        board, claimed, or decided lately here), the most recent when several pods had the name;
        None when it knows no such pod."""
        board = self._shell.board
        found: dict[str, float] = {}
        for item in self._held.items.values():
            if (item.pod.namespace, item.pod.name) == (namespace, name):
                found[item.pod.uid] = float("inf")
        for posted_uid in board.uids():
            posted = board.get(posted_uid)
            if posted is None:
                continue
            pod = posted.waiting.pod
            if (pod.namespace, pod.name) == (namespace, name):
                found.setdefault(pod.uid, posted.waiting.updated_at)
        for uid, claim in self._shell.view.claims.items():
            named = claim.booking or claim.request
            if named is not None and (named.namespace, named.name) == (namespace, name):
                found[uid] = max(found.get(uid, 0.0), claim.updated_at)
        for outcome in self._held.outcomes.values():
            request = outcome.request
            if request is not None and (request.namespace, request.name) == (namespace, name):
                found[outcome.pod_uid] = max(found.get(outcome.pod_uid, 0.0), outcome.at)
        return max(found, key=lambda uid: found[uid], default=None)

    def explain(self, pod_uid: str) -> dict[str, Any]:
        """Everything this replica knows about one pod, and every node's verdict for it now."""
        shell = self._shell
        view = shell.view
        outcome = self._held.outcomes.get(pod_uid)
        item = self._held.items.get(pod_uid)
        claim = view.claim(pod_uid)
        posted = shell.board.get(pod_uid)
        request = (
            item.request
            if item is not None
            else outcome.request
            if outcome is not None and outcome.request is not None
            else translate.pod_request(claim.request)
            if claim is not None and claim.request is not None
            else posted.request  # waiting, held by another replica
            if posted is not None
            else None
        )
        if request is not None:  # its tenant as the tenancy file makes it now
            request = view.tenancy.resolve(request)
        answer: dict[str, Any] = {"pod_uid": pod_uid, "replica": shell.config.placer_id}
        if item is not None:
            answer["held_here"] = item.stage
        elif posted is not None:
            answer["held_by"] = posted.waiting.holder
        if outcome is not None:
            answer["last_outcome"] = msgspec.to_builtins(
                msgspec.structs.replace(outcome, request=None)
            )
        if claim is not None:
            answer["claim"] = {
                "state": claim.state,
                "node": claim.booking.node if claim.booking else None,
                "commit": claim.booking.commit if claim.booking else None,
                "gpus": msgspec.to_builtins(claim.booking.containers) if claim.booking else [],
                "reason": claim.reason,
                "placer_id": claim.booking.placer_id if claim.booking else None,
            }
            if claim.booking is not None:
                record = view.records.get(subjects.assignment_key(claim.booking.node, pod_uid))
                answer["record"] = msgspec.to_builtins(record) if record else None
        if request is None or shell.profile is None:
            answer["nodes"] = []
            if outcome is None and claim is None and posted is None:
                answer["error"] = "this replica has not seen the pod"
            return answer
        judged = decider.verdicts(view, shell.profile, request)
        fitting = sorted((v for v in judged if v.fits), key=lambda v: (-v.score, v.node))
        reasons: dict[str, int] = {}
        for verdict in judged:
            if not verdict.fits:
                reasons[verdict.reason] = reasons.get(verdict.reason, 0) + 1
        answer["nodes_total"] = len(judged)
        answer["nodes_fitting"] = len(fitting)
        answer["best_nodes"] = [msgspec.to_builtins(v) for v in fitting[:VERDICTS_SHOWN]]
        answer["not_fitting"] = dict(sorted(reasons.items(), key=lambda kv: -kv[1]))
        answer["not_fitting_nodes"] = [
            {"node": v.node, "reason": v.reason} for v in judged if not v.fits
        ][:VERDICTS_SHOWN]
        quota = decider.quota_status(view, request)
        if quota:
            answer["quota"] = quota
        return answer
