"""Values files the chart is rendered with: the default and the variants operators use.

Secrets here are test data. Each variant names what it is for; together they make the chart pass
every setting its templates can pass (test_settings checks the allow-list against them), which is
why the dashboard is on wherever NATS credentials are.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

# Chart-created credentials chosen to break naive quoting: digits only, spaces, quotes.
PASSWORD = 'pa ss"word\\12'
TOKEN = "12345678901234567890"
NKEY_SEED = "SUAEL6GG2L2HIF7DUGZJGMRUFKXELGGYFMHF76UO2AYBG3K4YLWR3FKC2Q"
CREDS = (
    "-----BEGIN NATS USER JWT-----\neyJ0eXAiOiJKV1QifQ.test.jwt\n------END NATS USER JWT------\n"
)

# A tenancy the placer's core accepts (namespaces' tenants, seed 001 groups, permissions, quotas).
TENANCY: dict[str, Any] = {
    "namespaces": [{"namespace": "ml-dev", "tenant": "ml-team", "choices": ["shared-pool"]}],
    "groups": [
        {
            "name": "training",
            "tenants": ["ml-team"],
            "gpus": {"model": "A100"},
            "gpu_type": "physical",
        }
    ],
    "permissions": [{"tenant": "ml-team"}],
    "quotas": [{"tenant": "ml-team", "gpus": 16, "gpu_memory_mib": 655360}],
}

VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    # An existing NATS with TLS (mutual, named server) and a .creds file from a managed Secret.
    "external-nats-tls-creds": {
        "nats": {
            "url": "tls://nats.messaging.svc:4222",
            "auth": {"type": "creds", "existingSecret": "tessera-nats-creds"},
            "tls": {
                "enabled": True,
                "caSecret": "nats-ca",
                "clientSecret": "tessera-nats-client",
                "serverName": "nats.messaging.svc",
            },
        },
        "dashboard": {"enabled": True},
    },
    "external-nats-nkey": {
        "nats": {
            "url": "nats://nats.messaging.svc:4222",
            "auth": {"type": "nkey", "nkeySeed": NKEY_SEED},
        },
        "dashboard": {"enabled": True},
    },
    # The chart's NATS as a 3-node JetStream cluster, user and password from a chart Secret.
    "clustered-nats-user-password": {
        "nats": {
            "auth": {"type": "user-password", "user": "tessera", "password": PASSWORD},
            "embedded": {"replicas": 3},
        },
        "dashboard": {"enabled": True},
    },
    # The chart's NATS serving TLS to clients with certificates, token from a chart Secret.
    "embedded-nats-tls-token": {
        "nats": {
            "auth": {"type": "token", "token": TOKEN},
            "tls": {"enabled": True, "clientSecret": "tessera-nats-client"},
            "embedded": {"tls": {"secretName": "tessera-nats-server"}},
        },
        "dashboard": {"enabled": True},
    },
    "extender": {"extender": {"enabled": True}},
    # Placer replicas that each hold a node pool (one more replica stands by).
    "placer-pools": {"placer": {"replicas": 4, "pools": 3, "poolLeaseS": 2.5}},
    # Bursts placed by the profile alone (tightest packing).
    "placer-no-burst-spread": {"placer": {"burstSpread": False}},
    # What the README tells operators to install with in production.
    "production": yaml.safe_load(
        (Path(__file__).parents[2] / "deploy/helm/tessera/values-production.yaml").read_text()
    ),
    # The admission webhook's certificate from cert-manager (an Issuer of the operator's), its
    # failure policy relaxed and one more namespace kept away from it.
    "webhook-cert-manager": {
        "webhook": {
            "failurePolicy": "Ignore",
            "excludeNamespaces": ["batch-legacy"],
            "certificate": {"issuerRef": {"kind": "ClusterIssuer", "name": "internal-ca"}},
        }
    },
    "no-webhook": {"webhook": {"enabled": False}},
    "no-servicemonitor": {"serviceMonitor": {"enabled": False}},
    "dashboard": {"dashboard": {"enabled": True}},
    # DRA mode: the DRA node plugin on GPU nodes labelled tessera.dev/gpu-api=dra, the device
    # plugin on the others (docs/design.md §14).
    "dra": {"gpuApi": "dra"},
    # A demo cluster without GPUs (per-node services on every node: null drops the defaults):
    # fake inventory, tenancy and an operator's own profile.
    "fake-gpus-tenancy-profile": {
        "gpuNodes": {"nodeSelector": None, "tolerations": None},
        "inventory": {"backend": "fake", "fakeGpus": "4xA100-80GB"},
        "deviceplugin": {"mode": "memory-units", "isolation": "mps", "compatEnvs": ["volcano"]},
        "placer": {
            "tenancy": TENANCY,
            "customProfile": {"name": "mine", "scores": [{"plugin": "binpack", "weight": 2}]},
        },
    },
}

# Rendered as if the cluster served the Prometheus Operator's APIs (serviceMonitor.enabled and
# monitoring.prometheusRule.enabled are auto).
WITH_SERVICE_MONITOR_API = frozenset({"default", "dashboard", "no-servicemonitor"})

# Rendered as if the cluster served cert-manager's API (webhook.certificate.certManager=auto).
WITH_CERT_MANAGER_API = frozenset({"webhook-cert-manager"})
