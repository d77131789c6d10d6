"""Kubernetes resource quantities (``"500m"``, ``"2"``, ``"1Gi"``, ``"1e3"``) as exact numbers.

Pure: the binder reads pod and node resources with it and the API test double validates them with
it, so both agree with the API server on what a quantity means.
"""

from __future__ import annotations

import functools
import math
import re
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Final

_BINARY: Final = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL: Final = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_QUANTITY: Final = re.compile(
    r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(?:(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])|[eE]([+-]?[0-9]+))?$"
)

MIB: Final = 2**20
_DECIMAL_SUFFIXES: Final = {-9: "n", -6: "u", -3: "m", 0: "", 3: "k", 6: "M", 9: "G", 12: "T"}
_DECIMAL_SUFFIXES.update({15: "P", 18: "E"})
_BINARY_SUFFIXES: Final = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")


class QuantityError(ValueError):
    """The text is not a Kubernetes quantity."""


def parse_quantity(value: str | int | float) -> Fraction:
    """The exact value of a quantity; QuantityError when it is not one."""
    if isinstance(value, bool):
        raise QuantityError(f"{value!r} is not a quantity")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError(f"{value!r} is not a quantity")
        return Fraction(Decimal(repr(value)))
    if not isinstance(value, str):
        raise QuantityError(f"{value!r} is not a quantity")
    return _parse_text(value)


@functools.lru_cache(maxsize=4096)
def _parse_text(value: str) -> Fraction:
    """Parse a quantity's text (cached: clusters repeat a few hundred distinct quantities)."""
    match = _QUANTITY.match(value.strip())
    if match is None:
        raise QuantityError(f"{value!r} is not a quantity")
    number, suffix, exponent = match.groups()
    try:
        base = Fraction(Decimal(number))
    except InvalidOperation:
        raise QuantityError(f"{value!r} is not a quantity") from None
    if exponent is not None:
        return base * Fraction(10) ** int(exponent)
    suffix = suffix or ""
    if suffix in _BINARY:
        return base * _BINARY[suffix]
    return base * _DECIMAL[suffix]


def milli(value: str | int | float) -> int:
    """A quantity in thousandths, rounded up (CPU ``"250m"`` -> 250, ``"1"`` -> 1000)."""
    return math.ceil(parse_quantity(value) * 1000)


def mebibytes(value: str | int | float) -> int:
    """A byte quantity in MiB, rounded up (``"1Gi"`` -> 1024, ``"1G"`` -> 954)."""
    return math.ceil(parse_quantity(value) / MIB)


def whole(value: str | int | float) -> int | None:
    """The quantity as an integer, or None when it has a fractional part."""
    number = parse_quantity(value)
    return int(number) if number.denominator == 1 else None


def canonical(value: str | int | float) -> str:
    """The quantity as the API server stores it (``Quantity.String()``): ``1`` and ``"1"`` ->
    ``"1"``, ``"1000m"`` -> ``"1"``, ``"1.5"`` -> ``"1500m"``, ``2000`` -> ``"2k"``,
    ``"2048Mi"`` -> ``"2Gi"``, ``"1536Mi"`` stays, ``"1e3"`` -> ``"1e3"``.

    The format follows the input's: binary suffixes stay binary (below 1Ki, or when not whole,
    decimal), exponents stay exponents, everything else is decimal. Values below a nano are
    rounded up to one, as the API server does. QuantityError when ``value`` is not a quantity.
    """
    number = parse_quantity(value)
    if number == 0:
        return "0"
    text = value.strip() if isinstance(value, str) else ""
    match = _QUANTITY.match(text) if text else None
    suffix = (match.group(2) or "") if match else ""
    exponent_form = bool(match and match.group(3) is not None)
    if suffix in _BINARY and abs(number) >= 1024 and number.denominator == 1:
        whole, power = int(number), 0
        while whole % 1024 == 0 and power < len(_BINARY_SUFFIXES) - 1:
            whole //= 1024
            power += 1
        return f"{whole}{_BINARY_SUFFIXES[power]}"
    # Decimal: an integer mantissa times 10 to a multiple of 3, the largest such exponent.
    nanos = math.ceil(abs(number) * 10**9) * (1 if number > 0 else -1)
    exponent = -9
    while nanos % 1000 == 0 and exponent < 18:
        nanos //= 1000
        exponent += 3
    if exponent_form:
        return f"{nanos}e{exponent}" if exponent else str(nanos)
    return f"{nanos}{_DECIMAL_SUFFIXES[exponent]}"
