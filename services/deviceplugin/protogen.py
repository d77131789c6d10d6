"""Regenerate (or check) the v1beta1 Python stubs in ``_proto/`` from ``_proto/api.proto``.

    python -m services.deviceplugin.protogen           # rewrite the generated modules
    python -m services.deviceplugin.protogen --check   # exit 1 when they differ from a fresh run

The proto is compiled from the repository root so the generated gRPC module imports its messages
package-qualified (``from services.deviceplugin._proto import api_pb2``) instead of a bare
``import api_pb2`` that would need ``_proto/`` on ``sys.path``. Needs the dev extra
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
PROTO_FILE = PROTO_PACKAGE_DIR / "api.proto"
GENERATED = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py")
REPO_ROOT = Path(__file__).resolve().parents[2]


def generate(source_root: Path, out_root: Path) -> list[Path]:
    """Compile ``source_root/PROTO_FILE`` into ``out_root/PROTO_PACKAGE_DIR``; the written paths.

    Raises:
        RuntimeError: protoc reported an error (its message is on stderr).
    """
    # grpcio-tools is a dev-only dependency without type information: imported where needed.
    from grpc_tools import protoc  # type: ignore[import-untyped]

    includes = Path(protoc.__file__).parent / "_proto"
    (out_root / PROTO_PACKAGE_DIR).mkdir(parents=True, exist_ok=True)
    status = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{source_root}",
            f"-I{includes}",
            f"--python_out={out_root}",
            f"--pyi_out={out_root}",
            f"--grpc_python_out={out_root}",
            str(source_root / PROTO_FILE),
        ]
    )
    if status != 0:
        raise RuntimeError(f"protoc failed with status {status} on {PROTO_FILE}")
    return [out_root / PROTO_PACKAGE_DIR / name for name in GENERATED]


def differences(repo_root: Path = REPO_ROOT) -> list[str]:
    """Names of generated files whose committed content differs from a fresh generation."""
    with tempfile.TemporaryDirectory(prefix="protogen-") as scratch:
        scratch_root = Path(scratch)
        (scratch_root / PROTO_PACKAGE_DIR).mkdir(parents=True)
        shutil.copy(repo_root / PROTO_FILE, scratch_root / PROTO_FILE)
        fresh = generate(scratch_root, scratch_root)
        changed = []
        for path in fresh:
            committed = repo_root / PROTO_PACKAGE_DIR / path.name
            if not committed.exists() or committed.read_bytes() != path.read_bytes():
                changed.append(path.name)
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
