"""``tessera webhook``: entry point of the admission webhook."""

from __future__ import annotations

from services.webhook.server import run_webhook
from services.webhook.settings import WebhookSettings
from shared.runtime.command import ServiceCommand


async def main(settings: WebhookSettings) -> int:
    """Entry point of ``tessera webhook``; returns the process exit code."""
    return await run_webhook(settings)


SERVICE = ServiceCommand(
    name="webhook",
    summary="serve the admission webhook: default Tessera pods, refuse what cannot be placed",
    description="The admission webhook answers the API server's AdmissionReview v1 over HTTPS. "
    "POST /mutate sets spec.schedulerName on pods that ask for tessera.dev/* resources without "
    "choosing a scheduler (or with default-scheduler) and gives a container that asks for a "
    "slice without tessera.dev/gpu one share; POST /validate refuses, at kubectl apply time, a "
    "pod Tessera could never place as written (with the one line the binder would write on it) "
    "or no node of the cluster could ever hold (the "
    "nodes' GPUs it reads from the inventories on NATS, read-only; admission never waits for "
    "NATS), and any change to Tessera's own annotations by anyone but the binder. It needs no "
    "Kubernetes access. /healthz, /readyz and /metrics are on --http-port. Exit codes: 0 after "
    "SIGTERM, 2 a port, the certificate or a NATS credential file cannot be used.",
    settings=WebhookSettings,
    main=main,
)
