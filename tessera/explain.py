"""``tessera explain NAMESPACE/POD``: where a pod went and why, or why it is Pending, from the
placers, for people (the default) or as JSON (``-o json``).

It asks over NATS (``tessera.placer.explain``, request/reply), not a placer's HTTP port: NATS is
what an operator of Tessera already reaches, with the credentials and TLS every service takes;
every placer replica listens, so no replica's address is needed, and the replicas that know the
pod answer from the state they share (its claim, its record, the waiting board) and the one that
holds it adds what it last decided. The answer is what ``GET /v1/pods/<uid>`` on a placer says.

Exit codes: 0 explained; 1 no placer knows the pod; 2 usage or configuration error; 3 NATS
cannot be reached or no placer is running; 5 NATS refused the credentials.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final

import msgspec

from shared import codec, subjects
from shared.config import (
    ConfigError,
    Settings,
    add_settings_arguments,
    load_settings,
    nats_security,
)
from shared.messages.explain import ExplainReply, ExplainRequest
from shared.runtime.bus import NoResponderError
from shared.runtime.command import EXIT_CONFIG_ERROR, Command
from shared.runtime.nats import NatsBus, NatsRefusedError, NatsUnreachableError, unreachable_reason

EXIT_UNKNOWN: Final = 1
EXIT_UNREACHABLE: Final = 3
EXIT_REFUSED: Final = 5
NOT_SHOWN: Final = ("http_host", "http_port", "log_level", "log_format")
"""Process settings a one-shot client has no use for (hidden from its --help)."""


class ExplainError(Exception):
    """Why no explanation came; ``code`` is the exit code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def parse_target(text: str) -> tuple[str, str]:
    """``NAMESPACE/POD`` -> (namespace, name); ExplainError (exit 2) when it is not that."""
    namespace, slash, name = text.partition("/")
    if not slash or not namespace or not name or "/" in name:
        raise ExplainError(
            f"{text!r}: name the pod as NAMESPACE/POD (for example default/train-1)",
            EXIT_CONFIG_ERROR,
        )
    return namespace, name


async def ask(settings: Settings, namespace: str, name: str, *, timeout_s: float) -> ExplainReply:
    """The first placer's explanation of ``namespace/name``, or ExplainError saying why none."""
    try:
        bus = await NatsBus.connect(
            settings.nats_url,
            name="tessera-explain",
            security=nats_security(settings),
            topology=False,
        )
    except NatsRefusedError as error:
        raise ExplainError(f"NATS refused this client: {error}", EXIT_REFUSED) from None
    except (NatsUnreachableError, OSError) as error:
        reason = unreachable_reason(error, settings.nats_url)
        raise ExplainError(f"cannot reach NATS: {reason}", EXIT_UNREACHABLE) from None
    try:
        question = codec.encode(ExplainRequest(namespace=namespace, name=name))
        try:
            answer = await bus.request(subjects.PLACER_EXPLAIN, question, timeout=timeout_s)
        except NoResponderError:
            raise ExplainError(
                f"no placer answers on {subjects.PLACER_EXPLAIN}: is a placer running (and "
                "ready) on this NATS?",
                EXIT_UNREACHABLE,
            ) from None
        except TimeoutError:
            raise ExplainError(
                f"no placer knows pod {namespace}/{name} (none answered within {timeout_s:g} s): "
                "it asks for no Tessera resource, is not Tessera's, no placer has seen it yet, "
                "or it is gone",
                EXIT_UNKNOWN,
            ) from None
        return codec.decode(answer, ExplainReply)
    finally:
        await bus.drain()


def _when(at: float | None) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if at else "-"


def _slices(containers: Any) -> list[str]:
    lines = []
    for container in containers or ():
        for piece in container.get("gpus", ()):
            memory = piece.get("memory_mib", 0)
            cores = piece.get("core_milli", piece.get("cores", 0))
            share = f"{cores // 10}% SMs" if "core_milli" in piece else f"{cores}% SMs"
            whole = " (whole GPU)" if piece.get("exclusive") else ""
            lines.append(
                f"    {container.get('container')}: GPU {piece.get('index')} {piece.get('uuid')}, "
                f"{memory} MiB, {share}{whole}"
            )
    return lines


def render(reply: ExplainReply) -> str:
    """The explanation for people."""
    e: Mapping[str, Any] = reply.explanation
    lines = [f"Pod {reply.namespace}/{reply.name} (uid {reply.pod_uid}), from {reply.replica}"]
    if e.get("held_here"):
        lines.append(f"  held by {reply.replica}: {e['held_here']}")
    elif e.get("held_by"):
        lines.append(f"  waiting, held by {e['held_by']}")
    outcome = e.get("last_outcome")
    if outcome:
        said = f"  last outcome here: {outcome['outcome']} at {_when(outcome.get('at'))}"
        if outcome.get("node"):
            said += f" on node {outcome['node']}"
        lines.append(said)
        if outcome.get("message"):
            lines.append(f"    {outcome['message']}")
    claim = e.get("claim")
    if claim:
        where = f" on node {claim['node']}" if claim.get("node") else ""
        lines.append(f"  claim: {claim['state']}{where} (commit {claim.get('commit') or '-'})")
        if claim.get("reason"):
            lines.append(f"    why: {claim['reason']}")
        lines += _slices(claim.get("gpus"))
    record = e.get("record")
    if record:
        times = ", ".join(
            f"{what} {_when(record[key])}"
            for what, key in (
                ("decided", "decided_at"),
                ("bound", "bound_at"),
                ("released", "released_at"),
            )
            if record.get(key)
        )
        lines.append(f"  assignment record: {record['state']} ({times})")
    if "nodes_total" in e:
        lines.append(f"  nodes now: {e['nodes_fitting']} of {e['nodes_total']} fit")
        for verdict in e.get("best_nodes", ())[:5]:
            lines.append(f"    fits {verdict['node']} (score {verdict.get('score', 0):.1f})")
        for reason, count in (e.get("not_fitting") or {}).items():
            lines.append(f"    {count} node{'s' if count != 1 else ''}: {reason}")
    if e.get("quota"):
        lines.append(f"  quota: {e['quota']}")
    if e.get("error"):
        lines.append(f"  {e['error']}")
    return "\n".join(lines)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pod", metavar="NAMESPACE/POD", help="the pod to explain")
    parser.add_argument(
        "-o",
        "--output",
        choices=("text", "json"),
        default="text",
        help="text for people (default), or the placer's whole answer as JSON",
    )
    parser.add_argument(
        "--timeout-s",
        type=float,
        default=3.0,
        help="how long to wait for a placer's answer (3); no answer means no placer knows the pod",
    )
    add_settings_arguments(parser, Settings)
    for action in parser._actions:
        if action.dest in NOT_SHOWN:
            action.help = argparse.SUPPRESS


def run(args: argparse.Namespace) -> int:
    try:
        namespace, name = parse_target(args.pod)
        if args.timeout_s <= 0:
            raise ExplainError("--timeout-s must be above 0", EXIT_CONFIG_ERROR)
        settings = load_settings(Settings, env=os.environ, cli=vars(args), config_file=args.config)
        reply = asyncio.run(ask(settings, namespace, name, timeout_s=args.timeout_s))
    except ConfigError as error:
        print(f"tessera explain: configuration error: {error}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    except ExplainError as error:
        print(f"tessera explain: {error}", file=sys.stderr)
        return error.code
    if args.output == "json":
        print(json.dumps(msgspec.to_builtins(reply), indent=2, sort_keys=True))
    else:
        print(render(reply))
    return 0


COMMAND = Command(
    name="explain",
    summary="say where a pod went and why, or why it is Pending (asks the placers)",
    description="Ask the placers about pod NAMESPACE/POD over NATS (tessera.placer.explain): its "
    "claim and assignment record, the last outcome on the replica that decided it, and every "
    "node's verdict for it now (how many fit, the best ones, the counted reasons of the others), "
    "with its tenant's quota. Takes the NATS settings every service takes (--nats-url, "
    "credentials, TLS). Exit codes: 0 explained, 1 no placer knows the pod, 2 usage error, 3 NATS "
    "unreachable or no placer running, 5 NATS refused the credentials.",
    configure=configure,
    run=run,
)
