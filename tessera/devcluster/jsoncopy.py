"""Deep copies of plain JSON values, the only kind of value the dev cluster stores.

A round trip through msgspec's JSON codec: several times faster than ``copy.deepcopy`` on the
nested dicts and lists of a pod, and the API double copies objects on every write.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

_ENCODER: Final = msgspec.json.Encoder()


def clone(value: Any) -> Any:
    """A deep copy of a JSON value (dicts, lists, strings, numbers, booleans, None)."""
    return msgspec.json.decode(_ENCODER.encode(value))
