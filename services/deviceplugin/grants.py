"""The device plugin's memory of what it granted, across its own restarts (issue 19) and across
NATS losing its store.

A plugin that restarted sees each record fresh: it cannot tell that a record now ``bound`` was
``allocated`` by it before (a writer moved it backwards), and would grant its slices twice. So
every grant is also written to a small state file, loaded at start before any record is taken
(``allocate.granted_problem`` checks each record against it), and a key is forgotten once its
record is released.

A record gone from the bucket without a release (NATS lost its store; its pod still runs with
what it was handed) is not forgotten but kept *unrecorded* (``Granted.unrecorded_at``) for
:data:`UNRECORDED_KEEP_S`: no longer checked against records (a restored record starts afresh),
only answered when the binder asks what this node granted before it restores placements from
the pods' annotations (``tessera.grants.<node>``, :meth:`GrantBook.answer`), so a placement an
annotation misstates is booked as the plugin granted it.

Where: ``<plugin dir>/tessera-state/<endpoint>.granted.json``. The kubelet deletes every file of
its device plugin directory when it starts (its sockets, and whatever else is there, but not
subdirectories), so the file lives in a subdirectory, on the host path the plugin already has.

The kubelet's PodResources API would tell which pods hold devices too, but it needs another host
socket mounted and names pods, not records or commits; the plugin's own file answers exactly the
question, and costs one small write per Allocate (no fsync: it must survive the plugin process,
not the node, whose containers all start again after a crash).

:class:`GrantFile` reads and writes the file; :class:`GrantBook` is what the service holds: the
grants in memory and the writer task that keeps the file up to date.

The write is not on the Allocate path: it took 0.5 ms at the median and 5 ms at p99 on a busy
test VM's disk, the whole Allocate budget. The service answers the kubelet, then its writer
task saves the grants of the last 50 ms in one write in a worker thread, and a stopping plugin
writes what is left. So the file may trail the last grants by that much: a record moved
backwards in that moment and the plugin killed (not stopped) in the same moment is the residue.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final

import msgspec

from services.deviceplugin.rules.allocate import Granted
from shared.clock import Clock
from shared.messages.grants import GrantedPod, NodeGpu, NodeGrants
from shared.messages.inventory import NodeInventory

log = logging.getLogger(__name__)

STATE_DIR: Final = "tessera-state"

UNRECORDED_KEEP_S: Final = 86_400.0
"""How long a grant whose record the store lost is kept to answer a restore (a day: a store is
restored within minutes; a pod deleted meanwhile has its grant dropped at the end of it)."""

GRANTS_WRITE_DELAY_S: Final = 0.05
"""How long grants gather before the state file is written: a burst of Allocates costs one write
(each write hands a thread a file to replace: under a busy disk, up to milliseconds)."""


def state_file(plugin_dir: Path, endpoint: str) -> Path:
    """Where the plugin serving ``endpoint`` in ``plugin_dir`` keeps what it granted."""
    return plugin_dir / STATE_DIR / f"{endpoint}.granted.json"


class GrantFile:
    """Load and save the granted records (record key -> :class:`Granted`)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._encoder = msgspec.json.Encoder()
        self._decoder = msgspec.json.Decoder(dict[str, Granted])
        self._lock = threading.Lock()
        self._written = -1
        """The generation last written: an older snapshot never replaces a newer one."""

    def load(self) -> dict[str, Granted]:
        """What the file holds; nothing when it is missing or cannot be read (logged)."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        except OSError as error:
            log.error(
                "cannot read the grant state file",
                extra={"path": str(self.path), "error": str(error)},
            )
            return {}
        try:
            return self._decoder.decode(data)
        except msgspec.DecodeError as error:
            log.error(
                "the grant state file does not decode; starting without it",
                extra={"path": str(self.path), "error": str(error)},
            )
            return {}

    def save(self, granted: Mapping[str, Granted], generation: int = 0) -> bool:
        """Replace the file with ``granted``, snapshot number ``generation`` (write aside, then
        rename; safe from any thread); False when it failed (logged): the grant stands, only a
        restart could no longer see it."""
        temporary = self.path.with_suffix(".tmp")
        try:
            with self._lock:
                if generation < self._written:
                    return True  # a newer snapshot is on disk already
                self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                temporary.write_bytes(self._encoder.encode(dict(granted)))
                os.replace(temporary, self.path)
                self._written = generation
        except OSError as error:
            log.error(
                "cannot write the grant state file",
                extra={"path": str(self.path), "error": str(error)},
            )
            return False
        return True


class GrantBook:
    """What this plugin granted (kept across its restarts), by record key, written to its
    :class:`GrantFile` off the Allocate path (:meth:`keep`)."""

    def __init__(self, file: GrantFile, *, clock: Clock, failed: Callable[[], None]) -> None:
        """``failed`` is called on each write of the file that failed."""
        self._file = file
        self._clock = clock
        self._failed = failed
        self.given = file.load()
        """What this plugin granted, by record key."""
        self._dirty = asyncio.Event()
        self._changed = 0
        self._writing: asyncio.Future[bool] | None = None

    def get(self, key: str) -> Granted | None:
        """What was granted of the record at ``key``, while the store holds that record."""
        granted = self.given.get(key)
        return granted if granted is not None and granted.unrecorded_at is None else None

    def grant(self, key: str, granted: Granted) -> None:
        self.given[key] = granted
        self._save()

    def forget(self, keys: set[str]) -> None:
        """Released: what was granted of these records is free again."""
        gone = keys & set(self.given)
        for key in gone:
            del self.given[key]
        if gone:
            self._save()

    def unrecord(self, keys: set[str]) -> None:
        """These records are gone from the store without a release: keep what was granted of
        them, unrecorded, to answer a restore (see the module docstring)."""
        now = self._clock.now()
        changed = False
        for key in keys & set(self.given):
            if self.given[key].unrecorded_at is None:
                self.given[key] = msgspec.structs.replace(self.given[key], unrecorded_at=now)
                changed = True
        for key, granted in list(self.given.items()):
            if (
                granted.unrecorded_at is not None
                and now - granted.unrecorded_at > UNRECORDED_KEEP_S
            ):
                del self.given[key]
                changed = True
        if changed:
            self._save()

    def answer(self, node: str, inventory: NodeInventory | None) -> NodeGrants:
        """What this plugin granted, recorded or not, and its node's GPUs."""
        gpus = inventory.gpus if inventory is not None else ()
        return NodeGrants(
            node=node,
            gpus=tuple(
                NodeGpu(uuid=g.uuid, index=g.index, memory_mib=g.memory_total_mib) for g in gpus
            ),
            granted=tuple(
                GrantedPod(
                    pod_uid=key.rsplit(".", 1)[-1], commit=granted.commit, containers=granted.slices
                )
                for key, granted in sorted(self.given.items())
            ),
            answered_at=self._clock.now(),
        )

    def _save(self) -> None:
        """Have the state file written (by :meth:`keep`, off the Allocate path)."""
        self._changed += 1
        self._dirty.set()

    async def keep(self) -> None:
        """Write the state file of grants whenever they changed, in a worker thread, the changes
        of :data:`GRANTS_WRITE_DELAY_S` in one write."""
        while True:
            await self._dirty.wait()
            await self._clock.sleep(GRANTS_WRITE_DELAY_S)
            self._dirty.clear()
            snapshot, generation = dict(self.given), self._changed
            self._writing = asyncio.ensure_future(
                asyncio.to_thread(self._file.save, snapshot, generation)
            )
            if not await asyncio.shield(self._writing):
                self._failed()

    async def write(self) -> None:
        """At stop: let a write in progress end, then write what is not written yet."""
        if self._writing is not None:
            await asyncio.wait({self._writing})
        if self._dirty.is_set():
            self._dirty.clear()
            if not self._file.save(self.given, self._changed):
                self._failed()
