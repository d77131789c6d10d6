"""Reading the operator's profile and tenancy files into checked values (pure: text in).

- ``--profile``: a built-in profile name (``tessera``, ``fgd``, ``bestfit``, ...) or the path of a
  TOML or JSON file holding one :class:`~.core.profiles.ProfileSpec` (``name``, ``scores`` with
  ``plugin``/``weight``/``args``, ``gpu_choice``, ``tie_break``). The file is compiled at start
  so that a bad one stops the placer with the reason instead of failing at the first pod.
- ``--tenancy-file``: seed 001's groups, permissions and quotas
  (:class:`~.core.groups.TenancyConfig`) as JSON or TOML (by the file's suffix; a ConfigMap key
  ending ``.json`` or ``.toml``). The shell watches the file and applies each good version live; a
  version that does not parse or does not check is refused with :class:`ConfigFileError`'s message
  and the last good one stays.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from typing import Any

import msgspec

from services.placer.core.groups import TenancyConfig, load_config
from services.placer.core.profiles import (
    BUILTIN,
    ProfileError,
    ProfileSpec,
    build_profile,
    load_profile_spec,
)


class ConfigFileError(ValueError):
    """A profile or tenancy file that cannot be used; the message says where and why."""


def _parse(text: bytes, *, source: str) -> Mapping[str, Any]:
    try:
        if source.endswith(".toml"):
            data: Any = tomllib.loads(text.decode("utf-8"))
        else:
            data = json.loads(text)
    except (UnicodeDecodeError, ValueError, tomllib.TOMLDecodeError) as error:
        kind = "TOML" if source.endswith(".toml") else "JSON"
        raise ConfigFileError(f"{source} is not valid {kind}: {error}") from None
    if not isinstance(data, dict):
        raise ConfigFileError(f"{source} must hold a table (an object) at the top")
    return data


def parse_tenancy(text: bytes, *, source: str) -> TenancyConfig:
    """The checked tenancy config in ``text`` (JSON, or TOML when ``source`` ends ``.toml``)."""
    data = _parse(text, source=source)
    try:
        return load_config(data)
    except msgspec.ValidationError as error:
        raise ConfigFileError(f"{source}: {error}") from None
    except ValueError as error:
        raise ConfigFileError(f"{source}: {error}") from None


def is_builtin_profile(value: str) -> bool:
    return value in BUILTIN


def parse_profile(text: bytes, *, source: str) -> ProfileSpec:
    """The profile in ``text``, compiled once to prove it is usable."""
    data = _parse(text, source=source)
    try:
        spec = load_profile_spec(data)
        build_profile(spec)
    except ProfileError as error:
        raise ConfigFileError(f"{source}: {error}") from None
    return spec


def known_profiles() -> str:
    return ", ".join(BUILTIN)
