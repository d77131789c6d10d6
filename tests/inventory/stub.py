"""Build and script the C stub ``libnvidia-ml.so.1`` (source in ``nvml_stub/nvml_stub.c``).

The stub reads ``nvml_stub.conf`` beside itself at every ``nvmlInit`` and
``nvmlDeviceGetCount_v2``, and delivers each line appended to ``nvml_stub.events`` once through
``nvmlEventSetWait_v2``. :class:`NvmlStub` writes both from Python values, so a test states the
GPUs it expects and then checks that the real pynvml code path reads exactly those back.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, field, replace
from pathlib import Path

SOURCE = Path(__file__).with_name("nvml_stub") / "nvml_stub.c"
SONAME = "libnvidia-ml.so.1"

XID_EVENT = 0x8
DOUBLE_BIT_ECC_EVENT = 0x2


def build_stub(directory: Path) -> Path:
    """Compile the stub into ``directory``; returns the library's path."""
    gcc = shutil.which("gcc") or "/usr/bin/gcc"
    library = directory / SONAME
    subprocess.run(
        [
            gcc,
            "-O1",
            "-Wall",
            "-Werror",
            "-shared",
            "-fPIC",
            f"-Wl,-soname,{SONAME}",
            "-o",
            str(library),
            str(SOURCE),
            "-lpthread",
        ],
        check=True,
        capture_output=True,
    )
    return library


@dataclass(frozen=True)
class StubGpu:
    """One fake device as the stub reports it."""

    uuid: str
    name: str = "NVIDIA A100-SXM4-80GB"
    bus_id: str = "00000000:07:00.0"
    memory_total_mib: int = 81920
    memory_used_mib: int = 0
    utilization_pct: int = 0
    temperature_c: int = 30
    power_mw: int = 60000
    power_unsupported: bool = False
    sm_clock_mhz: int = 210
    sm_clock_max_mhz: int = 1410
    numa_node: int | None = 0
    mig: bool = False
    lost: bool = False
    nvlinks: tuple[tuple[int, int], ...] = ()
    """(link number, peer device index) for every active NVLink."""
    processes: tuple[tuple[int, int], ...] = ()
    """(pid, used MiB) for every running compute process."""


@dataclass
class NvmlStub:
    """The control files of one built stub."""

    library: Path
    gpus: list[StubGpu] = field(default_factory=list)
    topology: dict[tuple[int, int], int] = field(default_factory=dict)
    p2p_nvlink: tuple[tuple[int, int], ...] = ()
    driver: str = "550.54.15"
    init_error: int = 0
    visible: int | None = None
    """How many devices NVML reports (default: all of ``gpus``)."""

    @property
    def directory(self) -> Path:
        return self.library.parent

    def write(self) -> None:
        """Write the control file; the stub picks it up at its next device count."""
        count = len(self.gpus) if self.visible is None else self.visible
        lines = [f"driver {self.driver}", f"count {count}"]
        if self.init_error:
            lines.append(f"init_error {self.init_error}")
        for (a, b), level in self.topology.items():
            lines.append(f"topology {a} {b} {level}")
        lines.extend(f"p2p_nvlink {a} {b}" for a, b in self.p2p_nvlink)
        for index, gpu in enumerate(self.gpus):
            settings: list[tuple[str, object]] = [
                ("uuid", gpu.uuid),
                ("name", gpu.name),
                ("bus_id", gpu.bus_id),
                ("mem_total_mib", gpu.memory_total_mib),
                ("mem_used_mib", gpu.memory_used_mib),
                ("util", gpu.utilization_pct),
                ("temp", gpu.temperature_c),
                ("power_mw", gpu.power_mw),
                ("power_unsupported", int(gpu.power_unsupported)),
                ("sm_clock", gpu.sm_clock_mhz),
                ("sm_clock_max", gpu.sm_clock_max_mhz),
                ("mig", int(gpu.mig)),
                ("lost", int(gpu.lost)),
            ]
            if gpu.numa_node is not None:
                settings.append(("numa", gpu.numa_node))
            settings.extend(("nvlink", f"{link} {peer}") for link, peer in gpu.nvlinks)
            settings.extend(("proc", f"{pid} {mib}") for pid, mib in gpu.processes)
            lines.extend(f"dev {index} {key} {value}" for key, value in settings)
        (self.directory / "nvml_stub.conf").write_text("\n".join(lines) + "\n")

    def update(self, index: int, **changes: object) -> None:
        """Change one GPU and rewrite the control file."""
        self.gpus[index] = replace(self.gpus[index], **changes)  # type: ignore[arg-type]
        self.write()

    def clear_events(self) -> None:
        (self.directory / "nvml_stub.events").write_text("")

    def inject(self, device: int, event_type: int, data: int = 0) -> None:
        """Queue one health event for ``device`` (delivered once by nvmlEventSetWait)."""
        with (self.directory / "nvml_stub.events").open("a") as events:
            events.write(f"{device} {event_type} {data}\n")
