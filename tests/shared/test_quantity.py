"""Kubernetes quantities as exact numbers."""

from __future__ import annotations

from fractions import Fraction

import pytest

from shared.quantity import QuantityError, canonical, mebibytes, milli, parse_quantity, whole


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("2", Fraction(2)),
        ("250m", Fraction(1, 4)),
        ("1.5", Fraction(3, 2)),
        ("1Ki", Fraction(1024)),
        ("2Gi", Fraction(2 * 2**30)),
        ("1G", Fraction(10**9)),
        ("5e3", Fraction(5000)),
        ("1E-3", Fraction(1, 1000)),
        ("100n", Fraction(1, 10**7)),
        (".5", Fraction(1, 2)),
        (3, Fraction(3)),
        (0.25, Fraction(1, 4)),
    ],
)
def test_parse(text: str | int | float, value: Fraction) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "lots", "1.2.3", "1Q", "--1", "Gi", True, float("nan")])
def test_not_a_quantity(text: object) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(text)  # type: ignore[arg-type]


def test_conversions_round_up_and_whole_numbers() -> None:
    assert milli("1") == 1000 and milli("0.0001") == 1
    assert mebibytes("1Gi") == 1024 and mebibytes("1G") == 954 and mebibytes("1") == 1
    assert whole("4") == 4 and whole("1.5") is None and whole("2000m") == 2


@pytest.mark.parametrize(
    ("value", "stored"),
    [
        (1, "1"),
        ("1", "1"),
        ("1000m", "1"),
        ("1.5", "1500m"),
        (0.5, "500m"),
        (2000, "2k"),
        ("4096", "4096"),
        ("2048Mi", "2Gi"),
        ("1536Mi", "1536Mi"),
        ("3.5Gi", "3584Mi"),
        ("512", "512"),
        ("1e3", "1e3"),
        ("0", "0"),
        ("1n", "1n"),
    ],
)
def test_canonical_is_what_the_api_server_stores(value: str | int | float, stored: str) -> None:
    assert canonical(value) == stored
    assert parse_quantity(canonical(value)) == parse_quantity(value)
