"""Secured NATS (issue 9, items 8-10): credentials and TLS from settings against real servers
started with authorization, NKeys, an operator/JWT chain and TLS; secrets never leave the process;
a refused login is told apart from an unreachable server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import nkeys
import pytest

from shared import subjects
from shared.config import (
    ConfigError,
    NatsSecurity,
    Settings,
    load_settings,
    nats_security,
    redact_url,
)
from shared.runtime.bus import Bus
from shared.runtime.command import EXIT_CONFIG_ERROR
from shared.runtime.health import Readiness
from shared.runtime.lifecycle import run_service
from shared.runtime.logs import Redactor
from shared.runtime.nats import NatsBus, NatsRefusedError
from tessera.cli import main as tessera_main
from tests.harness import secure
from tests.harness.nats import NatsServer
from tests.shared.echo_service import echo_body

PASSWORD = "pa55-w0rd-never-logged"
TOKEN = "t0ken-never-logged"


@dataclass
class Secured:
    """A server configuration and the settings (env, command line) that log in to it."""

    config: str
    env: dict[str, str]
    cli: dict[str, Any]


def _write(directory: Path, name: str, text: str | bytes) -> str:
    path = directory / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return str(path)


def user_password(directory: Path) -> Secured:
    return Secured(
        config=f'authorization {{ user: svc, password: "{PASSWORD}" }}\n',
        env={"TESSERA_NATS_USER": "svc"},
        cli={"nats_password_file": _write(directory, "password", PASSWORD + "\n")},
    )


def token(directory: Path) -> Secured:
    return Secured(
        config=f'authorization {{ token: "{TOKEN}" }}\n', env={"TESSERA_NATS_TOKEN": TOKEN}, cli={}
    )


def token_file(directory: Path) -> Secured:
    return Secured(
        config=f'authorization {{ token: "{TOKEN}" }}\n',
        env={"TESSERA_NATS_TOKEN_FILE": _write(directory, "token", TOKEN)},
        cli={},
    )


def nkey_seed(directory: Path) -> Secured:
    seed, public = secure.new_nkey(nkeys.PREFIX_BYTE_USER)
    return Secured(
        config=f"authorization {{ users = [ {{ nkey: {public} }} ] }}\n",
        env={"TESSERA_NATS_NKEY_SEED_FILE": _write(directory, "user.nk", seed)},
        cli={},
    )


def creds_file(directory: Path) -> Secured:
    operator = secure.operator_mode()
    return Secured(
        config=operator.server_config,
        env={},
        cli={"nats_creds_file": _write(directory, "user.creds", operator.creds)},
    )


def mutual_tls(directory: Path) -> Secured:
    certs = secure.make_certificates(directory)
    return Secured(
        config=secure.tls_config(certs, verify_clients=True),
        env={
            "TESSERA_NATS_TLS_CA_FILE": str(certs.ca),
            "TESSERA_NATS_TLS_CERT_FILE": str(certs.client_cert),
            "TESSERA_NATS_TLS_KEY_FILE": str(certs.client_key),
        },
        cli={"nats_tls_server_name": secure.SERVER_NAME},
    )


def settings_for(server: NatsServer, secured: Secured) -> Settings:
    return load_settings(Settings, env=secured.env, cli={"nats_url": server.url, **secured.cli})


@pytest.mark.parametrize(
    "make",
    [user_password, token, token_file, nkey_seed, creds_file, mutual_tls],
    ids=["user-password-file", "token-env", "token-file", "nkey-seed", "creds-jwt", "mutual-tls"],
)
async def test_each_way_to_log_in_reaches_a_secured_server(
    tmp_path: Path, make: Callable[[Path], Secured]
) -> None:
    secured = make(tmp_path)
    with NatsServer(secured.config) as server:
        security = nats_security(settings_for(server, secured))
        bus = await NatsBus.connect(server.url, name="secured", security=security)
        try:
            revision = await bus.kv_put(subjects.KV_NODES, "n1", b"facts")
            entry = await bus.kv_get(subjects.KV_NODES, "n1")
            assert entry is not None and (entry.value, entry.revision) == (b"facts", revision)
        finally:
            await bus.drain()
        with pytest.raises(NatsRefusedError):  # and the same server refuses no credentials
            await NatsBus.connect(server.url, name="anonymous", security=NatsSecurity())


@pytest.mark.parametrize(
    ("make", "wrong", "says"),
    [
        pytest.param(
            user_password,
            {"nats_password_file": None, "nats_password": "wrong"},
            "authorization failed",
            id="wrong-password",
        ),
        pytest.param(
            mutual_tls,
            {"nats_tls_server_name": ""},
            "TLS failed: [SSL: CERTIFICATE_VERIFY_FAILED]",
            id="tls-name-mismatch",
        ),
    ],
)
async def test_a_refused_first_connection_is_not_an_unreachable_server(
    tmp_path: Path, make: Callable[[Path], Secured], wrong: dict[str, Any], says: str
) -> None:
    secured = make(tmp_path)
    secured.cli = {k: v for k, v in (secured.cli | wrong).items() if v is not None}
    with NatsServer(secured.config) as server:
        with pytest.raises(NatsRefusedError, match=r"^" + says.replace("[", r"\[")):
            await NatsBus.connect(
                server.url, name="refused", security=nats_security(settings_for(server, secured))
            )


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        pytest.param({"nats_password": "x"}, "--nats-password needs --nats-user", id="no-user"),
        pytest.param(
            {"nats_user": "u"}, "--nats-user needs --nats-password or", id="user-without-secret"
        ),
        pytest.param(
            {"nats_user": "u", "nats_password": "x", "nats_password_file": "/etc/hostname"},
            "set --nats-password or --nats-password-file, not both",
            id="password-twice",
        ),
        pytest.param(
            {"nats_token_file": "/nonexistent/token"},
            "--nats-token-file /nonexistent/token: cannot read it (No such file or directory)",
            id="missing-token-file",
        ),
        pytest.param(
            {"nats_user": "u", "nats_password": "x", "nats_token": "t"},
            "choose one way to log in to NATS, not --nats-user and --nats-token",
            id="two-methods",
        ),
        pytest.param(
            {"nats_tls_cert_file": "/etc/hostname"},
            "--nats-tls-cert-file and --nats-tls-key-file go together",
            id="cert-without-key",
        ),
        pytest.param(
            {"nats_tls_ca_file": "/nonexistent/ca.pem"},
            "--nats-tls-ca-file /nonexistent/ca.pem: cannot read it",
            id="missing-ca",
        ),
        pytest.param(
            {"nats_url": "nats://u:p@h:4222", "nats_token": "t"},
            "credentials are both in --nats-url and in --nats-token",
            id="url-and-token",
        ),
    ],
)
def test_unusable_security_settings_are_configuration_errors(
    fields: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError) as error:
        nats_security(msgspec.convert(fields, Settings))
    assert message in str(error.value)


def test_secrets_are_never_in_the_settings_repr() -> None:
    security = NatsSecurity(user="svc", password=PASSWORD, token=TOKEN)
    assert PASSWORD not in repr(security) and TOKEN not in repr(security)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("nats://svc:s3cret@nats.example:4222", "nats://svc:***@nats.example:4222"),
        ("tls://tok3n@nats.example:4222", "tls://***@nats.example:4222"),
        ("nats://nats.example:4222", "nats://nats.example:4222"),
        (
            "nats://a:one@n1:4222,nats://a:two@n2:4222",
            "nats://a:***@n1:4222,nats://a:***@n2:4222",
        ),
    ],
)
def test_urls_are_redacted(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_the_redactor_scrubs_plain_and_json_escaped_secrets() -> None:
    redact = Redactor(['pa"ss\\word', "tok"])
    assert redact('{"error": "pa\\"ss\\\\word rejected", "t": "tok"}') == (
        '{"error": "*** rejected", "t": "***"}'
    )


@contextlib.asynccontextmanager
async def echo_service(
    settings: Settings, readiness: Readiness, connect: Callable[[str, str], Any] | None = None
) -> AsyncIterator[asyncio.Task[int]]:
    stop = asyncio.Event()
    task = asyncio.create_task(
        run_service(
            name="echo",
            settings=settings,
            body=echo_body,
            stop=stop,
            readiness=readiness,
            connect=connect,
        )
    )
    try:
        yield task
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=15)


async def readyz(readiness: Readiness) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{readiness.http_port}/readyz") as response:
            return response.status, await response.json()


async def wait_for(condition: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def test_a_password_changed_under_a_running_service_shows_in_readyz_and_backs_off(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The server restarts with another password: /readyz says "authorization failed", each
    refused attempt is logged once and waits twice as long as the one before; secrets never show."""
    secured = user_password(tmp_path)
    with NatsServer(secured.config) as server:
        settings = load_settings(
            Settings,
            env=secured.env,
            cli={"nats_url": server.url, "http_host": "127.0.0.1", "http_port": 0} | secured.cli,
        )
        security = nats_security(settings)

        async def connect_quickly(url: str, name: str) -> Bus:
            return await NatsBus.connect(url, name=name, security=security, reconnect_wait=0.05)

        readiness = Readiness()
        async with echo_service(settings, readiness, connect_quickly):
            await wait_for(lambda: readiness.ready, "the service to be ready")
            server.kill()
            server.config = 'authorization { user: svc, password: "rotated-elsewhere" }\n'
            server.start()
            logged: list[str] = []

            def refused_four_times() -> bool:
                logged.append(capsys.readouterr().err)
                return len(refusals("".join(logged))) >= 4

            await wait_for(refused_four_times, "four refused reconnect attempts", timeout=30)
            status, body = await readyz(readiness)
            assert status == 503
            assert body["checks"]["nats"]["reason"] == (
                "authorization failed: nats: 'Authorization Violation'"
            )
            delays = [line["retry_s"] for line in refusals("".join(logged))[:4]]
            assert delays == [0.05, 0.1, 0.2, 0.4], "each step waits twice as long"
            assert PASSWORD not in "".join(logged)


def refusals(stderr: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    return [line for line in lines if line["msg"] == "nats refused the credentials"]


async def test_the_first_connection_refused_ends_the_service_with_exit_code_5(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    secured = user_password(tmp_path)
    with NatsServer(secured.config) as server:
        settings = Settings(
            nats_url=server.url.replace("nats://", f"nats://svc:{PASSWORD}-wrong@"),
            http_host="127.0.0.1",
            http_port=0,
            log_format="text",
        )
        readiness = Readiness()
        code = await asyncio.wait_for(
            run_service(
                name="echo",
                settings=settings,
                body=echo_body,
                readiness=readiness,
                stop=asyncio.Event(),  # this test stops nothing; no signal handler of its own
            ),
            timeout=20,
        )
    assert code == 5
    err = capsys.readouterr().err
    assert "NATS refused this service: authorization failed" in err
    assert "svc:***@127.0.0.1" in err, "the URL is logged, redacted"
    assert PASSWORD not in err
    assert readiness.report()["nats"] == (
        False,
        "authorization failed: nats: 'Authorization Violation'",
    )


def test_a_secret_on_the_command_line_is_warned_about(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("NODE_NAME", "TESSERA_NODE"):
        monkeypatch.delenv(name, raising=False)
    code = tessera_main(["deviceplugin", "--nats-password", "on-argv", "--nats-user", "u"])
    assert code == EXIT_CONFIG_ERROR  # no node: stops before connecting
    err = capsys.readouterr().err
    assert err.startswith(
        "tessera deviceplugin: warning: --nats-password on the command line is visible to every "
        "user of this host; use TESSERA_NATS_PASSWORD or --nats-password-file\n"
    )
    assert "on-argv" not in err


async def test_a_service_whose_login_expires_while_connected_stops_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The user JWT expires: the server closes the client for good (nats-py does not reconnect
    after that). The service exits 1 saying why, so Kubernetes restarts it with the current
    Secret instead of leaving it deaf."""
    operator = secure.operator_mode(user_expires_at=time.time() + 3)
    creds = _write(tmp_path, "user.creds", operator.creds)
    with NatsServer(operator.server_config) as server:
        settings = Settings(
            nats_url=server.url, nats_creds_file=creds, http_host="127.0.0.1", http_port=0
        )
        readiness = Readiness()
        async with echo_service(settings, readiness) as task:
            await wait_for(lambda: readiness.ready, "the service to be ready")
            code = await asyncio.wait_for(asyncio.shield(task), timeout=30)
    assert code == 1
    err = capsys.readouterr().err
    assert (
        "the NATS client closed for good: authorization failed: nats: user authentication expired"
        in err
    ), err
    assert "Traceback" not in err
