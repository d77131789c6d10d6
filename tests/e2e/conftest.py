"""One whole system shared by the end-to-end tests of this package (real processes, real NATS).

Every test works in its own namespace and deletes its pods at the end (waiting until their records
are released), so tests stay independent while sharing the cluster's start-up cost.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from tessera.up.spec import plan_nodes
from tessera.up.system import LocalSystem, SystemOptions
from tests.e2e.helpers import started

NODES = (
    "a100-1=4xA100-80GB,"
    "a100-2=4xA100-80GB,"
    "h100-1=4xH100-80GB:isolation=hami-core,"
    "l4-1=2xL4-24GB:isolation=mps,"
    "t4-1=2xT4-16GB:mode=memory-units,"
    "cpu-1=cpu"
)
TENANCY = {
    "groups": [
        {"name": "a100-pool", "tenants": ["grouped"], "nodes": {"names": ["a100-1"]}},
        {"name": "victim-pool", "tenants": ["victim"], "nodes": {"names": ["a100-2"]}},
    ],
    "permissions": [{"tenant": "restricted", "nodes": {"names": ["l4-1"]}}],
    "quotas": [{"tenant": "quota-team", "gpus": 2}, {"tenant": "prio", "gpus": 1}],
}


@pytest_asyncio.fixture(scope="package", loop_scope="package")
async def system(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalSystem]:
    run_dir: Path = tmp_path_factory.mktemp("e2e")
    tenancy = run_dir / "tenancy.json"
    tenancy.write_text(json.dumps(TENANCY))
    async with started(
        SystemOptions(
            nodes=plan_nodes(NODES),
            run_dir=run_dir,
            placers=2,
            binders=1,
            dashboard=True,
            tenancy_file=str(tenancy),
            ready_timeout_s=150.0,
        )
    ) as local:
        yield local
