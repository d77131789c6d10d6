"""What tests arm and read on the API test double: faults to inject into requests
(:class:`Faults`) and the journal of writes received over HTTP (:class:`Write`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tessera.devcluster.resources import Obj


@dataclass
class Fault:
    """Make matching requests fail: ``status`` (0 = do not fail), after ``delay_s``, or cut the
    connection (``reset``); ``times`` matching requests (None = until cleared)."""

    verb: str | None = None
    """get, list, watch, create, update, patch, delete (None = any)."""
    resource: str | None = None
    """``pods``, ``pods/binding``, ``pods/status``, ``leases``, ``events``, ... (None = any)."""
    status: int = 500
    delay_s: float = 0.0
    reset: bool = False
    times: int | None = 1
    message: str = "injected fault"
    hits: int = 0

    def matches(self, verb: str, resource: str) -> bool:
        if self.times is not None and self.hits >= self.times:
            return False
        return (self.verb is None or self.verb == verb) and (
            self.resource is None or self.resource == resource
        )


class Faults:
    """The faults armed on a server; the first matching one applies to a request."""

    def __init__(self) -> None:
        self._armed: list[Fault] = []

    def add(
        self,
        *,
        verb: str | None = None,
        resource: str | None = None,
        status: int = 500,
        delay_s: float = 0.0,
        reset: bool = False,
        times: int | None = 1,
        message: str = "injected fault",
    ) -> Fault:
        fault = Fault(verb, resource, status, delay_s, reset, times, message)
        self._armed.append(fault)
        return fault

    def clear(self) -> None:
        self._armed.clear()

    def take(self, verb: str, resource: str) -> Fault | None:
        for fault in self._armed:
            if fault.matches(verb, resource):
                fault.hits += 1
                return fault
        return None


@dataclass(frozen=True)
class Write:
    """A write received over HTTP: what was sent and what it produced."""

    verb: str
    resource: str
    namespace: str
    name: str
    content_type: str
    body: Any
    code: int
    result: Obj | None
    """The object as stored afterwards (the pod, for a binding); None when the write failed."""
