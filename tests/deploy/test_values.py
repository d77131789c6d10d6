"""values.schema.json and the chart's own checks refuse bad values with a message that says what
to change; the schema's choices are the services' own."""

from __future__ import annotations

import json
import typing
from typing import Any

import pytest
import yaml

from services.deviceplugin.command import DevicePluginSettings
from services.inventory.command import InventorySettings
from services.placer.core.groups import load_config
from services.placer.core.profiles import BUILTIN, build_profile, load_profile_spec
from shared.config import Settings
from tests.deploy.chart import (
    CHART_DIR,
    component,
    containers,
    named,
    option_values,
    render,
    template_error,
)
from tests.deploy.variants import TENANCY, VARIANTS

SCHEMA = json.loads((CHART_DIR / "values.schema.json").read_text())


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (
            {"nats": {"auth": {"type": "kerberos"}}},
            ["/nats/auth/type", "'none', 'user-password', 'token', 'nkey', 'creds'"],
        ),
        ({"placer": {"replicas": "three"}}, ["/placer/replicas", "want integer"]),
        ({"placer": {"replica": 3}}, ["/placer", "additional properties 'replica' not allowed"]),
        ({"placer": {"profile": "fastest"}}, ["/placer/profile", "'tessera'"]),
        ({"nats": {"url": "localhost:4222"}}, ["/nats/url", "does not match pattern"]),
        ({"nats": {"embedded": {"replicas": 2}}}, ["/nats/embedded/replicas", "1, 3, 5"]),
        (
            {"extender": {"enabled": True, "httpTimeoutSeconds": 2}},
            ["/extender/httpTimeoutSeconds", "minimum"],
        ),
        ({"extender": {"enabled": True, "weight": 0}}, ["/extender/weight", "minimum"]),
        ({"deviceplugin": {"isolation": "mig"}}, ["/deviceplugin/isolation", "'hami-core'"]),
        ({"httpPort": 70000}, ["/httpPort", "maximum"]),
        ({"serviceMonitor": {"enabled": "yes"}}, ["/serviceMonitor/enabled"]),
        ({"binder": {"extraArgs": ["leader-elect"]}}, ["/binder/extraArgs/0"]),
    ],
)
def test_schema_refuses_bad_values_readably(values: dict[str, Any], expected: list[str]) -> None:
    message = template_error(values)
    assert "values don't meet the specifications of the schema" in message
    for part in expected:
        assert part in message, message


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (
            {"nats": {"auth": {"type": "creds", "creds": "x"}}},
            "nats.auth.type=creds needs an external NATS server (set nats.url)",
        ),
        (
            {"nats": {"auth": {"type": "nkey", "nkeySeed": "SU..."}}},
            "needs nats.auth.nkeyPublicKey",
        ),
        (
            {"nats": {"auth": {"type": "user-password", "user": "tessera"}}},
            "set nats.auth.existingSecret, or nats.auth.user and nats.auth.password",
        ),
        ({"nats": {"tls": {"enabled": True}}}, "needs nats.embedded.tls.secretName"),
        (
            {"binder": {"renewDeadlineS": 20}},
            "leaseDurationS (15) > renewDeadlineS (20) > retryPeriodS (2)",
        ),
    ],
)
def test_combinations_the_schema_cannot_express_fail_with_what_to_change(
    values: dict[str, Any], expected: str
) -> None:
    assert expected in template_error(values)


def _literal_choices(settings: type[Settings], field: str) -> set[str]:
    hint = typing.get_type_hints(settings, include_extras=True)[field]
    bare = typing.get_args(hint)[0]
    if typing.get_origin(bare) is tuple:  # tuple[Literal[...], ...]
        bare = typing.get_args(bare)[0]
    return set(typing.get_args(bare))


def test_schema_choices_are_the_services_choices() -> None:
    props = SCHEMA["properties"]
    assert set(props["placer"]["properties"]["profile"]["enum"]) == set(BUILTIN)
    plugin = props["deviceplugin"]["properties"]
    assert set(plugin["mode"]["enum"]) == _literal_choices(DevicePluginSettings, "mode")
    assert set(plugin["isolation"]["enum"]) == _literal_choices(DevicePluginSettings, "isolation")
    assert set(plugin["compatEnvs"]["items"]["enum"]) == _literal_choices(
        DevicePluginSettings, "compat_envs"
    )
    backend = props["inventory"]["properties"]["backend"]["enum"]
    assert set(backend) == _literal_choices(InventorySettings, "backend")
    assert set(props["logLevel"]["enum"]) == _literal_choices(Settings, "log_level")
    assert set(props["logFormat"]["enum"]) == _literal_choices(Settings, "log_format")


def test_values_yaml_documents_every_top_level_key_of_the_schema() -> None:
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    assert set(values) == set(SCHEMA["properties"]) - {"global"}


def test_tenancy_and_profile_reach_the_placer_as_files_it_accepts() -> None:
    objects = render(VARIANTS["fake-gpus-tenancy-profile"])
    data = named(objects, "ConfigMap", component("placer"))["data"]
    assert load_config(data["tenancy.json"]) == load_config(json.dumps(TENANCY))
    profile = build_profile(load_profile_spec(json.loads(data["profile.json"])))
    assert profile.name == "mine"
    (placer,) = [c for c in containers(objects) if c.spec["name"] == "placer"]
    options = option_values(placer.args())
    assert options["--tenancy-file"].endswith("/tenancy.json")
    assert options["--profile"].endswith("/profile.json")
    (mount,) = [
        m
        for m in placer.spec["volumeMounts"]
        if options["--profile"].startswith(m["mountPath"] + "/")
    ]
    assert placer.volume(mount["name"])["configMap"]["name"] == component("placer")


def test_an_empty_tenancy_is_a_valid_one() -> None:
    data = named(render({}), "ConfigMap", component("placer"))["data"]
    assert load_config(data["tenancy.json"]) == load_config("{}")
    assert "profile.json" not in data


def test_external_tls_without_a_ca_secret_trusts_the_images_store() -> None:
    objects = render(
        {
            "nats": {
                "url": "tls://nats.example.com:4222",
                "tls": {"enabled": True},
                "auth": {"type": "none"},
            }
        }
    )
    (placer,) = [c for c in containers(objects) if c.spec["name"] == "placer"]
    assert option_values(placer.args())["--nats-url"] == "tls://nats.example.com:4222"
    assert not [a for a in placer.args() if a.startswith("--nats-tls-")]
    assert not [v for v in placer.pod["volumes"] if v["name"].startswith("nats-")]
