"""A minimal service built only from the shared runtime, for runtime tests.

It decodes ``tessera.pods.pending`` at its edge (so malformed input is dead-lettered) and answers
each valid pod on ``tessera.test.echo`` with its uid. Run as a real process with
``python -m tests.shared.echo_service --nats-url URL --http-port 0``.
"""

from __future__ import annotations

import asyncio
import functools
import os
import sys
import time

from shared import subjects
from shared.config import Settings, load_settings
from shared.messages.pods import PodPending
from shared.runtime.lifecycle import ServiceContext, run_service

ECHO_SUBJECT = "tessera.test.echo"


async def echo_body(context: ServiceContext) -> None:
    async def on_pod(pod: PodPending) -> None:
        await context.bus.publish(ECHO_SUBJECT, pod.uid.encode())

    await context.edge.subscribe(subjects.PODS_PENDING, PodPending, on_pod, family="pods")
    context.readiness.set("echo", True)
    await asyncio.Event().wait()  # serve until cancelled


async def stuck_on_stop_body(context: ServiceContext, *, blocking: bool) -> None:
    """Ready at once; on stop, never finishes: it blocks the event loop (``blocking``) or
    swallows every cancellation."""
    context.readiness.set("stuck", True)
    print("stuck body running", file=sys.stderr, flush=True)  # the test's cue to stop it
    while True:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            if blocking:
                time.sleep(3600)  # noqa: ASYNC251 (the point: a blocked event loop)


def main(argv: list[str]) -> int:
    """``--stuck-on-stop blocking|ignoring`` runs a body that never stops, with a 1 s grace and
    a 2 s deadline (instead of the echo service)."""
    cli = {"nats_url": argv[argv.index("--nats-url") + 1], "http_port": "0", "log_format": "text"}
    settings = load_settings(Settings, env=os.environ, cli=cli)
    if "--stuck-on-stop" not in argv:
        return asyncio.run(run_service(name="echo", settings=settings, body=echo_body))
    blocking = argv[argv.index("--stuck-on-stop") + 1] == "blocking"
    return asyncio.run(
        run_service(
            name="stuck",
            settings=settings,
            body=functools.partial(stuck_on_stop_body, blocking=blocking),
            stop_grace_s=1.0,
            stop_deadline_s=2.0,
        )
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
