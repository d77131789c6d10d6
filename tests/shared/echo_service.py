"""A minimal service built only from the shared runtime, for runtime tests.

It decodes ``tessera.pods.pending`` at its edge (so malformed input is dead-lettered) and answers
each valid pod on ``tessera.test.echo`` with its uid. Run as a real process with
``python -m tests.shared.echo_service --nats-url URL --http-port 0``.
"""

from __future__ import annotations

import asyncio
import os
import sys

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


def main(argv: list[str]) -> int:
    cli = {"nats_url": argv[argv.index("--nats-url") + 1], "http_port": "0", "log_format": "text"}
    settings = load_settings(Settings, env=os.environ, cli=cli)
    return asyncio.run(run_service(name="echo", settings=settings, body=echo_body))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
