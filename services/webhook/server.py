"""The admission webhook's shell: ``/mutate`` and ``/validate`` over HTTPS around the pure review
(``admission.py``), ``/healthz``, ``/readyz`` and ``/metrics`` on the HTTP port as every service,
and the serving certificate read again whenever its files change (a rotated Secret).

Everything a review decides is in the pod and in what the webhook knows of the cluster's GPUs
and claims, which it follows from the inventories and the binder's claim-class index on NATS,
read-only (``inventory.py``; none with an empty ``--nats-url``). Admission never waits for NATS,
and ``/readyz`` does not depend on it: without it, the webhook judges nothing against the
cluster, and knows no claim. Only a pod naming a claim or template the index (once listed) does
not know waits, up to ``--claim-wait-s``, for the index to learn it (created with the pod, an
instant before); after that, or at once without an index, it is let through as written, with a
warning to the client, logged and counted. A body that is not an AdmissionReview v1 is answered
400 with the reason; the API server then applies the webhook's ``failurePolicy``.
Exit codes: 0 after SIGTERM or SIGINT; 2 when a port cannot be bound, the certificate cannot be
loaded or a NATS credential file cannot be read (one line names the setting).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

import msgspec
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram

from services.webhook.admission import (
    AdmissionPolicy,
    AdmissionRequest,
    BadReview,
    Review,
    mutate,
    read_review,
    validate,
)
from services.webhook.capacity import ClusterGpus
from services.webhook.claimindex import ClaimIndex
from services.webhook.inventory import InventoryMetrics, follow_nats
from services.webhook.settings import WebhookSettings
from shared.config import ConfigError, nats_security, option, url_secrets
from shared.runtime.command import EXIT_CONFIG_ERROR
from shared.runtime.health import HealthServer, Readiness
from shared.runtime.logs import Redactor, configure_logging
from shared.runtime.metrics import register_runtime_metrics
from shared.runtime.tasks import cancel_and_wait

log = logging.getLogger(__name__)

NAME: Final = "webhook"
MAX_BODY_BYTES: Final = 8 * 2**20
"""An AdmissionReview of the largest pod the API server accepts (about 1.5 MiB) fits easily."""
WEBHOOKS: Final = ("mutate", "validate")


@dataclass(frozen=True)
class WebhookMetrics:
    reviews: Counter
    seconds: Histogram
    unknown_claims: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> WebhookMetrics:
        return cls(
            reviews=Counter(
                "tessera_webhook_reviews_total",
                "AdmissionReviews answered, by webhook (mutate, validate) and outcome (allowed, "
                "mutated, denied, bad_request).",
                ["webhook", "outcome"],
                registry=registry,
            ),
            seconds=Histogram(
                "tessera_webhook_review_seconds",
                "Time to answer an AdmissionReview, by webhook.",
                ["webhook"],
                buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1.0),
                registry=registry,
            ),
            unknown_claims=Counter(
                "tessera_webhook_unknown_claims_total",
                "Pods let through as written (with a warning) because a claim or template they "
                "name was not in the binder's index of claim classes (within --claim-wait-s, or "
                "at once when there is no index yet).",
                registry=registry,
            ),
        )


class Certificate:
    """The serving certificate: loaded into one TLS context, loaded again when its files change
    (new connections get the new certificate; a Kubernetes Secret volume swaps its files)."""

    def __init__(self, cert_file: str, key_file: str) -> None:
        self.cert_file, self.key_file = cert_file, key_file
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self._seen = self._stamp()
        self.context.load_cert_chain(cert_file, key_file)

    def _stamp(self) -> tuple[tuple[int, int, int], ...]:
        stamps = []
        for path in (self.cert_file, self.key_file):
            info = os.stat(path)
            stamps.append((info.st_ino, info.st_mtime_ns, info.st_size))
        return tuple(stamps)

    def reload_if_changed(self) -> bool:
        """Load the files again when they changed; True when a new certificate was loaded."""
        try:
            stamp = self._stamp()
            if stamp == self._seen:
                return False
            self.context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as error:  # half-written: the next check tries again
            log.warning(
                "certificate files not loaded; keeping the last", extra={"error": str(error)}
            )
            return False
        self._seen = stamp
        log.info("serving certificate reloaded", extra={"cert_file": self.cert_file})
        return True


class AdmissionApp:
    """The HTTPS side: one POST route per review."""

    def __init__(
        self,
        *,
        policy: AdmissionPolicy,
        metrics: WebhookMetrics,
        cluster: ClusterGpus,
        claims: ClaimIndex,
        claim_wait_s: float,
    ) -> None:
        self._policy = policy
        self._metrics = metrics
        self._cluster = cluster
        self._claims = claims
        self._claim_wait_s = claim_wait_s

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        for webhook in WEBHOOKS:
            app.router.add_post(f"/{webhook}", self._handler(webhook))
        return app

    async def _reviewed(self, webhook: str, request: AdmissionRequest) -> Review | BadReview:
        lookup = self._claims.lookup
        if webhook != "mutate":
            return validate(request, self._policy, self._cluster.nodes(), lookup)
        review = mutate(request, self._policy, lookup)
        if isinstance(review, BadReview) or not review.unknown:
            return review
        if not self._claim_wait_s or not self._claims.known:
            self._unknown(request, review)  # no index to wait for (NATS away): nothing will come
            return review

        # A claim or template the binder has not published yet (``kubectl apply`` of a template
        # and its pod in one file): give the index a moment to learn it before deciding.
        def decided() -> bool:
            again = mutate(request, self._policy, lookup)
            return isinstance(again, BadReview) or not again.unknown

        await self._claims.learned(decided, self._claim_wait_s)
        review = mutate(request, self._policy, lookup)
        if not isinstance(review, BadReview) and review.unknown:
            self._unknown(request, review)
        return review

    def _unknown(self, request: AdmissionRequest, review: Review) -> None:
        self._metrics.unknown_claims.inc()
        log.warning(
            "pod admitted with claims the index does not know",
            extra={"uid": request.uid, "claims": list(review.unknown)},
        )

    def _handler(self, webhook: str) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            started = time.perf_counter()
            try:
                return await self._review(webhook, await request.read())
            finally:
                self._metrics.seconds.labels(webhook=webhook).observe(time.perf_counter() - started)

        return handle

    async def _review(self, webhook: str, body: bytes) -> web.Response:
        request = read_review(body)
        review = (
            request if isinstance(request, BadReview) else await self._reviewed(webhook, request)
        )
        if isinstance(review, BadReview):
            self._metrics.reviews.labels(webhook=webhook, outcome="bad_request").inc()
            log.warning("bad AdmissionReview", extra={"webhook": webhook, "reason": review.reason})
            return web.json_response({"error": review.reason}, status=400)
        self._metrics.reviews.labels(webhook=webhook, outcome=review.outcome).inc()
        if review.outcome != "allowed":
            assert isinstance(request, AdmissionRequest)
            log.info(
                f"pod {review.outcome}",
                extra={
                    "webhook": webhook,
                    "namespace": request.namespace,
                    "uid": request.uid,
                    "fields": list(review.reasons),
                },
            )
        return web.Response(
            body=msgspec.json.encode(review.answer), content_type="application/json"
        )


def policy_of(settings: WebhookSettings) -> AdmissionPolicy:
    return AdmissionPolicy(
        scheduler_name=settings.scheduler_name,
        extender_scheduler_names=settings.extender_scheduler_names,
        default_gpu_shares=settings.default_gpu_shares,
        binder_usernames=settings.binder_usernames,
    )


async def run_webhook(
    settings: WebhookSettings,
    *,
    stop: asyncio.Event | None = None,
    readiness: Readiness | None = None,
    registry: CollectorRegistry | None = None,
) -> int:
    """Serve until a signal (or ``stop``); the exit code."""
    try:
        security = nats_security(settings)
    except ConfigError as error:
        configure_logging(service=NAME, level=settings.log_level, fmt=settings.log_format)
        log.error(str(error))
        return EXIT_CONFIG_ERROR
    redact = Redactor((*security.secrets, *url_secrets(settings.nats_url)))
    configure_logging(
        service=NAME, level=settings.log_level, fmt=settings.log_format, redact=redact
    )
    stop = stop or asyncio.Event()
    readiness = readiness or Readiness()
    registry = registry or CollectorRegistry()
    register_runtime_metrics(registry, None)
    try:
        certificate = Certificate(settings.tls_cert_file, settings.tls_key_file)
    except (OSError, ssl.SSLError) as error:
        log.error(
            f"cannot load the serving certificate ({option('tls_cert_file')} "
            f"{settings.tls_cert_file}, {option('tls_key_file')} {settings.tls_key_file}): "
            f"{getattr(error, 'strerror', None) or error}"
        )
        return EXIT_CONFIG_ERROR
    readiness.set("https", False, "starting")
    health = HealthServer(readiness=readiness, registry=registry, service=NAME)
    cluster = ClusterGpus()
    claims = ClaimIndex()
    admission = web.AppRunner(
        AdmissionApp(
            policy=policy_of(settings),
            metrics=WebhookMetrics.create(registry),
            cluster=cluster,
            claims=claims,
            claim_wait_s=settings.claim_wait_s if settings.nats_url else 0.0,
        ).app(),
        access_log=None,
    )
    await admission.setup()
    try:
        port = await health.start(settings.http_host, settings.http_port)
        readiness.http_port = port
        site = web.TCPSite(
            admission, settings.tls_host, settings.tls_port, ssl_context=certificate.context
        )
        await site.start()
    except OSError as error:
        log.error(
            f"cannot listen on {option('http_port')} {settings.http_port} or {option('tls_port')} "
            f"{settings.tls_port}: {error.strerror or error}"
        )
        await health.stop()
        await admission.cleanup()
        return EXIT_CONFIG_ERROR
    sockets = getattr(site._server, "sockets", None) or []
    tls_port = int(sockets[0].getsockname()[1]) if sockets else settings.tls_port
    log.info("service starting", extra={"http_port": port, "tls_port": tls_port})
    readiness.set("https", True, f"serving /mutate and /validate on port {tls_port}")
    follower = (
        asyncio.create_task(
            follow_nats(settings, security, cluster, claims, InventoryMetrics.create(registry)),
            name="webhook-inventories",
        )
        if settings.nats_url
        else None
    )
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(settings.cert_check_s):
                    await stop.wait()
            certificate.reload_if_changed()
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        readiness.set("https", False, "stopping")
        if follower is not None:
            await cancel_and_wait(follower)
        await admission.cleanup()
        await health.stop()
        log.info("service stopped")
    return 0
