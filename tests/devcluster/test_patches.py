"""The three patch formats, as plain functions (the HTTP side is in test_apiserver)."""

from __future__ import annotations

from typing import Any

import pytest

from tessera.devcluster.patches import (
    JSON_PATCH,
    MERGE_PATCH,
    STRATEGIC_MERGE_PATCH,
    PatchError,
    apply_patch,
)

POD: dict[str, Any] = {
    "metadata": {"name": "p", "finalizers": ["a"], "labels": {"x": "1"}},
    "spec": {
        "containers": [
            {"name": "main", "image": "one", "env": [{"name": "A", "value": "1"}]},
            {"name": "side", "image": "two"},
        ],
        "tolerations": [{"key": "k"}],
    },
    "status": {"conditions": [{"type": "Ready", "status": "True"}]},
}


@pytest.mark.parametrize(
    ("content_type", "patch", "path", "expected"),
    [
        pytest.param(
            MERGE_PATCH,
            {"metadata": {"labels": {"x": None, "y": "2"}}},
            ("metadata", "labels"),
            {"y": "2"},
            id="merge-null-deletes",
        ),
        pytest.param(
            MERGE_PATCH,
            {"spec": {"tolerations": [{"key": "j"}]}},
            ("spec", "tolerations"),
            [{"key": "j"}],
            id="merge-replaces-lists",
        ),
        pytest.param(
            STRATEGIC_MERGE_PATCH,
            {"status": {"conditions": [{"type": "PodScheduled", "status": "False"}]}},
            ("status", "conditions"),
            [{"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "False"}],
            id="smp-conditions-by-type",
        ),
        pytest.param(
            STRATEGIC_MERGE_PATCH,
            {"spec": {"containers": [{"name": "main", "image": "new"}]}},
            ("spec", "containers", 0, "image"),
            "new",
            id="smp-containers-by-name",
        ),
        pytest.param(
            STRATEGIC_MERGE_PATCH,
            {"spec": {"containers": [{"name": "side", "$patch": "delete"}]}},
            ("spec", "containers", -1, "name"),
            "main",
            id="smp-delete-element",
        ),
        pytest.param(
            STRATEGIC_MERGE_PATCH,
            {"spec": {"containers": [{"name": "main", "env": [{"name": "B", "value": "2"}]}]}},
            ("spec", "containers", 0, "env"),
            [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
            id="smp-nested-merge-key",
        ),
        pytest.param(
            STRATEGIC_MERGE_PATCH,
            {"metadata": {"finalizers": ["b"]}},
            ("metadata", "finalizers"),
            ["a", "b"],
            id="smp-primitive-union",
        ),
        pytest.param(
            STRATEGIC_MERGE_PATCH,
            {"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}},
            ("metadata", "finalizers"),
            [],
            id="smp-delete-from-primitive-list",
        ),
        pytest.param(
            STRATEGIC_MERGE_PATCH,
            {"status": {"conditions": [{"$patch": "replace"}, {"type": "X", "status": "1"}]}},
            ("status", "conditions"),
            [{"type": "X", "status": "1"}],
            id="smp-replace-list",
        ),
        pytest.param(
            STRATEGIC_MERGE_PATCH,
            {"metadata": {"labels": {"$patch": "replace", "z": "3"}}},
            ("metadata", "labels"),
            {"z": "3"},
            id="smp-replace-map",
        ),
        pytest.param(
            STRATEGIC_MERGE_PATCH,
            {"metadata": {"$retainKeys": ["name"], "labels": None}},
            ("metadata",),
            {"name": "p"},
            id="smp-retain-keys",
        ),
        pytest.param(
            JSON_PATCH,
            [
                {"op": "copy", "from": "/metadata/labels", "path": "/metadata/annotations"},
                {"op": "move", "from": "/metadata/labels/x", "path": "/metadata/labels/y"},
            ],
            ("metadata",),
            {"name": "p", "finalizers": ["a"], "labels": {"y": "1"}, "annotations": {"x": "1"}},
            id="json-copy-move",
        ),
        pytest.param(
            JSON_PATCH,
            [{"op": "add", "path": "/metadata/finalizers/-", "value": "z"}],
            ("metadata", "finalizers"),
            ["a", "z"],
            id="json-append",
        ),
    ],
)
def test_patches(content_type: str, patch: Any, path: tuple[Any, ...], expected: Any) -> None:
    result: Any = apply_patch(POD, patch, content_type)
    for step in path:
        result = result[step]
    assert result == expected
    assert POD["metadata"]["labels"] == {"x": "1"}, "the original is untouched"


@pytest.mark.parametrize(
    ("content_type", "patch", "status"),
    [
        pytest.param(MERGE_PATCH, [1], 400, id="merge-not-object"),
        pytest.param(JSON_PATCH, {"op": "add"}, 400, id="json-not-list"),
        pytest.param(JSON_PATCH, [{"op": "remove", "path": "/nope"}], 422, id="json-missing"),
        pytest.param(JSON_PATCH, [{"op": "jump", "path": "/a"}], 400, id="json-unknown-op"),
        pytest.param(
            STRATEGIC_MERGE_PATCH,
            {"spec": {"containers": [{"image": "x"}]}},
            400,
            id="smp-missing-merge-key",
        ),
        pytest.param("application/apply-patch+yaml", {}, 415, id="unsupported"),
    ],
)
def test_bad_patches_are_refused_with_the_api_status(
    content_type: str, patch: Any, status: int
) -> None:
    with pytest.raises(PatchError) as refused:
        apply_patch(POD, patch, content_type)
    assert refused.value.status == status
