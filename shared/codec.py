"""JSON codec for wire messages with cached encoders and decoders.

Decoding is where input is validated: a malformed payload becomes a :class:`DecodeError` carrying a
reason an operator can act on (``Expected `int`, got `str` - at `$.gpus[0].index```), never a
half-built object.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

T = TypeVar("T")

_ENCODER = msgspec.json.Encoder()


class DecodeError(Exception):
    """A payload could not be decoded into the expected message type."""

    def __init__(self, message_type: type[Any], reason: str) -> None:
        super().__init__(f"invalid {message_type.__name__}: {reason}")
        self.message_type = message_type
        self.reason = reason


_DECODERS: dict[type[Any], msgspec.json.Decoder[Any]] = {}


def _decoder(message_type: type[T]) -> msgspec.json.Decoder[T]:
    decoder = _DECODERS.get(message_type)
    if decoder is None:
        decoder = _DECODERS[message_type] = msgspec.json.Decoder(message_type)
    return decoder


def encode(message: object) -> bytes:
    """Encode a message (any msgspec-supported value) as compact JSON."""
    return _ENCODER.encode(message)


def decode(data: bytes | bytearray | memoryview | str, message_type: type[T]) -> T:
    """Decode ``data`` as ``message_type`` or raise :class:`DecodeError` with the reason."""
    try:
        return _decoder(message_type).decode(data)
    except msgspec.ValidationError as error:
        raise DecodeError(message_type, str(error)) from None
    except msgspec.DecodeError as error:
        raise DecodeError(message_type, f"malformed JSON: {error}") from None
