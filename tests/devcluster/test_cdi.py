"""CDI specs as the runtime resolves them, parsed once per file version: a spec rewritten (the
node plugin writes aside, then renames) is read again, one removed no longer resolves, and a
file that does not parse is skipped with its reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tessera.devcluster import cdi


def write(directory: Path, name: str, env: str) -> None:
    spec = {
        "cdiVersion": "0.6.0",
        "kind": "gpu.tessera.dev/gpu",
        "devices": [{"name": name, "containerEdits": {"env": [env]}}],
    }
    aside = directory / f".{name}.tmp"
    aside.write_text(json.dumps(spec))
    aside.rename(directory / f"gpu.tessera.dev-{name}.json")


def test_a_rewritten_spec_is_read_again_and_a_removed_one_no_longer_resolves(
    tmp_path: Path,
) -> None:
    cache = cdi.SpecCache()
    write(tmp_path, "c1-gpu", "TESSERA_GPU_CORES=25")
    name = "gpu.tessera.dev/gpu=c1-gpu"
    assert cdi.resolve([name], [tmp_path], cache).env == {"TESSERA_GPU_CORES": "25"}
    write(tmp_path, "c1-gpu", "TESSERA_GPU_CORES=50")
    assert cdi.resolve([name], [tmp_path], cache).env == {"TESSERA_GPU_CORES": "50"}
    (tmp_path / "gpu.tessera.dev-c1-gpu.json").unlink()
    with pytest.raises(cdi.UnresolvableDevicesError):
        cdi.resolve([name], [tmp_path], cache)
    (tmp_path / "broken.json").write_text("{")
    devices, skipped = cdi.load([tmp_path], cache)
    assert devices == {} and skipped[0].startswith("broken.json:")
