"""How a service plugs into the ``tessera`` command line.

A service module exposes a :class:`Command`; ``tessera <name> --help`` lists every setting with its
environment variable and default (derived from the settings Struct), and ``tessera <name>`` loads
the settings once, reports a configuration error in one line with exit code 2, or runs the service.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import sys
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from shared.config import (
    SECRET_FIELDS,
    ConfigError,
    ProcessSettings,
    add_settings_arguments,
    env_var,
    load_settings,
    option,
)

EXIT_CONFIG_ERROR = 2
EXIT_NOT_BUILT = 3

EVENT_LOOP_ENV = "TESSERA_EVENT_LOOP"
"""``asyncio`` runs a service on asyncio's own event loop instead of uvloop's."""

T = TypeVar("T")


def freeze_startup_heap() -> None:
    """Exempt what the imports and the start-up made (modules, classes, functions: most of a
    fresh process's objects) from every later garbage collection, as they live as long as the
    process. A full collection scans every tracked object with the event loop stopped, so the
    fewer there are, the shorter those pauses (a placer's grew to 30-40 ms within 3,000 pods).
    What is garbage already is collected first, so none of it is kept for good."""
    gc.collect()
    gc.freeze()


def run_event_loop(main: Coroutine[Any, Any, T], *, environ: dict[str, str]) -> T:
    """Run ``main`` to its end on uvloop's event loop (NATS round trips about 15 % faster than on
    asyncio's own, issue 22), or on asyncio's where uvloop is not installed or ``environ``
    names ``TESSERA_EVENT_LOOP=asyncio``."""
    factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    if environ.get(EVENT_LOOP_ENV, "uvloop") != "asyncio":
        try:
            import uvloop
        except ImportError:  # an install without it (not a platform uvloop supports)
            pass
        else:
            factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


S = TypeVar("S", bound=ProcessSettings)


@dataclass(frozen=True)
class Command:
    """A ``tessera`` subcommand: how to configure its parser and how to run it."""

    name: str
    summary: str
    description: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


@dataclass(frozen=True)
class ServiceCommand(Generic[S]):
    """Builds the :class:`Command` of a long-running service from its settings type."""

    name: str
    summary: str
    description: str
    settings: type[S]
    main: Callable[[S], Coroutine[Any, Any, int]] | None
    """The service's entry point; None while the service's core does not exist yet."""

    def command(self) -> Command:
        def configure(parser: argparse.ArgumentParser) -> None:
            add_settings_arguments(parser, self.settings)

        def run(args: argparse.Namespace) -> int:
            for field in SECRET_FIELDS:
                if getattr(args, field, None):
                    print(
                        f"tessera {self.name}: warning: {option(field)} on the command line is "
                        f"visible to every user of this host; use {env_var(field)} or "
                        f"{option(field)}-file",
                        file=sys.stderr,
                    )
            try:
                settings = load_settings(
                    self.settings, env=os.environ, cli=vars(args), config_file=args.config
                )
                if self.main is None:
                    print(
                        f"tessera {self.name}: this service is not built yet (its core does not "
                        "exist in this release); nothing was started",
                        file=sys.stderr,
                    )
                    return EXIT_NOT_BUILT
                freeze_startup_heap()
                return run_event_loop(self.main(settings), environ=dict(os.environ))
            except ConfigError as error:
                print(f"tessera {self.name}: configuration error: {error}", file=sys.stderr)
                return EXIT_CONFIG_ERROR

        return Command(
            name=self.name,
            summary=self.summary,
            description=self.description,
            configure=configure,
            run=run,
        )
