"""Settings: defaults < config file < environment < command line, into one typed, frozen Struct.

Each service declares its settings as a :class:`Settings` subclass whose fields carry a
``msgspec.Meta(description=...)``. From that one declaration this module derives the command-line
options (with help), the environment variable names (``TESSERA_<FIELD>``) and the file keys, so the
three can never drift apart.

Errors are caught at start and name the key, where it came from and what was expected::

    configuration error: TESSERA_HTTP_PORT (environment): Expected `int`, got `str`
    configuration error: unknown key 'http_prot' in /etc/tessera/placer.toml (known: ...)

Environment variables with the ``TESSERA_`` prefix that match no field are ignored rather than
rejected, because Kubernetes injects service-link variables such as ``TESSERA_PLACER_PORT`` into
every container of the namespace.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import tomllib
import typing
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Final, Literal, TypeVar

import msgspec

ENV_PREFIX: Final = "TESSERA_"
CONFIG_FILE_ENV: Final = "TESSERA_CONFIG"
DEFAULT_NATS_URL: Final = "nats://127.0.0.1:4222"

#: Extra environment variables read for a field, after ``TESSERA_<FIELD>``. ``NODE_NAME`` is what
#: the Helm chart sets from the pod's ``spec.nodeName`` through the downward API.
ENV_ALIASES: Final[dict[str, tuple[str, ...]]] = {"node": ("NODE_NAME",)}

S = TypeVar("S", bound="ProcessSettings")


class ConfigError(Exception):
    """The configuration cannot be used; the message names the key and what was expected."""


class ProcessSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Settings every ``tessera`` process has: its health and metrics port, its logging."""

    http_host: Annotated[
        str, msgspec.Meta(description="address for /healthz, /readyz and /metrics")
    ] = "0.0.0.0"
    http_port: Annotated[
        int, msgspec.Meta(ge=0, le=65535, description="port for /healthz, /readyz, /metrics")
    ] = 8080
    log_level: Annotated[
        Literal["debug", "info", "warning", "error"], msgspec.Meta(description="log level")
    ] = "info"
    log_format: Annotated[Literal["json", "text"], msgspec.Meta(description="log line format")] = (
        "json"
    )


class Settings(ProcessSettings, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Settings every service on the bus has: the above and how to reach NATS."""

    nats_url: Annotated[
        str,
        msgspec.Meta(description="NATS server URL (several servers of a cluster: comma-separated)"),
    ] = DEFAULT_NATS_URL
    nats_replicas: Annotated[
        int,
        msgspec.Meta(
            ge=1,
            le=5,
            description="copies of each JetStream stream and KV bucket: 3 on a 3-server "
            "JetStream cluster (a server lost loses nothing), 1 on a single server",
        ),
    ] = 1
    nats_user: Annotated[str, msgspec.Meta(description="NATS user name (with a password)")] = ""
    nats_password: Annotated[
        str,
        msgspec.Meta(
            description="NATS password; prefer the environment or --nats-password-file "
            "(the command line is visible to every user of the host)"
        ),
    ] = ""
    nats_password_file: Annotated[
        str, msgspec.Meta(description="file holding the NATS password (e.g. a mounted Secret)")
    ] = ""
    nats_token: Annotated[
        str,
        msgspec.Meta(description="NATS authentication token; prefer the environment or a file"),
    ] = ""
    nats_token_file: Annotated[
        str, msgspec.Meta(description="file holding the NATS authentication token")
    ] = ""
    nats_nkey_seed_file: Annotated[
        str, msgspec.Meta(description="file holding the NATS user NKey seed (SU...)")
    ] = ""
    nats_creds_file: Annotated[
        str, msgspec.Meta(description="NATS .creds file (user JWT and NKey seed, operator mode)")
    ] = ""
    nats_tls_ca_file: Annotated[
        str,
        msgspec.Meta(
            description="CA bundle (PEM) that signed the NATS server's certificate; setting any "
            "TLS option turns TLS on"
        ),
    ] = ""
    nats_tls_cert_file: Annotated[
        str, msgspec.Meta(description="client certificate (PEM) for NATS mutual TLS")
    ] = ""
    nats_tls_key_file: Annotated[
        str, msgspec.Meta(description="private key (PEM) of --nats-tls-cert-file")
    ] = ""
    nats_tls_server_name: Annotated[
        str,
        msgspec.Meta(
            description="name expected in the NATS server's certificate when it differs from "
            "the host in --nats-url"
        ),
    ] = ""


def env_var(field: str) -> str:
    """The environment variable that sets ``field``."""
    return ENV_PREFIX + field.upper()


def option(field: str) -> str:
    """The command-line option that sets ``field``."""
    return "--" + field.replace("_", "-")


def _field_hints(cls: type[ProcessSettings]) -> dict[str, Any]:
    return typing.get_type_hints(cls, include_extras=True)


def _description(hint: Any) -> str:
    for meta in getattr(hint, "__metadata__", ()):
        if isinstance(meta, msgspec.Meta) and meta.description:
            return meta.description
    return ""


def _bare(hint: Any) -> Any:
    return typing.get_args(hint)[0] if typing.get_origin(hint) is Annotated else hint


def _is_sequence(hint: Any) -> bool:
    return typing.get_origin(_bare(hint)) in (tuple, list)


def _is_bool(hint: Any) -> bool:
    return _bare(hint) is bool


def _choices(hint: Any) -> tuple[str, ...] | None:
    bare = _bare(hint)
    if typing.get_origin(bare) is Literal:
        return tuple(str(v) for v in typing.get_args(bare))
    return None


def add_settings_arguments(parser: argparse.ArgumentParser, cls: type[ProcessSettings]) -> None:
    """Add ``--config`` and one option per settings field, documented with env var and default."""
    parser.add_argument(
        "--config",
        metavar="FILE",
        default=None,
        help=f"TOML or JSON file of settings (env {CONFIG_FILE_ENV}); keys are the option "
        "names with '_' for '-'",
    )
    defaults = cls()
    for name, hint in _field_hints(cls).items():
        env_names = [env_var(name), *ENV_ALIASES.get(name, ())]
        default = getattr(defaults, name)
        shown_default = ",".join(map(str, default)) if isinstance(default, tuple) else default
        help_text = (
            f"{_description(hint)} (env {' or '.join(env_names)}; default: {shown_default!s})"
        )
        if _is_bool(hint):
            parser.add_argument(
                option(name),
                dest=name,
                default=None,
                action=argparse.BooleanOptionalAction,
                help=help_text,
            )
            continue
        metavar = "A,B,..." if _is_sequence(hint) else name.upper()
        choices = _choices(hint)
        parser.add_argument(
            option(name),
            dest=name,
            default=None,
            metavar=None if choices else metavar,
            choices=choices,
            help=help_text,
        )


def _coerce_text(value: str, hint: Any) -> Any:
    """Environment and command-line values are text: split lists, keep the rest for msgspec."""
    if _is_sequence(hint):
        return [item.strip() for item in value.split(",") if item.strip()]
    if _is_bool(hint):
        lowered = value.strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
    return value


def _read_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as error:
        raise ConfigError(f"cannot read config file {path}: {error.strerror}") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as error:
        kind = "JSON" if path.suffix == ".json" else "TOML"
        raise ConfigError(f"config file {path} is not valid {kind}: {error}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a table of settings")
    return {str(key).replace("-", "_"): value for key, value in data.items()}


_PATH_IN_ERROR = re.compile(r"at `\$\.([A-Za-z0-9_]+)")


def _validate_layer(
    cls: type[S], layer: Mapping[str, Any], describe: Mapping[str, str], source: str
) -> None:
    """Check one source on its own, so an error can say where the bad key came from."""
    known = set(_field_hints(cls))
    for key in layer:
        if key not in known:
            raise ConfigError(
                f"unknown key {key!r} in {source} (known: {', '.join(sorted(known))})"
            )
    try:
        msgspec.convert(dict(layer), cls, strict=False)
    except msgspec.ValidationError as error:
        match = _PATH_IN_ERROR.search(str(error))
        key = match.group(1) if match else "?"
        where = describe.get(key, f"{key!r} in {source}")
        reason = str(error).split(" - at ")[0]
        raise ConfigError(f"{where}: {reason}") from None


def load_settings(
    cls: type[S],
    *,
    env: Mapping[str, str],
    cli: Mapping[str, Any] | None = None,
    config_file: str | None = None,
) -> S:
    """Merge defaults, file, environment and command line into ``cls``, or raise ConfigError.

    Args:
        cls: the service's settings type.
        env: the process environment (passed in, never read here).
        cli: parsed command-line values by field name; ``None`` values mean "not given".
        config_file: path from ``--config``; falls back to ``TESSERA_CONFIG`` in ``env``.
    """
    hints = _field_hints(cls)
    merged: dict[str, Any] = {}

    path = config_file or env.get(CONFIG_FILE_ENV)
    if path:
        file_layer = _read_file(Path(path))
        _validate_layer(cls, file_layer, {}, f"config file {path}")
        merged.update(file_layer)

    env_layer: dict[str, Any] = {}
    env_source: dict[str, str] = {}
    for name, hint in hints.items():
        for var in (env_var(name), *ENV_ALIASES.get(name, ())):
            if var in env:
                env_layer[name] = _coerce_text(env[var], hint)
                env_source[name] = f"{var} (environment)"
                break
    _validate_layer(cls, env_layer, env_source, "the environment")
    merged.update(env_layer)

    cli_layer: dict[str, Any] = {}
    for name, value in (cli or {}).items():
        if value is None or name not in hints:
            continue
        cli_layer[name] = _coerce_text(value, hints[name]) if isinstance(value, str) else value
    _validate_layer(
        cls,
        cli_layer,
        {name: f"{option(name)} (command line)" for name in cli_layer},
        "the command line",
    )
    merged.update(cli_layer)

    try:
        return msgspec.convert(merged, cls, strict=False)
    except msgspec.ValidationError as error:  # a combination no single layer showed
        raise ConfigError(str(error)) from None


class NodeSettings(Settings, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Settings of a per-node service (DaemonSet): which node it speaks for."""

    node: Annotated[
        str,
        msgspec.Meta(
            description="Kubernetes node this process serves (the chart sets NODE_NAME "
            "from spec.nodeName)"
        ),
    ] = ""


def require_node(settings: NodeSettings) -> str:
    """The node name, or ConfigError when neither --node, TESSERA_NODE nor NODE_NAME gave one."""
    if not settings.node:
        raise ConfigError("no node name: pass --node, or set NODE_NAME or TESSERA_NODE")
    return settings.node


# --- NATS security ---------------------------------------------------------------------------

SECRET_FIELDS: Final = ("nats_password", "nats_token")
"""Settings whose value is a secret: never logged, and warned about on the command line."""

REDACTED: Final = "***"


@dataclasses.dataclass(frozen=True)
class NatsSecurity:
    """How to authenticate to NATS and whether to use TLS, resolved from the settings once.

    Secrets are held here, already read from their files; ``repr`` never shows them.
    """

    user: str = ""
    password: str = dataclasses.field(default="", repr=False)
    token: str = dataclasses.field(default="", repr=False)
    nkey_seed_file: str = ""
    creds_file: str = ""
    tls_ca_file: str = ""
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_server_name: str = ""

    @property
    def uses_tls(self) -> bool:
        return bool(
            self.tls_ca_file or self.tls_cert_file or self.tls_key_file or self.tls_server_name
        )

    @property
    def secrets(self) -> tuple[str, ...]:
        """Values to scrub from any text that leaves the process (logs, /readyz, errors)."""
        return tuple(secret for secret in (self.password, self.token) if secret)

    def client_options(self) -> dict[str, Any]:
        """The nats-py ``connect`` keyword arguments for the credentials (none when unset)."""
        options: dict[str, Any] = {}
        if self.user:
            options["user"], options["password"] = self.user, self.password
        if self.token:
            options["token"] = self.token
        if self.nkey_seed_file:
            options["nkeys_seed"] = self.nkey_seed_file
        if self.creds_file:
            options["user_credentials"] = self.creds_file
        return options


def _secret_from(settings: Settings, value_field: str, file_field: str) -> str:
    value, path = getattr(settings, value_field), getattr(settings, file_field)
    if value and path:
        raise ConfigError(f"set {option(value_field)} or {option(file_field)}, not both")
    if not path:
        return str(value)
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise ConfigError(
            f"{option(file_field)} {path}: cannot read it ({error.strerror})"
        ) from None
    secret = text.rstrip("\r\n")
    if not secret:
        raise ConfigError(f"{option(file_field)} {path} is empty")
    return secret


def _readable(settings: Settings, fields: tuple[str, ...]) -> None:
    for name in fields:
        path = getattr(settings, name)
        if not path:
            continue
        try:
            with Path(path).open("rb") as handle:
                handle.read(1)
        except OSError as error:
            raise ConfigError(f"{option(name)} {path}: cannot read it ({error.strerror})") from None


def nats_security(settings: Settings) -> NatsSecurity:
    """Resolve the NATS credentials and TLS settings, reading secret files; ConfigError names the
    setting when they cannot be used (a file that cannot be read, two ways to log in at once)."""
    password = _secret_from(settings, "nats_password", "nats_password_file")
    token = _secret_from(settings, "nats_token", "nats_token_file")
    if password and not settings.nats_user:
        raise ConfigError("--nats-password needs --nats-user")
    if settings.nats_user and not password:
        raise ConfigError("--nats-user needs --nats-password or --nats-password-file")
    methods = [
        name
        for name, used in (
            ("--nats-user", bool(settings.nats_user)),
            ("--nats-token", bool(token)),
            ("--nats-nkey-seed-file", bool(settings.nats_nkey_seed_file)),
            ("--nats-creds-file", bool(settings.nats_creds_file)),
        )
        if used
    ]
    if len(methods) > 1:
        raise ConfigError(f"choose one way to log in to NATS, not {' and '.join(methods)}")
    parts = urllib.parse.urlsplit(settings.nats_url)
    if methods and (parts.username or parts.password):
        raise ConfigError(f"credentials are both in --nats-url and in {methods[0]}")
    if bool(settings.nats_tls_cert_file) != bool(settings.nats_tls_key_file):
        raise ConfigError("--nats-tls-cert-file and --nats-tls-key-file go together")
    _readable(
        settings,
        (
            "nats_nkey_seed_file",
            "nats_creds_file",
            "nats_tls_ca_file",
            "nats_tls_cert_file",
            "nats_tls_key_file",
        ),
    )
    return NatsSecurity(
        user=settings.nats_user,
        password=password,
        token=token,
        nkey_seed_file=settings.nats_nkey_seed_file,
        creds_file=settings.nats_creds_file,
        tls_ca_file=settings.nats_tls_ca_file,
        tls_cert_file=settings.nats_tls_cert_file,
        tls_key_file=settings.nats_tls_key_file,
        tls_server_name=settings.nats_tls_server_name,
    )


def redact_url(url: str) -> str:
    """``url`` (or comma-separated URLs) with any password or token in it replaced by ``***``."""
    redacted = []
    for part in url.split(","):
        try:
            parts = urllib.parse.urlsplit(part.strip())
            if not (parts.username or parts.password):
                redacted.append(part.strip())
                continue
            host = parts.hostname or ""
            if parts.port is not None:
                host = f"{host}:{parts.port}"
        except ValueError:  # unparsable: say nothing of it rather than risk a secret
            redacted.append(REDACTED)
            continue
        userinfo = f"{parts.username}:{REDACTED}" if parts.password else REDACTED
        redacted.append(urllib.parse.urlunsplit(parts._replace(netloc=f"{userinfo}@{host}")))
    return ",".join(redacted)


def url_secrets(url: str) -> tuple[str, ...]:
    """Passwords and tokens written inside ``url``, for scrubbing."""
    found = []
    for part in url.split(","):
        try:
            parts = urllib.parse.urlsplit(part.strip())
        except ValueError:
            continue
        if parts.password:
            found.append(urllib.parse.unquote(parts.password))
            found.append(parts.password)
        elif parts.username:  # nats://TOKEN@host
            found.append(urllib.parse.unquote(parts.username))
            found.append(parts.username)
    return tuple(dict.fromkeys(secret for secret in found if secret))
