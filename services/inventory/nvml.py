"""The NVML adapter of the GPU reader port: the only module that imports ``pynvml``.

``pynvml`` comes from NVIDIA's ``nvidia-ml-py`` package. It loads ``libnvidia-ml.so.1`` by name
at ``nvmlInit``; when ``nvml_library`` names a file, that file is loaded first with
``RTLD_GLOBAL`` and the dynamic loader then resolves the name to it (its soname is
``libnvidia-ml.so.1``), which is how an operator points at a driver outside the library path and
how the tests run the real pynvml code path against a C stub.

Every NVML call blocks, so all of them run on this reader's own two worker threads, never on the
event loop: one for reads, one for the long ``nvmlEventSetWait``. Owning the threads lets
``close`` wait for them before it frees the event set and shuts NVML down.

NVML objects never leave this module: readings become :mod:`services.inventory.reader` Structs.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final, TypeVar

import pynvml

from services.inventory.reader import (
    BackendUnavailableError,
    EventKind,
    GpuFault,
    GpuReading,
    HealthEvent,
    NodeReadError,
    NodeReading,
)
from shared.messages.inventory import GpuLink, GpuProcess, TopologyLevel

log = logging.getLogger(__name__)

T = TypeVar("T")

MIB: Final = 1024 * 1024

HEALTH_EVENT_TYPES: Final = (
    pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError
)

_LEVELS: Final[dict[int, TopologyLevel]] = {
    pynvml.NVML_TOPOLOGY_INTERNAL: "internal",
    pynvml.NVML_TOPOLOGY_SINGLE: "single",
    pynvml.NVML_TOPOLOGY_MULTIPLE: "multiple",
    pynvml.NVML_TOPOLOGY_HOSTBRIDGE: "hostbridge",
    pynvml.NVML_TOPOLOGY_NODE: "node",
    pynvml.NVML_TOPOLOGY_SYSTEM: "system",
}

# A query the GPU or driver does not offer leaves its field at a default; any other error means
# the GPU did not answer normally.
_UNAVAILABLE: Final = frozenset(
    {
        pynvml.NVML_ERROR_NOT_SUPPORTED,
        pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
        pynvml.NVML_ERROR_NO_PERMISSION,
    }
)

_FAKE_HINT: Final = "run with --backend fake to simulate GPUs"


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _address(handle: Any) -> int | None:
    return ctypes.cast(handle, ctypes.c_void_p).value


def _optional(call: Callable[[], T], default: T) -> T:
    try:
        return call()
    except pynvml.NVMLError as error:
        if error.value in _UNAVAILABLE:
            return default
        raise


def normalize_bus_id(bus_id: str) -> str:
    """``0000:0A:00.0`` and ``00000000:0a:00.0`` name the same device: compare numerically."""
    try:
        domain, bus, rest = bus_id.strip().split(":")
        device, function = rest.split(".")
        return f"{int(domain, 16):08x}:{int(bus, 16):02x}:{int(device, 16):02x}.{int(function, 16)}"
    except ValueError:
        return bus_id.strip().lower()


def start_error(error: Exception, library: str) -> BackendUnavailableError:
    """The operator-facing error for a failure to start NVML."""
    if isinstance(error, OSError):
        return BackendUnavailableError(
            f"cannot load the NVML library {library}: {error}; check --nvml-library, or "
            f"{_FAKE_HINT}"
        )
    value = getattr(error, "value", None)
    if value == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND:
        return BackendUnavailableError(
            "NVML library not found (libnvidia-ml.so.1): not a GPU node? run with --backend fake "
            "to simulate one, or point --nvml-library at the driver's libnvidia-ml.so.1"
        )
    if value == pynvml.NVML_ERROR_DRIVER_NOT_LOADED:
        return BackendUnavailableError(
            f"NVIDIA driver not loaded (NVML: {error}): check the driver on this node, or "
            f"{_FAKE_HINT}"
        )
    if value == pynvml.NVML_ERROR_NO_PERMISSION:
        return BackendUnavailableError(
            f"no permission to use NVML ({error}): the inventory needs access to /dev/nvidia*; "
            f"or {_FAKE_HINT}"
        )
    return BackendUnavailableError(f"NVML failed to start: {error}; {_FAKE_HINT}")


class NvmlReader:
    """A :class:`~services.inventory.reader.GpuReader` over NVML."""

    def __init__(self, *, library: str = "") -> None:
        self._library = library
        self._reads = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nvml-read")
        self._waits = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nvml-events")
        self._event_set: Any = None
        self._registered: frozenset[str] = frozenset()
        self._uuid_at_handle: dict[int | None, str] = {}
        self._links: dict[tuple[str, ...], dict[str, tuple[GpuLink, ...]]] = {}
        self._started = False
        self._closed = False

    @property
    def backend(self) -> str:
        return "nvml"

    async def _on(self, pool: ThreadPoolExecutor, call: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(pool, call)

    # --- start and stop -----------------------------------------------------------------------

    async def open(self) -> None:
        await self._on(self._reads, self._open_blocking)

    def _open_blocking(self) -> None:
        try:
            if self._library:
                # Loaded first and globally: pynvml's CDLL("libnvidia-ml.so.1") then finds it.
                ctypes.CDLL(self._library, mode=ctypes.RTLD_GLOBAL)
            pynvml.nvmlInit()
        except (OSError, pynvml.NVMLError) as error:
            raise start_error(error, self._library or "libnvidia-ml.so.1") from None
        self._started = True
        try:
            self._event_set = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError as error:
            log.warning(
                "NVML events unavailable; health comes from reads only", extra={"error": str(error)}
            )

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # Waits for a pending nvmlEventSetWait (at most its timeout) before freeing the set.
        await asyncio.to_thread(self._waits.shutdown, wait=True)
        await self._on(self._reads, self._close_blocking)
        self._reads.shutdown(wait=True)

    def _close_blocking(self) -> None:
        if not self._started:
            return
        if self._event_set is not None:
            try:
                pynvml.nvmlEventSetFree(self._event_set)
            except pynvml.NVMLError as error:
                log.warning("cannot free the NVML event set", extra={"error": str(error)})
            self._event_set = None
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError as error:
            log.warning("NVML shutdown failed", extra={"error": str(error)})
        self._started = False

    # --- reads --------------------------------------------------------------------------------

    async def read(self) -> NodeReading:
        return await self._on(self._reads, self._read_blocking)

    def _read_blocking(self) -> NodeReading:
        try:
            count = pynvml.nvmlDeviceGetCount()
            driver = _text(pynvml.nvmlSystemGetDriverVersion())
        except pynvml.NVMLError as error:
            raise NodeReadError(f"NVML cannot list GPUs: {error}") from None
        handles: list[tuple[int, Any, str]] = []
        faults: list[GpuFault] = []
        for index in range(count):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                handles.append((index, handle, _text(pynvml.nvmlDeviceGetUUID(handle))))
            except pynvml.NVMLError as error:
                faults.append(GpuFault(index=index, reason=f"NVML: {error}"))
        self._register_events(handles)
        # Replaced whole, never mutated: the event thread reads it while this thread writes.
        self._uuid_at_handle = {_address(handle): uuid for _, handle, uuid in handles}
        links = self._topology(handles)
        readings: list[GpuReading] = []
        for index, handle, uuid in handles:
            try:
                readings.append(self._read_gpu(index, handle, uuid, links.get(uuid, ())))
            except pynvml.NVMLError as error:
                faults.append(GpuFault(index=index, uuid=uuid, reason=f"NVML: {error}"))
        return NodeReading(gpus=tuple(readings), faults=tuple(faults), driver_version=driver)

    def _read_gpu(
        self, index: int, handle: Any, uuid: str, links: tuple[GpuLink, ...]
    ) -> GpuReading:
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        utilization = _optional(lambda: int(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu), 0)
        power_mw = _optional(lambda: int(pynvml.nvmlDeviceGetPowerUsage(handle)), 0)
        mig = _optional(lambda: pynvml.nvmlDeviceGetMigMode(handle)[0], 0)
        return GpuReading(
            uuid=uuid,
            index=index,
            model=_text(pynvml.nvmlDeviceGetName(handle)),
            memory_total_mib=int(memory.total) // MIB,
            memory_used_mib=int(memory.used) // MIB,
            memory_free_mib=int(memory.free) // MIB,
            utilization_pct=utilization,
            temperature_c=_optional(
                lambda: int(pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)),
                0,
            ),
            power_w=power_mw / 1000,
            sm_clock_mhz=_optional(
                lambda: int(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)), 0
            ),
            sm_clock_max_mhz=_optional(
                lambda: int(pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM)), 0
            ),
            pci_bus_id=_text(pynvml.nvmlDeviceGetPciInfo(handle).busId),
            numa_node=_optional(lambda: int(pynvml.nvmlDeviceGetNumaNodeId(handle)), None),
            links=links,
            mig_enabled=mig == pynvml.NVML_DEVICE_MIG_ENABLE,
            processes=self._processes(handle),
        )

    @staticmethod
    def _processes(handle: Any) -> tuple[GpuProcess, ...]:
        running: list[Any] = _optional(
            lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(handle), []
        )
        return tuple(
            GpuProcess(
                pid=int(process.pid),
                # None: the driver cannot tell (some virtualised setups); count it as 0.
                used_memory_mib=int(process.usedGpuMemory or 0) // MIB,
            )
            for process in running
        )

    def _topology(self, handles: list[tuple[int, Any, str]]) -> dict[str, tuple[GpuLink, ...]]:
        """Links between every two GPUs; fixed by the hardware, so read once per set of GPUs."""
        key = tuple(uuid for _, _, uuid in handles)
        cached = self._links.get(key)
        if cached is not None:
            return cached
        uuid_at_bus: dict[str, str] = {}
        for _, handle, uuid in handles:
            try:
                uuid_at_bus[normalize_bus_id(_text(pynvml.nvmlDeviceGetPciInfo(handle).busId))] = (
                    uuid
                )
            except pynvml.NVMLError:
                continue  # this GPU's own read will report the fault
        links: dict[str, tuple[GpuLink, ...]] = {}
        try:
            for _, handle, uuid in handles:
                nvlinks = self._nvlink_counts(handle, uuid_at_bus)
                links[uuid] = tuple(
                    self._link(handle, peer_handle, peer_uuid, nvlinks.get(peer_uuid, 0))
                    for _, peer_handle, peer_uuid in handles
                    if peer_uuid != uuid
                )
        except pynvml.NVMLError:
            return {}  # a GPU failed mid-way: try again next read rather than cache half a map
        self._links = {key: links}
        return links

    @staticmethod
    def _nvlink_counts(handle: Any, uuid_at_bus: dict[str, str]) -> dict[str, int]:
        counts: dict[str, int] = {}
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            try:
                if not pynvml.nvmlDeviceGetNvLinkState(handle, link):
                    continue
                remote = pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link)
            except pynvml.NVMLError as error:
                if error.value in (*_UNAVAILABLE, pynvml.NVML_ERROR_INVALID_ARGUMENT):
                    break  # no NVLink, or past this GPU's last link
                raise
            peer = uuid_at_bus.get(normalize_bus_id(_text(remote.busId)))
            if peer is not None:  # links to an NVSwitch name no GPU
                counts[peer] = counts.get(peer, 0) + 1
        return counts

    @staticmethod
    def _link(handle: Any, peer_handle: Any, peer_uuid: str, nvlinks: int) -> GpuLink:
        level_code = _optional(
            lambda: int(pynvml.nvmlDeviceGetTopologyCommonAncestor(handle, peer_handle)), -1
        )
        if nvlinks == 0:
            # Behind an NVSwitch no link names the peer, but NVLink P2P still works.
            status = _optional(
                lambda: pynvml.nvmlDeviceGetP2PStatus(
                    handle, peer_handle, pynvml.NVML_P2P_CAPS_INDEX_NVLINK
                ),
                -1,
            )
            nvlinks = 1 if status == pynvml.NVML_P2P_STATUS_OK else 0
        return GpuLink(
            peer_uuid=peer_uuid, level=_LEVELS.get(level_code, "unknown"), nvlinks=nvlinks
        )

    # --- health events ------------------------------------------------------------------------

    def _register_events(self, handles: list[tuple[int, Any, str]]) -> None:
        """Register new GPUs on the event set (a GPU that comes back is registered again)."""
        if self._event_set is None:
            return
        present = frozenset(uuid for _, _, uuid in handles)
        for _, handle, uuid in handles:
            if uuid in self._registered:
                continue
            try:
                pynvml.nvmlDeviceRegisterEvents(handle, HEALTH_EVENT_TYPES, self._event_set)
            except pynvml.NVMLError as error:
                log.warning(
                    "GPU health events unavailable", extra={"uuid": uuid, "error": str(error)}
                )
        self._registered = present

    async def wait_event(self, timeout_s: float) -> HealthEvent | None:
        if self._event_set is None:
            await asyncio.sleep(timeout_s)
            return None
        return await self._on(self._waits, functools.partial(self._wait_blocking, timeout_s))

    def _wait_blocking(self, timeout_s: float) -> HealthEvent | None:
        try:
            data = pynvml.nvmlEventSetWait(self._event_set, max(1, int(timeout_s * 1000)))
        except pynvml.NVMLError_Timeout:
            return None
        except pynvml.NVMLError as error:
            log.warning("waiting for NVML events failed", extra={"error": str(error)})
            time.sleep(timeout_s)  # on this worker thread: keeps a failing wait from spinning
            return None
        kind: EventKind = (
            "xid" if data.eventType == pynvml.nvmlEventTypeXidCriticalError else "ecc_double_bit"
        )
        # A GPU that fell off the bus can no longer tell its uuid: know it by its handle.
        uuid = self._uuid_at_handle.get(_address(data.device))
        if uuid is None:
            try:
                uuid = _text(pynvml.nvmlDeviceGetUUID(data.device))
            except pynvml.NVMLError as error:
                log.warning(
                    "health event from an unknown GPU",
                    extra={"error": str(error), "event_type": data.eventType},
                )
                return None
        return HealthEvent(uuid=uuid, kind=kind, code=int(data.eventData) if kind == "xid" else 0)
