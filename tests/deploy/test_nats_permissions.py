"""The chart's default NATS auth (``nats.auth.type: per-service``): one identity per service with
the subject permissions of ``shared.permissions``, run for real in the chart's own nats-server.

The permissions reach the chart as ``files/nats-permissions.conf``, which ``tessera
nats-permissions`` writes from the code: the file must be exactly that output (regenerate it with
``.venv/bin/tessera nats-permissions > deploy/helm/tessera/files/nats-permissions.conf``).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from shared import permissions, subjects
from shared.config import NatsSecurity
from shared.runtime.bus import BusUnavailableError
from shared.runtime.nats import NatsBus
from tests.deploy.chart import (
    CHART_DIR,
    component,
    containers,
    named,
    option_values,
    render,
    template_error,
)
from tests.deploy.test_nats_embedded import NatsPod, serving

PERMISSIONS_FILE = CHART_DIR / "files" / "nats-permissions.conf"
AUTH_DIR = "/etc/tessera/nats/auth"


def test_the_charts_permissions_are_what_the_code_generates() -> None:
    generated = subprocess.run(
        [sys.executable, "-m", "tessera.cli", "nats-permissions"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert generated == permissions.chart_variables()
    assert PERMISSIONS_FILE.read_text() == generated, (
        "deploy/helm/tessera/files/nats-permissions.conf is stale: regenerate it with "
        "`tessera nats-permissions > deploy/helm/tessera/files/nats-permissions.conf`"
    )


def test_every_role_is_a_user_of_the_charts_nats() -> None:
    objects = render({})
    script = named(objects, "ConfigMap", component("nats-config"))["data"]["auth.sh"]
    users = re.findall(r'user: "([a-z]+)", password: %s, permissions: \$(\w+) ', script)
    assert sorted(users) == sorted((role, permissions.variable(role)) for role in permissions.ROLES)
    secret = named(objects, "Secret", component("nats-auth"))["stringData"]
    assert sorted(secret) == sorted(permissions.ROLES)
    assert len(set(secret.values())) == len(secret) and all(len(p) >= 32 for p in secret.values())


def test_each_service_logs_in_as_itself_with_its_own_password_only() -> None:
    for container in containers(render({})):
        service = container.spec["name"]
        if container.init or service not in permissions.ROLES:
            continue
        assert {"name": "TESSERA_NATS_USER", "value": service} in container.env(), container.where
        assert option_values(container.args())["--nats-password-file"] == f"{AUTH_DIR}/{service}"
        items = container.volume("nats-auth")["secret"]["items"]
        assert items == [{"key": service, "path": service}], container.where


@pytest.mark.parametrize(
    "values",
    [
        {"nats": {"url": "nats://nats.example.com:4222"}},
        {"nats": {"url": "nats://nats.example.com:4222", "auth": {"type": "per-service"}}},
    ],
)
def test_per_service_with_an_external_server_needs_its_passwords(values: dict[str, object]) -> None:
    assert "per-service with an external NATS (nats.url) needs" in template_error(values)


async def test_each_identity_does_its_job_and_no_more_on_the_charts_own_nats(
    tmp_path: Path,
) -> None:
    objects = render({})
    passwords = named(objects, "Secret", component("nats-auth"))["stringData"]
    pod = NatsPod(objects, tmp_path)
    pod.run_init_containers()
    node = "gpu-1.example.com"
    with serving(pod) as address:
        url = f"nats://{address}"
        buses: dict[str, NatsBus] = {}
        try:
            for role in permissions.ROLES:
                buses[role] = await NatsBus.connect(
                    url,
                    name=f"tessera-{role}",
                    security=NatsSecurity(user=role, password=passwords[role]),
                    inbox_prefix=permissions.inbox_prefix(
                        role, node if role in permissions.NODE_ROLES else None
                    ),
                    update_topology=permissions.may_update_topology(role),
                    create_epoch=permissions.creates_store(role),
                    request_timeout=0.5,
                )
            # Each does its job...
            ledger = subjects.booking_key(node, "uid-1")
            record = subjects.assignment_key(node, "uid-1")
            await buses["placer"].kv_put(subjects.KV_LEDGER, ledger, b"{}")
            await buses["binder"].js_publish(subjects.PODS_PENDING, b"{}")
            await buses["deviceplugin"].kv_put(subjects.KV_ASSIGNMENTS, record, b"{}")
            await buses["inventory"].publish(subjects.inventory(node), b"{}")
            assert await buses["dashboard"].kv_get(subjects.KV_ASSIGNMENTS, record) is not None
            inventory = subjects.node_token(node)
            await buses["inventory"].kv_put(subjects.KV_INVENTORY, inventory, b"{}")
            assert await buses["webhook"].kv_get(subjects.KV_INVENTORY, inventory) is not None
            # ... and no more (a refused request gets no answer).
            with pytest.raises(TimeoutError):
                await buses["deviceplugin"].kv_put(subjects.KV_LEDGER, ledger, b"x")
            with pytest.raises(TimeoutError):
                await buses["inventory"].js_publish(subjects.PODS_PENDING, b"x")
            with pytest.raises(TimeoutError):
                await buses["dashboard"].kv_put(subjects.KV_ASSIGNMENTS, record, b"x")
            # An unanswered read is NATS unavailable to its caller, whatever the reason.
            with pytest.raises(BusUnavailableError, match="cannot be read now"):
                await buses["dashboard"].kv_get(subjects.KV_LEDGER, ledger)
            with pytest.raises(BusUnavailableError, match="cannot be read now"):
                await buses["webhook"].kv_get(subjects.KV_ASSIGNMENTS, record)
            with pytest.raises(TimeoutError):
                await buses["webhook"].kv_put(subjects.KV_INVENTORY, inventory, b"x")
            entry = await buses["placer"].kv_get(subjects.KV_LEDGER, ledger)
            assert entry is not None and entry.value == b"{}"
        finally:
            for bus in buses.values():
                await bus.drain()
        log = (pod.root / "nats-server.log").read_text()
    refused = re.findall(r'"\$G/user:(\w+)" - (\w+) Violation - Subject "([^"]+)"', log)
    assert sorted(refused) == sorted(
        [
            ("dashboard", "Publish", f"$JS.API.STREAM.MSG.GET.KV_{subjects.KV_LEDGER}"),
            ("deviceplugin", "Publish", f"$KV.{subjects.KV_LEDGER}.{ledger}"),
            ("inventory", "Publish", subjects.PODS_PENDING),
            ("dashboard", "Publish", f"$KV.{subjects.KV_ASSIGNMENTS}.{record}"),
            ("webhook", "Publish", f"$JS.API.STREAM.MSG.GET.KV_{subjects.KV_ASSIGNMENTS}"),
            ("webhook", "Publish", f"$KV.{subjects.KV_INVENTORY}.{inventory}"),
        ]
    )
