"""Many per-node services in one process, for large simulated clusters.

A simulated node runs a fake inventory and a device plugin (the kubelet lives in ``tessera up``
itself). As separate processes, 100 nodes are 200 Pythons: each pays its start and its imports,
and their idle loops are most of the machine's CPU, so a benchmark would measure its own
harness. This host runs the services of several nodes in one process, each exactly as
``tessera inventory`` and ``tessera deviceplugin`` run it (its own NATS connection, its own gRPC
socket, its own HTTP port), with the host owning stop and logs; each log line names its service
in ``agent``.

    python -m tessera.up.agents --agents '{"inventory/n1": ["inventory", "--node", "n1", ...],
                                           "deviceplugin/n1": ["deviceplugin", ...]}'
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from services.deviceplugin.command import SERVICE as DEVICEPLUGIN
from services.deviceplugin.command import main as deviceplugin_main
from services.inventory.command import SERVICE as INVENTORY
from services.inventory.command import main as inventory_main
from shared.config import ConfigError, Settings, add_settings_arguments, load_settings
from shared.runtime.command import freeze_startup_heap, run_event_loop
from shared.runtime.lifecycle import Hosted
from shared.runtime.logs import configure_logging
from shared.runtime.metrics import LoopLag
from shared.runtime.tasks import cancel_and_wait

Main = Callable[..., Coroutine[Any, Any, int]]
HOSTABLE: dict[str, tuple[type[Settings], Main]] = {
    INVENTORY.name: (INVENTORY.settings, inventory_main),
    DEVICEPLUGIN.name: (DEVICEPLUGIN.settings, deviceplugin_main),
}


def settings_of(argv: Sequence[str]) -> tuple[Settings, Main]:
    """The settings a ``tessera`` command line gives a hostable service, and its entry point."""
    if not argv or argv[0] not in HOSTABLE:
        raise ConfigError(f"not a hostable service: {' '.join(argv[:1])} ({', '.join(HOSTABLE)})")
    kind, main = HOSTABLE[argv[0]]
    parser = argparse.ArgumentParser(prog=f"tessera {argv[0]}")
    add_settings_arguments(parser, kind)
    args = parser.parse_args(list(argv[1:]))
    return load_settings(kind, env=os.environ, cli=vars(args), config_file=args.config), main


async def host(agents: dict[str, list[str]], *, level: str, fmt: str) -> int:
    """Run every agent until SIGTERM or SIGINT; the first non-zero exit code, else 0."""
    configure_logging(service="agents", level=level, fmt=fmt)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    loop_lag = LoopLag()  # one sampler for the loop every agent shares
    sampling = asyncio.create_task(loop_lag.run(), name="agents-loop-lag")
    runs: list[asyncio.Task[int]] = []
    for agent, argv in agents.items():
        settings, main = settings_of(argv)
        hosted = Hosted(stop=stop, agent=agent, loop_lag=loop_lag)
        runs.append(asyncio.create_task(main(settings, hosted=hosted)))
    # One agent ending on its own ends the host: its supervisor sees a dead process, as it
    # would see that one service's.
    await asyncio.wait(runs, return_when=asyncio.FIRST_COMPLETED)
    stop.set()
    codes: list[Any] = await asyncio.gather(*runs, return_exceptions=True)
    await cancel_and_wait(sampling)
    if any(isinstance(code, BaseException) for code in codes):
        return 1
    return max((int(code) for code in codes), default=0)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tessera.up.agents", description=__doc__)
    parser.add_argument(
        "--agents", required=True, help="JSON object: agent name -> tessera command line"
    )
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--log-format", default="json", choices=("json", "text"))
    args = parser.parse_args(argv)
    try:
        agents = json.loads(args.agents)
        freeze_startup_heap()
        return run_event_loop(
            host(agents, level=args.log_level, fmt=args.log_format), environ=dict(os.environ)
        )
    except ConfigError as error:
        print(f"tessera agents: configuration error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
