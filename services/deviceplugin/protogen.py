"""Regenerate (or check) the kubelet API Python stubs in ``_proto/`` from the ``.proto`` files.

    python -m services.deviceplugin.protogen           # rewrite the generated modules
    python -m services.deviceplugin.protogen --check   # exit 1 when they differ from a fresh run

Three kubelet APIs, each in the directory its upstream path names: the device plugin API
(``_proto/api.proto``, package ``v1beta1``), the DRA plugin API (``_proto/dra/v1/api.proto``,
package ``k8s.io.kubelet.pkg.apis.dra.v1``) and plugin registration
(``_proto/pluginregistration/v1/api.proto``, package ``pluginregistration``). The package lines
are the upstream ones: they are the gRPC method paths a kubelet calls.

The protos are compiled from the repository root so each generated gRPC module imports its
messages package-qualified (``from services.deviceplugin._proto.dra.v1 import api_pb2``) instead
of a bare ``import api_pb2`` that would need the directory on ``sys.path``. Needs the dev extra
(``grpcio-tools``, pinned to the same version as the ``grpcio`` runtime, whose generated code checks
it).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

PROTO_PACKAGE_DIR = Path("services") / "deviceplugin" / "_proto"
PROTO_FILES = (
    PROTO_PACKAGE_DIR / "api.proto",
    PROTO_PACKAGE_DIR / "dra" / "v1" / "api.proto",
    PROTO_PACKAGE_DIR / "pluginregistration" / "v1" / "api.proto",
)
SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")
REPO_ROOT = Path(__file__).resolve().parents[2]


def _outputs(proto: Path) -> list[Path]:
    """The generated modules of ``proto`` (relative to the repository root)."""
    return [proto.with_name(proto.stem + suffix) for suffix in SUFFIXES]


def generate(source_root: Path, out_root: Path) -> list[Path]:
    """Compile every ``source_root/PROTO_FILES`` entry into ``out_root``; the written paths.

    Raises:
        RuntimeError: protoc reported an error (its message is on stderr).
    """
    # grpcio-tools is a dev-only dependency without type information: imported where needed.
    from grpc_tools import protoc  # type: ignore[import-untyped]

    includes = Path(protoc.__file__).parent / "_proto"
    written: list[Path] = []
    for proto in PROTO_FILES:
        (out_root / proto.parent).mkdir(parents=True, exist_ok=True)
        status = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{source_root}",
                f"-I{includes}",
                f"--python_out={out_root}",
                f"--pyi_out={out_root}",
                f"--grpc_python_out={out_root}",
                str(source_root / proto),
            ]
        )
        if status != 0:
            raise RuntimeError(f"protoc failed with status {status} on {proto}")
        written += [out_root / path for path in _outputs(proto)]
    return written


def differences(repo_root: Path = REPO_ROOT) -> list[str]:
    """Generated files (relative paths) whose committed content differs from a fresh generation."""
    with tempfile.TemporaryDirectory(prefix="protogen-") as scratch:
        scratch_root = Path(scratch)
        for proto in PROTO_FILES:
            (scratch_root / proto.parent).mkdir(parents=True, exist_ok=True)
            shutil.copy(repo_root / proto, scratch_root / proto)
        generate(scratch_root, scratch_root)
        changed = []
        for proto in PROTO_FILES:
            for path in _outputs(proto):
                committed, fresh = repo_root / path, scratch_root / path
                if not committed.exists() or committed.read_bytes() != fresh.read_bytes():
                    changed.append(str(path.relative_to(PROTO_PACKAGE_DIR)))
        return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="only report whether the generated files are stale"
    )
    args = parser.parse_args(argv)
    if args.check:
        stale = differences()
        if stale:
            print(
                f"stale generated files: {', '.join(stale)}; run "
                "python -m services.deviceplugin.protogen",
                file=sys.stderr,
            )
            return 1
        print("generated files are up to date")
        return 0
    for path in generate(REPO_ROOT, REPO_ROOT):
        print(f"wrote {path.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
