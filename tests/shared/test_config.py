"""Settings load from defaults, file, environment and command line; bad keys fail at start."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Annotated, Any

import msgspec
import pytest

from shared.config import (
    ConfigError,
    NodeSettings,
    Settings,
    add_settings_arguments,
    load_settings,
    require_node,
)


class ExampleSettings(NodeSettings, frozen=True, kw_only=True, forbid_unknown_fields=True):
    interval_s: Annotated[float, msgspec.Meta(gt=0, description="poll interval")] = 5.0
    models: Annotated[tuple[str, ...], msgspec.Meta(description="models")] = ()
    strict: Annotated[bool, msgspec.Meta(description="strict mode")] = False


def test_defaults_without_any_source() -> None:
    settings = load_settings(ExampleSettings, env={})
    assert settings.nats_url == "nats://127.0.0.1:4222"
    assert settings.http_port == 8080
    assert settings.interval_s == 5.0
    assert settings.node == ""


def test_precedence_file_then_env_then_cli(tmp_path: Path) -> None:
    config = tmp_path / "svc.toml"
    config.write_text('http-port = 9000\ninterval_s = 2.5\nnats_url = "nats://file:4222"\n')
    settings = load_settings(
        ExampleSettings,
        env={"TESSERA_HTTP_PORT": "9100", "TESSERA_MODELS": "A100, H100", "NODE_NAME": "gpu-1"},
        cli={"nats_url": "nats://cli:4222", "strict": True, "interval_s": None},
        config_file=str(config),
    )
    assert settings.http_port == 9100  # env beats file
    assert settings.interval_s == 2.5  # file beats default
    assert settings.nats_url == "nats://cli:4222"  # command line beats file
    assert settings.models == ("A100", "H100")
    assert settings.strict is True
    assert settings.node == "gpu-1"


def test_config_file_from_environment_and_json(tmp_path: Path) -> None:
    config = tmp_path / "svc.json"
    config.write_text('{"log_level": "debug"}')
    settings = load_settings(Settings, env={"TESSERA_CONFIG": str(config)})
    assert settings.log_level == "debug"


def test_tessera_node_wins_over_node_name() -> None:
    settings = load_settings(ExampleSettings, env={"TESSERA_NODE": "a", "NODE_NAME": "b"})
    assert require_node(settings) == "a"


def test_unrelated_tessera_variables_are_ignored() -> None:
    """Kubernetes service links inject TESSERA_PLACER_PORT and friends into every container."""
    settings = load_settings(Settings, env={"TESSERA_PLACER_PORT": "tcp://10.0.0.1:80"})
    assert settings.http_port == 8080


@pytest.mark.parametrize(
    ("env", "cli", "file_text", "message"),
    [
        pytest.param(
            {"TESSERA_HTTP_PORT": "eighty"},
            {},
            None,
            "TESSERA_HTTP_PORT (environment): Expected `int`, got `str`",
            id="env-ill-typed",
        ),
        pytest.param(
            {"TESSERA_HTTP_PORT": "70000"},
            {},
            None,
            "TESSERA_HTTP_PORT (environment): Expected `int` <= 65535",
            id="env-out-of-range",
        ),
        pytest.param(
            {"TESSERA_INTERVAL_S": "0"},
            {},
            None,
            "TESSERA_INTERVAL_S (environment): Expected `float` > 0.0",
            id="env-constraint",
        ),
        pytest.param(
            {},
            {"log_level": "loud"},
            None,
            "--log-level (command line): Invalid enum value 'loud'",
            id="cli-bad-choice",
        ),
        pytest.param(
            {},
            {},
            "http_prot = 1\n",
            "unknown key 'http_prot' in config file",
            id="file-unknown-key",
        ),
        pytest.param(
            {}, {}, 'interval_s = "soon"\n', "'interval_s' in config file", id="file-ill-typed"
        ),
        pytest.param({}, {}, "this is not toml", "is not valid TOML", id="file-not-toml"),
        pytest.param(
            {"TESSERA_STRICT": "maybe"},
            {},
            None,
            "TESSERA_STRICT (environment): Expected `bool`",
            id="env-bad-bool",
        ),
    ],
)
def test_bad_configuration_names_the_key_and_expectation(
    tmp_path: Path, env: dict[str, str], cli: dict[str, Any], file_text: str | None, message: str
) -> None:
    config_file = None
    if file_text is not None:
        path = tmp_path / "svc.toml"
        path.write_text(file_text)
        config_file = str(path)
    with pytest.raises(ConfigError) as caught:
        load_settings(ExampleSettings, env=env, cli=cli, config_file=config_file)
    assert message in str(caught.value)


def test_missing_config_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read config file .*missing\.toml"):
        load_settings(Settings, env={}, config_file=str(tmp_path / "missing.toml"))


def test_missing_node_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="no node name: pass --node"):
        require_node(load_settings(ExampleSettings, env={}))


def test_arguments_document_every_field_with_env_and_default() -> None:
    parser = argparse.ArgumentParser()
    add_settings_arguments(parser, ExampleSettings)
    help_text = " ".join(parser.format_help().split())
    for fragment in (
        "--nats-url",
        "env TESSERA_NATS_URL",
        "default: nats://127.0.0.1:4222",
        "--interval-s",
        "poll interval",
        "--models A,B,...",
        "--strict, --no-strict",
        "env TESSERA_NODE or NODE_NAME",
        "--config FILE",
    ):
        assert fragment in help_text
    args = parser.parse_args(["--http-port", "9999", "--no-strict", "--models", "T4,L4"])
    settings = load_settings(ExampleSettings, env={}, cli=vars(args))
    assert (settings.http_port, settings.strict, settings.models) == (9999, False, ("T4", "L4"))
