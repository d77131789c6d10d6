"""The binder's configuration, derived once from its settings (pure, no I/O libraries)."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

SERVICE_ACCOUNT_NAMESPACE: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


@dataclass(frozen=True)
class BinderConfig:
    """What the binder needs to run."""

    scheduler_name: str = "tessera"
    extender_scheduler_names: tuple[str, ...] = ("default-scheduler",)
    """Scheduler names of the pods kube-scheduler schedules with Tessera's extender."""
    leader_elect: bool = True
    lease_name: str = "tessera-binder"
    lease_namespace: str = "default"
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0
    identity: str = ""
    gate_timeout_s: float = 30.0
    node_facts_refresh_s: float = 5.0
    """A node's facts that changed only in what Tessera's own pods request are published at
    most this often (the placer's view does not depend on that part); any other change is
    published at once."""
    allocation_warning_s: float = 60.0
    max_in_flight: int = 256
    dra: bool = False
    """Follow ResourceClaims, allocate Tessera's and publish ResourceSlices (docs/design.md §14)."""
    workers: int = 64
    """Tasks publishing pod and node changes (each kind). Each waits for JetStream's answer to
    its ``PodPending``, which takes 0.1-0.4 s on a machine the burst saturates; four of them fed
    the placers a trickle, so every decision, ledger write and message went alone. Sixty-four
    hand a burst on as it comes: the placers group bookings per node and every process handles
    more per wake-up (``benchmarks/RESULTS.md``)."""


def default_identity() -> str:
    """client-go's choice: the hostname plus a unique suffix (two binders on one host differ)."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


def pod_namespace(environ: Mapping[str, str], account: Path = SERVICE_ACCOUNT_NAMESPACE) -> str:
    """The namespace the binder runs in: ``POD_NAMESPACE``, else its service account's, else
    ``default``."""
    if environ.get("POD_NAMESPACE"):
        return environ["POD_NAMESPACE"]
    try:
        text = account.read_text().strip()
    except OSError:
        text = ""
    return text or "default"
