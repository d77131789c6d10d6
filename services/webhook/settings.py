"""Settings of ``tessera webhook`` (option = field name with ``-``; env ``TESSERA_<FIELD>``)."""

from __future__ import annotations

from typing import Annotated

import msgspec

from shared.config import Settings


class WebhookSettings(Settings, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Admission webhook settings. NATS only to read the inventories (the cluster's GPUs) and
    the binder's index of claim classes; an empty --nats-url reads none, and the webhook then
    judges no pod against the cluster and knows no claim."""

    tls_cert_file: Annotated[
        str,
        msgspec.Meta(
            description="serving certificate (PEM, with its chain) the API server verifies "
            "against the webhook configuration's caBundle; re-read when it changes"
        ),
    ] = "/etc/tessera/webhook/tls.crt"
    tls_key_file: Annotated[
        str, msgspec.Meta(description="private key (PEM) of --tls-cert-file")
    ] = "/etc/tessera/webhook/tls.key"
    tls_host: Annotated[
        str, msgspec.Meta(description="address the HTTPS endpoints /mutate and /validate listen on")
    ] = "0.0.0.0"
    tls_port: Annotated[
        int,
        msgspec.Meta(
            ge=0, le=65535, description="port of /mutate and /validate (HTTPS); 0 = any free port"
        ),
    ] = 9443
    cert_check_s: Annotated[
        float,
        msgspec.Meta(
            gt=0, description="how often the certificate files are checked for a new version"
        ),
    ] = 10.0
    scheduler_name: Annotated[
        str,
        msgspec.Meta(
            min_length=1,
            description="scheduler set on pods that ask for tessera.dev/* resources with no "
            "scheduler or default-scheduler",
        ),
    ] = "tessera"
    extender_scheduler_names: Annotated[
        tuple[str, ...],
        msgspec.Meta(
            description="schedulers that ask Tessera's extender (as the binder's "
            "--extender-scheduler-names): their pods keep their scheduler and are validated; "
            "list default-scheduler here when the main kube-scheduler runs the extender"
        ),
    ] = ()
    binder_usernames: Annotated[
        tuple[str, ...],
        msgspec.Meta(
            description="the Kubernetes users that may write Tessera's own pod annotations "
            "(tessera.dev/assignment, bind-time, assigned): the binder's service account; a "
            "pod create or update by anyone else that sets, changes or removes one is refused"
        ),
    ] = ("system:serviceaccount:tessera-system:tessera-binder",)
    claim_wait_s: Annotated[
        float,
        msgspec.Meta(
            ge=0,
            le=5,
            description="how long a pod naming a ResourceClaim or ResourceClaimTemplate the "
            "binder's index of claim classes does not know yet waits for it, to tell whether it "
            "asks for gpu.tessera.dev devices (then its scheduler is set to Tessera's); after "
            "that the pod is let through as written, with a warning; 0 = do not wait",
        ),
    ] = 2.0
    default_gpu_shares: Annotated[
        bool,
        msgspec.Meta(
            description="a container giving tessera.dev/gpu-memory, -memory-percentage or "
            "-cores without tessera.dev/gpu gets tessera.dev/gpu: 1 (one share), as HAMi does"
        ),
    ] = True
