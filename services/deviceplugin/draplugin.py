"""The DRA side of the node plugin: NodePrepareResources and NodeUnprepareResources over this
node's assignment records (``prepare.plan_prepare``), with one CDI spec file per claim.

Prepare writes ``<cdi dir>/gpu.tessera.dev-<claim uid>.json`` (aside, then renamed: a container
runtime never reads half a spec) and answers its devices; unprepare removes the file. The files
are what it prepared, kept across its restarts: a restarted plugin asked again re-derives the same
spec from the records (the kubelet asks again for what it has no answer for), and removes what
the kubelet unprepares by the claim's uid, whatever it remembers. A claim is prepared only as a
placer committed it, so a plugin killed mid-burst and started again prepares nothing twice and
nothing new. Each record a prepared claim completes is moved on to ``allocated`` by
compare-and-set (:class:`RecordWriter`); a write that loses or cannot be sent is left to the
binder, which settles the record of a pod admitted while it was still ``bound``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from services.deviceplugin.rules.allocate import Refusal, ResponseOptions
from services.deviceplugin.rules.prepare import ClaimRef, Prepared, advanced_by, plan_prepare
from shared.clock import Clock
from shared.dra.devices import DRIVER
from shared.messages.assignments import AssignmentRecord, RecordView
from shared.messages.inventory import GpuTelemetry
from shared.messages.ledger import Booking

log = logging.getLogger(__name__)


class NodeState(Protocol):
    """What the plugin follows of its node (the device plugin's mirrors have it all)."""

    def record_views(self) -> Iterable[RecordView]: ...

    @property
    def bookings(self) -> Mapping[str, Booking]: ...

    @property
    def gpus(self) -> Mapping[str, GpuTelemetry]: ...


class RecordWriter(Protocol):
    """Moves an assignment record on."""

    async def advance(self, view: RecordView, record: AssignmentRecord) -> bool:
        """Write ``record`` over ``view`` by compare-and-set; whether it landed."""
        ...


def spec_path(cdi_dir: Path, claim_uid: str) -> Path:
    return cdi_dir / f"{DRIVER}-{claim_uid}.json"


class DraNodePlugin:
    """Implements ``draserver.DraCore`` for one node."""

    def __init__(
        self,
        *,
        node: str,
        state: NodeState,
        records: RecordWriter,
        clock: Clock,
        cdi_dir: Path,
        options: ResponseOptions,
    ) -> None:
        self._node = node
        self._state = state
        self._records = records
        self._clock = clock
        self._cdi_dir = cdi_dir
        self._options = options

    def prepared(self) -> set[str]:
        """Claim uids whose spec is on disk (what this node has prepared, across restarts)."""
        prefix = f"{DRIVER}-"
        return {p.name[len(prefix) : -len(".json")] for p in self._cdi_dir.glob(f"{prefix}*.json")}

    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, Prepared | Refusal]:
        outcomes: dict[str, Prepared | Refusal] = {}
        for claim in claims:
            outcome = plan_prepare(
                claim,
                self._state.record_views(),
                node=self._node,
                gpus=self._state.gpus,
                options=self._options,
                bookings=self._state.bookings,
            )
            if isinstance(outcome, Prepared):
                try:
                    await asyncio.to_thread(self._write, claim.uid, outcome)
                except OSError as error:
                    outcome = Refusal(
                        kind="unavailable",
                        message=f"cannot write the CDI spec of {claim.name}: {error}",
                    )
            if isinstance(outcome, Refusal):
                log.warning(
                    "claim not prepared",
                    extra={"claim": f"{claim.namespace}/{claim.name}", "reason": outcome.message},
                )
            outcomes[claim.uid] = outcome
        await self._advance([o for o in outcomes.values() if isinstance(o, Prepared)])
        return outcomes

    async def _advance(self, prepared: Sequence[Prepared]) -> None:
        moves = advanced_by(
            prepared,
            self._state.record_views(),
            bookings=self._state.bookings,
            now=self._clock.now(),
        )
        for view, record in moves:
            if not await self._records.advance(view, record):
                log.info(
                    "record not moved on after prepare; the binder settles it once the pod runs",
                    extra={"record": view.key},
                )

    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        errors: dict[str, str] = {}
        for claim in claims:
            try:
                with contextlib.suppress(FileNotFoundError):
                    spec_path(self._cdi_dir, claim.uid).unlink()
                errors[claim.uid] = ""
            except OSError as error:
                errors[claim.uid] = f"cannot remove the CDI spec of {claim.name}: {error}"
        return errors

    def _write(self, claim_uid: str, prepared: Prepared) -> None:
        self._cdi_dir.mkdir(parents=True, exist_ok=True)
        path = spec_path(self._cdi_dir, claim_uid)
        temporary = path.with_name(f".{path.name}.tmp")
        temporary.write_text(json.dumps(prepared.spec, indent=1, sort_keys=True))
        os.replace(temporary, path)
