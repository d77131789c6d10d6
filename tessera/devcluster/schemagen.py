"""Regenerate (or check) ``schemas/resource.k8s.io-v1.json``: the strict OpenAPI schemas of the
``resource.k8s.io/v1`` kinds the API test double serves, taken from the Kubernetes 1.37 schemas
``kubernetes-validate`` ships.

    python -m tessera.devcluster.schemagen           # rewrite the extract
    python -m tessera.devcluster.schemagen --check   # exit 1 when it differs from a fresh run

The extract keeps what a strict decoder needs (types, properties, required fields, enums,
formats, references) for the definitions reachable from DeviceClass, ResourceSlice,
ResourceClaim and ResourceClaimTemplate, and drops descriptions, so the double validates without
``kubernetes-validate`` (a dev-only dependency) installed.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any, Final

KUBERNETES_VERSION: Final = "1.37.0"
ROOTS: Final = {
    kind: f"io.k8s.api.resource.v1.{kind}"
    for kind in ("DeviceClass", "ResourceSlice", "ResourceClaim", "ResourceClaimTemplate")
}
EXTRACT: Final = Path(__file__).with_name("schemas") / "resource.k8s.io-v1.json"
_KEPT: Final = frozenset(
    {"type", "properties", "additionalProperties", "items", "required", "$ref", "enum", "format"}
    | {"oneOf"}
)
_REF: Final = re.compile(r'"\$ref": "([^"]+)"')


def _definitions() -> dict[str, Any]:
    # kubernetes-validate is a dev-only dependency without type information: imported here.
    import kubernetes_validate

    folder = (
        Path(kubernetes_validate.__file__).parent
        / "kubernetes-json-schema"
        / f"v{KUBERNETES_VERSION}-local-strict"
    )
    document: dict[str, Any] = json.loads((folder / "_definitions.json").read_text())
    return dict(document["$defs"])


def _clean(schema: Any) -> Any:
    if isinstance(schema, list):
        return [_clean(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    kept: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "properties":
            kept[key] = {name: _clean(sub) for name, sub in value.items()}
        elif key == "$ref":
            kept[key] = value.rsplit("/", 1)[-1]
        elif key in _KEPT:
            kept[key] = _clean(value)
    return kept


def extract(definitions: dict[str, Any]) -> dict[str, Any]:
    """The definitions reachable from :data:`ROOTS`, cleaned, with the roots by kind."""
    chosen: dict[str, Any] = {}
    pending = list(ROOTS.values())
    while pending:
        name = pending.pop()
        if name in chosen:
            continue
        chosen[name] = _clean(definitions[name])
        pending.extend(_REF.findall(json.dumps(chosen[name])))
    return {
        "source": f"kubernetes-validate v{KUBERNETES_VERSION}-local-strict/_definitions.json",
        "roots": ROOTS,
        "definitions": dict(sorted(chosen.items())),
    }


def render(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=1, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="only report whether the extract is stale"
    )
    args = parser.parse_args(argv)
    fresh = render(extract(_definitions()))
    if args.check:
        if not EXTRACT.exists() or EXTRACT.read_text() != fresh:
            print(
                f"stale schema extract: {EXTRACT.name}; run python -m tessera.devcluster.schemagen",
                file=sys.stderr,
            )
            return 1
        print("schema extract is up to date")
        return 0
    EXTRACT.parent.mkdir(exist_ok=True)
    EXTRACT.write_text(fresh)
    print(f"wrote {EXTRACT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
