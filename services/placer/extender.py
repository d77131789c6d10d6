"""The placer's scheduler extender: kube-scheduler's ``filter``, ``prioritize`` and ``bind`` over
HTTP (issue 14, docs/design.md §10).

In extender mode kube-scheduler keeps scheduling (affinity, taints, topology spread, preemption)
and asks Tessera about GPUs; Tessera judges the pod's scheduling constraints too, every one of
them, with the same rules as its own decisions (``core/nodeaware.py``): kube-scheduler cannot see
the pods Tessera has placed and not bound yet, and a bind may come after other pods were placed.
The rules that count pods count every pod on a node, Tessera's from their bookings, the others
from the binder's node facts; a namespace selector is resolved from the namespaces the binder
publishes (``namespaces.py``), and a pod whose selector cannot be resolved yet is refused with
that reason, never judged without it. Each placer replica serves the extender on its own port
(``--extender-port``; the Helm chart's Service spreads kube-scheduler's calls over the replicas):

- **filter** and **prioritize** are answered from this replica's view of the cluster, which every
  replica keeps current from the same KV buckets: the pod is parsed as the binder parses pods
  (``shared.podspec``) and every candidate node judged as a decision would judge it
  (:func:`~.decider.verdicts`: the same profile, tenancy, quota and reasons as the placer's own
  rejections). Pods that ask for no ``tessera.dev/*`` resource pass untouched. The requests
  asked about are kept judged in the background as node shapes change (``ready.py``), so a
  request seen before is answered from judgements made ahead of the call.
- **bind** places the pod's GPUs on the node kube-scheduler chose. kube-scheduler's bind call
  names the pod but does not carry it, so the extender asks the binder for it
  (``tessera.extender.pods``: parsed, its namespace selectors resolved, as the binder reads every
  pod), then decides (``decider.decide_on``) and commits through the placer's own path
  (:meth:`~.service.PlacerService.place`: the booking and the pod's claim, which the binder
  binds), and answers once the binder's ``BindingResult`` for the pod on that node arrives
  (``bound``: success; ``failed``: the placement is given back first, so kube-scheduler's next
  try finds the room free). The answer comes within ``--extender-bind-timeout-s``, which must
  stay below kube-scheduler's ``httpTimeout`` for the extender; a placement not bound then is
  given back (the binder's write of the record ``bound`` and the release's fence are both
  first-writer-wins) and kube-scheduler tries the pod again.

Requests kube-scheduler would never send (malformed JSON, missing fields) get HTTP 400 with the
reason in ``Error``; until the replica has loaded the cluster every verb gets 503 (so does a
replica that is stopping). Nothing a request holds can stop the placer: an unexpected failure is
logged and answered 500.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Final, Protocol

import msgspec
from aiohttp import web

from services.placer.core.framework import Profile
from services.placer.metrics import PlacerMetrics
from services.placer.namespaces import Namespaces, follow_namespaces
from services.placer.ready import ReadyJudgements
from services.placer.rules import decider, translate
from services.placer.rules.extender_api import (
    BadRequestError,
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    binding_args,
    filter_args,
    filter_result,
    indifferent,
    passed,
    priorities,
    refused,
)
from services.placer.rules.state import ClusterView
from services.placer.shell.held import Outcome
from shared import codec, subjects
from shared.clock import Clock
from shared.config import ConfigError
from shared.messages.bindings import BindingResult
from shared.messages.extender import PodLookup, PodLookupReply
from shared.messages.pods import PodPending
from shared.podspec import InvalidPod, parse_pending, requests_tessera
from shared.runtime.bus import Bus, BusUnavailableError, Delivery, NoResponderError, Subscription
from shared.runtime.edge import Edge


class Placements(Protocol):
    """What the extender needs of its placer replica (``service.PlacerService``)."""

    @property
    def loaded(self) -> bool:
        """Every bucket loaded and reconciled."""

    @property
    def view(self) -> ClusterView: ...

    @property
    def profile(self) -> Profile | None: ...

    async def place(self, pod: PodPending, *, node: str | None = None) -> Outcome:
        """Decide ``pod`` on ``node`` and commit it; the outcome once committed or refused."""

    async def release_requeue(
        self,
        pod_uid: str,
        node: str,
        *,
        cause: str,
        reason: str,
        only_reserved: bool,
        reported_at: float = 0.0,
    ) -> bool:
        """Give the placement on ``node`` back; whether this call released it."""


log = logging.getLogger(__name__)

VERBS: Final = ("filter", "prioritize", "bind")
MAX_BODY_BYTES: Final = 256 * 1024 * 1024
"""``Nodes`` carries every candidate node as a full object when the extender is not
``nodeCacheCapable``: thousands of nodes are tens of MiB."""
LOOKUP_TIMEOUT_S: Final = 2.0
"""Longest wait for the binder's answer about the pod (within the bind timeout)."""
STALE_RESULT_S: Final = 30.0
"""A binding result reported this long before the placement was decided is about an older one."""

Answer = tuple[bytes, str]
"""A verb's JSON answer (HTTP 200) and its outcome for the metrics."""


def listen(host: str, port: int) -> socket.socket:
    """The extender's listening socket, bound before the service starts so that a taken port
    is a configuration error (one line, exit 2) like a taken ``--http-port``."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family)
    except OSError as error:
        raise ConfigError(
            f"cannot serve the scheduler extender on {host}:{port} (--extender-port): "
            f"{error.strerror or error}"
        ) from None


class Extender:
    """kube-scheduler's extender on one placer replica (see the module docstring)."""

    def __init__(
        self,
        *,
        service: Placements,
        bus: Bus,
        edge: Edge,
        clock: Clock,
        metrics: PlacerMetrics,
        bind_timeout_s: float,
    ) -> None:
        self._service = service
        self._bus = bus
        self._edge = edge
        self._clock = clock
        self._metrics = metrics
        self._bind_timeout_s = bind_timeout_s
        self._results: dict[str, list[tuple[str, asyncio.Future[BindingResult]]]] = {}
        """Pod UID -> (node, future) of each bind waiting for the binder's result."""
        self._subscription: Subscription | None = None
        self._runner: web.AppRunner | None = None
        self.port: int | None = None
        self.judgements = ReadyJudgements(lambda: (service.view, service.profile), metrics)
        """The requests asked about, kept judged in the background (``ready.py``)."""
        self.namespaces = Namespaces()
        """The cluster's namespaces, for the namespace selectors of the pods asked about."""
        self._following: asyncio.Task[None] | None = None

    # --- serving -------------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        # kube-scheduler POSTs to <urlPrefix>/<verb>; a urlPrefix may carry a path of its own.
        app.router.add_post("/{path:.*}", self._dispatch)
        return app

    async def start(self, listener: socket.socket) -> int:
        """Follow binding results and the namespaces, then serve on ``listener`` (from
        :func:`listen`)."""
        self._subscription = await self._bus.subscribe(
            subjects.BINDING_RESULTS_ALL, self._on_result
        )
        self._following = asyncio.create_task(
            follow_namespaces(self.namespaces, bus=self._bus, edge=self._edge, clock=self._clock),
            name="extender-namespaces",
        )
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        await web.SockSite(self._runner, listener).start()
        self.port = int(listener.getsockname()[1])
        self.judgements.start()
        return self.port

    async def stop(self) -> None:
        await self.judgements.stop()
        following, self._following = self._following, None
        if following is not None:
            following.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await following
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._subscription is not None:
            with contextlib.suppress(Exception):
                await self._subscription.unsubscribe()
            self._subscription = None

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        verb = request.path.rstrip("/").rsplit("/", 1)[-1]
        handlers: dict[str, Callable[[bytes], Awaitable[Answer]]] = {
            "filter": self._filter,
            "prioritize": self._prioritize,
            "bind": self._bind,
        }
        handler = handlers.get(verb)
        if handler is None:
            return _error(404, f"no extender verb {verb!r}; the verbs are {', '.join(VERBS)}")
        started = time.perf_counter()
        outcome = "error"
        try:
            if not self._service.loaded:
                outcome = "not_ready"
                return _error(503, "this placer is still loading the cluster; try again")
            body, outcome = await handler(await request.read())
            return web.Response(body=body, content_type="application/json")
        except BadRequestError as error:
            outcome = "bad_request"
            log.warning("malformed extender request", extra={"verb": verb, "reason": str(error)})
            return _error(400, str(error))
        except Exception:  # a bug must not take the replica down: kube-scheduler retries
            log.exception("extender request failed", extra={"verb": verb})
            return _error(500, "internal error; see the placer's log")
        finally:
            self._metrics.extender_requests.labels(verb=verb, outcome=outcome).inc()
            self._metrics.extender_seconds.labels(verb=verb).observe(time.perf_counter() - started)

    # --- filter and prioritize -----------------------------------------------------------------

    async def _judge(
        self, args: ExtenderArgs, candidates: list[str], verb: str
    ) -> list[decider.NodeVerdict] | str | None:
        """The candidates' verdicts; a reason when the request is invalid or its namespace
        selector cannot be resolved yet; None for a pod that asks for no Tessera resource.
        Judged before (``ready.py``) when the request was asked about before; whatever was
        judged when, the answer is ``decider.verdicts`` on the view as it is now."""
        if not requests_tessera(args.pod):
            return None
        parsed = parse_pending(args.pod, self.namespaces.labels, strict_constraints=False)
        if isinstance(parsed, InvalidPod):
            return f"invalid request: {parsed.message}"
        if parsed.constraints is not None and parsed.constraints.counts_pods:
            unresolved = self.namespaces.unresolved(args.pod)
            if unresolved:
                return unresolved
        asked = translate.pod_request(parsed)
        await self.judgements.ready(
            self._service.view.tenancy.resolve(asked), candidates, verb=verb
        )
        profile = self._service.profile
        assert profile is not None  # loaded
        view = self._service.view  # as it is now, after the judging yielded to the loop
        request = view.tenancy.resolve(asked)
        return decider.verdicts(view, profile, request, candidates, detail=False)

    async def _filter(self, body: bytes) -> Answer:
        args = filter_args(body)
        candidates = args.candidates()
        judged = await self._judge(args, candidates, "filter")
        if judged is None:
            answer = passed(args, candidates, candidates)
        elif isinstance(judged, str):
            answer = refused(args, candidates, judged)
        else:
            answer = filter_result(args, candidates, judged)
        return msgspec.json.encode(answer), "ok"

    async def _prioritize(self, body: bytes) -> Answer:
        args = filter_args(body)
        candidates = args.candidates()
        judged = await self._judge(args, candidates, "prioritize")
        scores = priorities(judged) if isinstance(judged, list) else indifferent(candidates)
        return msgspec.json.encode(scores), "ok"

    # --- bind ----------------------------------------------------------------------------------

    async def _bind(self, body: bytes) -> Answer:
        args = binding_args(body)
        outcome, error = await self.bind(args)
        return msgspec.json.encode(ExtenderBindingResult(error=error)), outcome

    async def bind(self, args: ExtenderBindingArgs) -> tuple[str, str]:
        """Place the pod's GPUs on ``args.node`` and have the binder bind it: the outcome
        (bound, refused, timeout) and, unless bound, why not."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._bind_timeout_s
        where = f"pod {args.pod_namespace}/{args.pod_name} on node {args.node}"
        looked = await self._lookup(args, min(LOOKUP_TIMEOUT_S, self._bind_timeout_s / 2))
        if isinstance(looked, str):
            return self._refused(args, looked)
        if looked.node:
            if looked.node == args.node:
                return "bound", ""  # bound already (an earlier bind whose answer was lost)
            return self._refused(args, f"the pod is already bound to node {looked.node}")
        assert looked.pod is not None
        pod = msgspec.structs.replace(looked.pod, extender=True)
        result = self._expect(pod.uid, args.node)
        try:
            try:
                async with asyncio.timeout_at(deadline):
                    outcome = await self._service.place(pod, node=args.node)
            except ValueError:
                return self._refused(args, "a bind of this pod is already in progress")
            if outcome.outcome in ("waiting", "unresolvable"):
                return self._refused(
                    args, f"node {args.node} cannot take the pod: {outcome.message}"
                )
            if outcome.outcome == "deleted":
                return self._refused(args, "the pod was deleted")
            if outcome.outcome not in ("placed", "duplicate"):
                return self._refused(args, outcome.message or "the placement did not commit")
            if outcome.node != args.node:
                return self._refused(
                    args,
                    f"an earlier bind placed the pod on node {outcome.node}; the binder binds it "
                    "there",
                )
            assert outcome.booking is not None
            decided_at = outcome.booking.decided_at
            while True:
                async with asyncio.timeout_at(deadline):
                    bound = await asyncio.shield(result)
                if bound.at + STALE_RESULT_S >= decided_at:
                    break
                self._forget(pod.uid, result)  # about an older placement: wait on
                result = self._expect(pod.uid, args.node)
        except TimeoutError:
            return await self._time_out(args, where)
        finally:
            self._forget(pod.uid, result)
        if bound.outcome == "bound":
            log.info(
                "extender bound a pod",
                extra={"pod": f"{args.pod_namespace}/{args.pod_name}", "node": args.node},
            )
            return "bound", ""
        if bound.outcome == "failed":  # give the room back before kube-scheduler tries again
            with contextlib.suppress(Exception):  # placer-bindings does it too, whatever happens
                await self._service.release_requeue(
                    pod.uid,
                    args.node,
                    cause="failed",
                    reason=bound.reason or "binding failed",
                    only_reserved=False,
                    reported_at=bound.at,
                )
        return self._refused(args, f"the binder could not bind it: {bound.reason}")

    def _refused(
        self, args: ExtenderBindingArgs, why: str, outcome: str = "refused"
    ) -> tuple[str, str]:
        log.info(
            "extender bind refused",
            extra={
                "pod": f"{args.pod_namespace}/{args.pod_name}",
                "node": args.node,
                "reason": why,
            },
        )
        return outcome, why

    async def _time_out(self, args: ExtenderBindingArgs, where: str) -> tuple[str, str]:
        """No outcome in time: give a placement the binder has not bound yet back (its record's
        write and this release's fence are both first-writer-wins), so kube-scheduler's next try
        starts clean; one the binder took is bound shortly, and kube-scheduler sees the pod
        bound."""
        released = False
        with contextlib.suppress(Exception):
            released = await self._service.release_requeue(
                args.pod_uid,
                args.node,
                cause="timeout",
                reason=f"kube-scheduler's bind was not answered within {self._bind_timeout_s:g} s",
                only_reserved=True,
            )
        then = "its placement was given back" if released else "the binder may still bind it"
        return self._refused(
            args, f"{where} was not bound within {self._bind_timeout_s:g} s; {then}", "timeout"
        )

    async def _lookup(self, args: ExtenderBindingArgs, timeout: float) -> PodLookupReply | str:
        """The pod as the binder sees it, or why it cannot be had."""
        lookup = PodLookup(uid=args.pod_uid, namespace=args.pod_namespace, name=args.pod_name)
        try:
            data = await self._bus.request(
                subjects.EXTENDER_PODS, codec.encode(lookup), timeout=timeout
            )
        except NoResponderError:
            return "no Tessera binder is running to read the pod and bind it"
        except TimeoutError:
            return f"the binder did not answer within {timeout:g} s"
        except BusUnavailableError:
            return "the placer is not connected to NATS"
        try:
            reply = codec.decode(data, PodLookupReply)
        except codec.DecodeError as error:
            return f"the binder's answer does not decode: {error}"
        if reply.error:
            return reply.error
        if reply.uid != args.pod_uid or (reply.pod is None and not reply.node):
            return "the binder answered about another pod"
        return reply

    # --- binding results -----------------------------------------------------------------------

    def _expect(self, pod_uid: str, node: str) -> asyncio.Future[BindingResult]:
        future: asyncio.Future[BindingResult] = asyncio.get_running_loop().create_future()
        self._results.setdefault(pod_uid, []).append((node, future))
        return future

    def _forget(self, pod_uid: str, future: asyncio.Future[BindingResult]) -> None:
        waiting = [(n, f) for n, f in self._results.get(pod_uid, []) if f is not future]
        if waiting:
            self._results[pod_uid] = waiting
        else:
            self._results.pop(pod_uid, None)

    async def _on_result(self, delivery: Delivery) -> None:
        waiting = self._results.get(_uid_hint(delivery.data)) if self._results else None
        if not waiting:
            return
        try:
            result = codec.decode(delivery.data, BindingResult)
        except codec.DecodeError:
            return  # a stored one is dead-lettered by the placer-bindings consumer
        for node, future in waiting:
            if node == result.node and not future.done():
                future.set_result(result)


def _uid_hint(data: bytes) -> str:
    """The pod UID of a BindingResult without decoding all of it (most are for other pods)."""
    try:
        return msgspec.json.decode(data, type=_UidOnly).pod_uid
    except msgspec.DecodeError:
        return ""


class _UidOnly(msgspec.Struct):
    pod_uid: str = ""


def _error(status: int, reason: str) -> web.Response:
    return web.Response(
        status=status,
        body=msgspec.json.encode({"Error": reason}),
        content_type="application/json",
    )
