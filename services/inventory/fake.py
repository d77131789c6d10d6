"""The fake GPU reader: GPUs described by a small spec, for the demo, the simulator and tests.

Two ways to describe the GPUs:

* ``--fake-gpus 4xA100-80GB`` (several groups comma-separated: ``2xA100-80GB,1xT4-16GB``):
  ``count x model-memory``; the model is reported as written (``A100-80GB``) and the memory is
  the suffix after the last ``-`` (``GB``/``GiB``/``G`` or ``MB``/``MiB``/``M``).
* ``--fake-spec FILE`` (TOML, or JSON when the name ends in ``.json``): a :class:`FakeSpec`,
  which can also script utilisation and used memory per read and inject health events::

      driver_version = "550.54.15"
      [[gpus]]
      model = "A100-SXM4-80GB"
      memory_mib = 81920
      count = 4
      nvlinks = 12                      # NVLinks between every two GPUs of this group
      utilization_pct = [10, 80, 40]    # one value per read, cycled
      memory_used_mib = [1024, 30000]
      [[events]]
      gpu = 1
      at_read = 5                       # delivered after the 5th read
      xid = 79                          # or kind = "ecc_double_bit", or kind = "vanish"

UUIDs are derived from the node name and the GPU index, so they are stable across restarts and
distinct across nodes. Tests and the simulator can also drive a :class:`FakeReader` directly
(:meth:`FakeReader.set_load`, :meth:`FakeReader.inject`, :meth:`FakeReader.vanish`,
:meth:`FakeReader.restore`).
"""

from __future__ import annotations

import asyncio
import re
import uuid as uuid_module
from pathlib import Path
from typing import Annotated, Final, Literal

import msgspec

from services.inventory.reader import (
    BackendUnavailableError,
    GpuFault,
    GpuReading,
    HealthEvent,
    NodeReading,
)
from shared.messages.inventory import GpuLink, GpuProcess, TopologyLevel

_UUID_NAMESPACE: Final = uuid_module.UUID("6f1c2a7e-4f7d-4d53-9a53-7465737365ff")
_GROUP = re.compile(r"^\s*(\d+)\s*[xX]\s*(\S+)-(\d+)\s*(GB|GiB|G|MB|MiB|M)\s*$", re.IGNORECASE)
_IDLE_POWER_W: Final = 60.0
_TDP_W: Final = 400.0


class FakeSpecError(ValueError):
    """The fake GPU description is malformed; the message says where and what was expected."""


class FakeGpuGroup(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``count`` identical GPUs."""

    model: str
    memory_mib: Annotated[int, msgspec.Meta(gt=0)]
    count: Annotated[int, msgspec.Meta(ge=1, le=64)] = 1
    utilization_pct: tuple[Annotated[int, msgspec.Meta(ge=0, le=100)], ...] = (0,)
    """Utilisation per read, cycled."""
    memory_used_mib: tuple[Annotated[int, msgspec.Meta(ge=0)], ...] = (0,)
    """Used memory per read, cycled (capped at the GPU's memory)."""
    nvlinks: Annotated[int, msgspec.Meta(ge=0, le=18)] = 0
    """NVLinks between every two GPUs of this group; 0 = they meet over PCIe."""
    numa_node: int | None = 0
    mig_enabled: bool = False


class FakeEvent(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A scripted health event: delivered (or, for ``vanish``, applied) after read ``at_read``."""

    gpu: Annotated[int, msgspec.Meta(ge=0)]
    at_read: Annotated[int, msgspec.Meta(ge=1)]
    kind: Literal["xid", "ecc_double_bit", "vanish"] = "xid"
    xid: int = 79


class FakeSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The GPUs of a fake node."""

    gpus: tuple[FakeGpuGroup, ...]
    events: tuple[FakeEvent, ...] = ()
    driver_version: str = "fake"


def parse_fake_gpus(text: str) -> FakeSpec:
    """Parse the ``--fake-gpus`` shorthand (``4xA100-80GB,1xT4-16GB``)."""
    groups: list[FakeGpuGroup] = []
    for part in text.split(","):
        if not part.strip():
            continue
        match = _GROUP.match(part)
        if match is None:
            raise FakeSpecError(
                f"--fake-gpus: cannot read {part.strip()!r}: expected COUNTxMODEL-MEMORY, "
                "for example 4xA100-80GB or 2xA100-80GB,1xT4-16GB"
            )
        count, model, amount, unit = match.groups()
        memory_mib = int(amount) * (1024 if unit.lower().startswith("g") else 1)
        if int(count) < 1 or memory_mib < 1:
            raise FakeSpecError(f"--fake-gpus: {part.strip()!r} needs a count and memory above 0")
        groups.append(
            FakeGpuGroup(model=f"{model}-{amount}{unit}", memory_mib=memory_mib, count=int(count))
        )
    if not groups:
        raise FakeSpecError("--fake-gpus is empty: give at least one group such as 1xA100-80GB")
    return FakeSpec(gpus=tuple(groups))


def load_fake_spec(path: Path) -> FakeSpec:
    """Read a :class:`FakeSpec` from a TOML or JSON file."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise FakeSpecError(f"--fake-spec: cannot read {path}: {error.strerror}") from None
    try:
        if path.suffix == ".json":
            return msgspec.json.decode(data, type=FakeSpec)
        return msgspec.toml.decode(data, type=FakeSpec)
    except (msgspec.ValidationError, msgspec.DecodeError) as error:
        raise FakeSpecError(f"--fake-spec {path}: {error}") from None


class _FakeGpu(msgspec.Struct, kw_only=True):
    uuid: str
    index: int
    group: int
    spec: FakeGpuGroup
    utilization_pct: int | None = None
    memory_used_mib: int | None = None
    present: bool = True
    lost: bool = False
    processes: tuple[GpuProcess, ...] = ()


class FakeReader:
    """A :class:`~services.inventory.reader.GpuReader` over the GPUs of a :class:`FakeSpec`."""

    def __init__(self, spec: FakeSpec, *, node: str) -> None:
        self._spec = spec
        self._gpus: list[_FakeGpu] = []
        for group_number, group in enumerate(spec.gpus):
            for _ in range(group.count):
                index = len(self._gpus)
                self._gpus.append(
                    _FakeGpu(
                        uuid="GPU-" + str(uuid_module.uuid5(_UUID_NAMESPACE, f"{node}/{index}")),
                        index=index,
                        group=group_number,
                        spec=group,
                    )
                )
        for event in spec.events:
            if event.gpu >= len(self._gpus):
                raise FakeSpecError(
                    f"fake spec event for gpu {event.gpu}, but the spec has {len(self._gpus)} GPUs"
                )
        self._reads = 0
        self._events: asyncio.Queue[HealthEvent] = asyncio.Queue()
        self._opened = False

    @property
    def backend(self) -> str:
        return "fake"

    @property
    def uuids(self) -> tuple[str, ...]:
        """The uuid of every GPU, by index."""
        return tuple(gpu.uuid for gpu in self._gpus)

    async def open(self) -> None:
        if not self._spec.gpus:
            raise BackendUnavailableError("the fake GPU spec describes no GPU")
        self._opened = True

    async def close(self) -> None:
        self._opened = False

    # --- direct control (tests, simulator) ----------------------------------------------------

    def set_load(
        self,
        index: int,
        *,
        utilization_pct: int | None = None,
        memory_used_mib: int | None = None,
        processes: tuple[GpuProcess, ...] | None = None,
    ) -> None:
        """Fix the load of GPU ``index`` (overrides the scripted values)."""
        gpu = self._gpus[index]
        if utilization_pct is not None:
            gpu.utilization_pct = utilization_pct
        if memory_used_mib is not None:
            gpu.memory_used_mib = memory_used_mib
        if processes is not None:
            gpu.processes = processes

    def inject(
        self, index: int, *, kind: Literal["xid", "ecc_double_bit"] = "xid", xid: int = 79
    ) -> None:
        """Deliver a health event for GPU ``index`` through :meth:`wait_event`."""
        code = xid if kind == "xid" else 0
        self._events.put_nowait(HealthEvent(uuid=self._gpus[index].uuid, kind=kind, code=code))

    def set_lost(self, index: int, lost: bool = True) -> None:
        """Make GPU ``index`` fail every read (as a GPU that fell off the bus), or answer again."""
        self._gpus[index].lost = lost

    def vanish(self, index: int) -> None:
        """Stop reporting GPU ``index`` at all."""
        self._gpus[index].present = False

    def restore(self, index: int) -> None:
        """Report GPU ``index`` again, answering normally."""
        self._gpus[index].present = True
        self._gpus[index].lost = False

    # --- GpuReader ----------------------------------------------------------------------------

    async def read(self) -> NodeReading:
        self._reads += 1
        for event in self._spec.events:
            if event.at_read != self._reads:
                continue
            if event.kind == "vanish":
                self.vanish(event.gpu)
            else:
                self.inject(event.gpu, kind=event.kind, xid=event.xid)
        readings: list[GpuReading] = []
        faults: list[GpuFault] = []
        for gpu in self._gpus:
            if not gpu.present:
                continue
            if gpu.lost:
                faults.append(GpuFault(index=gpu.index, uuid=gpu.uuid, reason="GPU is lost"))
                continue
            readings.append(self._reading(gpu))
        return NodeReading(
            gpus=tuple(readings), faults=tuple(faults), driver_version=self._spec.driver_version
        )

    async def wait_event(self, timeout_s: float) -> HealthEvent | None:
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a cancel that
        # arrives as the event does, and the service's event loop would then never stop.
        try:
            async with asyncio.timeout(timeout_s):
                return await self._events.get()
        except TimeoutError:
            return None

    def _scripted(self, values: tuple[int, ...]) -> int:
        return values[(self._reads - 1) % len(values)]

    def _reading(self, gpu: _FakeGpu) -> GpuReading:
        spec = gpu.spec
        utilization = (
            gpu.utilization_pct
            if gpu.utilization_pct is not None
            else self._scripted(spec.utilization_pct)
        )
        used = gpu.memory_used_mib
        if used is None:
            used = self._scripted(spec.memory_used_mib)
        used = min(used, spec.memory_mib)
        return GpuReading(
            uuid=gpu.uuid,
            index=gpu.index,
            model=spec.model,
            memory_total_mib=spec.memory_mib,
            memory_used_mib=used,
            memory_free_mib=spec.memory_mib - used,
            utilization_pct=utilization,
            temperature_c=30 + utilization * 45 // 100,
            power_w=round(_IDLE_POWER_W + (_TDP_W - _IDLE_POWER_W) * utilization / 100, 1),
            sm_clock_mhz=1410 if utilization else 210,
            sm_clock_max_mhz=1410,
            pci_bus_id=f"00000000:{0x10 + gpu.index:02X}:00.0",
            numa_node=spec.numa_node,
            links=tuple(self._link(gpu, peer) for peer in self._gpus if peer is not gpu),
            mig_enabled=spec.mig_enabled,
            processes=gpu.processes,
        )

    @staticmethod
    def _link(gpu: _FakeGpu, peer: _FakeGpu) -> GpuLink:
        same_group = gpu.group == peer.group
        nvlinks = gpu.spec.nvlinks if same_group else 0
        level: TopologyLevel = "system"
        if same_group:
            level = "single" if nvlinks else "hostbridge"
        return GpuLink(peer_uuid=peer.uuid, level=level, nvlinks=nvlinks)
