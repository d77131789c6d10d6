"""The real ``tessera inventory`` process against a secured nats-server (issue 9, items 8-10 and
"also"): credentials from the environment and files, secrets in no log line and no metric, a
refused login ends it at start, a busy port is one line naming ``--http-port``."""

from __future__ import annotations

import asyncio
import re
import signal
import socket
import subprocess
from pathlib import Path

import aiohttp

from shared.config import NatsSecurity
from shared.runtime.command import EXIT_CONFIG_ERROR
from shared.runtime.lifecycle import EXIT_NATS_REFUSED
from shared.runtime.nats import NatsBus
from tests.harness.nats import NatsServer
from tests.inventory.test_cli import ROOT, clean_environment, inventory_command

PASSWORD = "inv-pa55word-secret"
AUTH = f'authorization {{ user: inventory, password: "{PASSWORD}" }}\n'
NODE = "node-9.example"
FAKE = ("--backend", "fake", "--fake-gpus", "1xA100-80GB", "--node", NODE)


async def test_credentials_from_env_and_file_log_in_and_no_secret_leaves_the_process(
    tmp_path: Path,
) -> None:
    password_file = tmp_path / "password"
    password_file.write_text(PASSWORD + "\n")
    with NatsServer(AUTH) as server:
        # The store's epoch, as a placer or the binder gives a new store (the inventory waits
        # for it: it may not write it).
        creator = await NatsBus.connect(
            server.url, name="creator", security=NatsSecurity(user="inventory", password=PASSWORD)
        )
        await creator.drain()
        process = await asyncio.create_subprocess_exec(
            *inventory_command(*FAKE, "--nats-url", server.url),
            env=clean_environment(
                TESSERA_NATS_USER="inventory", TESSERA_NATS_PASSWORD_FILE=str(password_file)
            ),
            cwd=ROOT,
            stderr=subprocess.PIPE,
        )
        assert process.stderr is not None
        seen: list[str] = []
        try:
            port = 0
            while not port:
                line = (await asyncio.wait_for(process.stderr.readline(), timeout=30)).decode()
                assert line, f"the process ended: {''.join(seen)}"
                seen.append(line)
                found = re.search(r"service starting http_port=(\d+)", line)
                port = int(found.group(1)) if found else 0
            async with aiohttp.ClientSession() as http:
                for _ in range(500):
                    async with http.get(f"http://127.0.0.1:{port}/readyz") as response:
                        if response.status == 200:
                            break
                    await asyncio.sleep(0.05)
                assert response.status == 200, await response.text()
                async with http.get(f"http://127.0.0.1:{port}/metrics") as response:
                    metrics = await response.text()
        finally:
            process.send_signal(signal.SIGTERM)
            rest = await asyncio.wait_for(process.stderr.read(), timeout=15)
            code = await asyncio.wait_for(process.wait(), timeout=15)
    log = "".join(seen) + rest.decode()
    assert code == 0, log
    assert "tessera_nats_connected 1.0" in metrics
    assert 'tessera_nats_connection_state{state="connected"} 1.0' in metrics
    assert re.search(r"process_resident_memory_bytes \d", metrics)
    assert PASSWORD not in log and PASSWORD not in metrics


def test_a_refused_password_exits_at_start_with_one_clear_line() -> None:
    with NatsServer(AUTH) as server:
        result = subprocess.run(
            inventory_command(
                *FAKE, "--nats-url", server.url.replace("nats://", "nats://inventory:wrong@")
            ),
            env=clean_environment(),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    assert result.returncode == EXIT_NATS_REFUSED, result.stderr
    refused = [line for line in result.stderr.splitlines() if "NATS refused" in line]
    assert len(refused) == 1, result.stderr
    assert "authorization failed: nats: 'Authorization Violation'" in refused[0]
    assert "inventory:***@127.0.0.1" in result.stderr, "the URL is shown, redacted"
    assert "wrong" not in result.stderr.replace("inventory:***", "")
    assert "Traceback" not in result.stderr


def test_a_port_in_use_is_one_line_naming_the_setting() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        command = inventory_command(*FAKE, "--nats-url", "nats://127.0.0.1:1")
        command[command.index("--http-port") + 1] = str(port)
        result = subprocess.run(
            command,
            env=clean_environment(),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    assert result.returncode == EXIT_CONFIG_ERROR
    assert result.stderr.count("\n") == 1, result.stderr
    assert f"127.0.0.1:{port} (--http-port)" in result.stderr
    assert "Traceback" not in result.stderr
