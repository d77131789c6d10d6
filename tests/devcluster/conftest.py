"""The API test double, and the real kubernetes-asyncio client configured for it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client, config

from tessera.devcluster.apiserver import ApiServer


@dataclass
class Clients:
    core: Any
    coordination: Any
    events: Any
    api: Any


@pytest.fixture
async def api() -> AsyncIterator[ApiServer]:
    async with ApiServer(bookmark_interval_s=0.1) as server:
        yield server


@pytest.fixture
async def k8s(api: ApiServer, tmp_path: Path) -> AsyncIterator[Clients]:
    configuration = client.Configuration()
    await config.load_kube_config(
        config_file=str(api.write_kubeconfig(tmp_path / "kubeconfig")),
        client_configuration=configuration,
    )
    async with client.ApiClient(configuration) as api_client:
        yield Clients(
            core=client.CoreV1Api(api_client),
            coordination=client.CoordinationV1Api(api_client),
            events=client.EventsV1Api(api_client),
            api=api_client,
        )
