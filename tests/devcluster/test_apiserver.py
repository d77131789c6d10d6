"""The API test double answers the real kubernetes-asyncio client as a kube-apiserver does."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from tessera.devcluster.apiserver import ApiServer
from tessera.devcluster.resources import EVENT, LEASE, NODE, POD
from tests.binder.builders import container, node, pod
from tests.devcluster.conftest import Clients


def body_of(error: ApiException) -> str:
    """The body of the client's exception (typed as bytes; the client gives the text)."""
    body = error.body
    return body.decode() if isinstance(body, bytes) else str(body)


async def raw(response: Any) -> tuple[int, Any]:
    """Status and JSON body of a ``_preload_content=False`` response."""
    try:
        return response.status, await response.json()
    finally:
        response.release()


async def watch_lines(k8s: Clients, *, timeout_s: int = 1, **params: Any) -> list[dict[str, Any]]:
    response = await k8s.core.list_pod_for_all_namespaces(
        watch=True, timeout_seconds=timeout_s, _preload_content=False, **params
    )
    events = []
    try:
        while line := await response.content.readline():
            events.append(json.loads(line))
    finally:
        response.release()
    return events


def names_of(items: list[Any]) -> list[str]:
    return sorted(i.metadata.name for i in items)


async def test_create_fills_metadata_defaults_and_requests_from_limits(k8s: Clients) -> None:
    created = await k8s.core.create_namespaced_pod(
        "team-a", pod("p", container(gpu=1, memory=2048, cpu="1", ram="2Gi"), namespace="team-a")
    )
    assert created.metadata.uid and created.metadata.creation_timestamp
    assert int(created.metadata.resource_version) > 0
    assert created.status.phase == "Pending"
    assert created.spec.containers[0].resources.requests == {
        "tessera.dev/gpu": "1",
        "tessera.dev/gpu-memory": "2048",
        "cpu": "1",
        "memory": "2Gi",
    }
    namespaces = await k8s.core.list_namespace()
    assert "team-a" in names_of(namespaces.items), "namespaces come into being implicitly"
    with pytest.raises(ApiException) as exists:
        await k8s.core.create_namespaced_pod("team-a", pod("p", namespace="team-a"))
    assert exists.value.status == 409 and "already exists" in body_of(exists.value)


@pytest.mark.parametrize(
    ("limits", "problem"),
    [
        pytest.param({"tessera.dev/gpu": "1.5"}, "must be an integer", id="fractional-extended"),
        pytest.param({"cpu": "lots"}, "must be a quantity", id="bad-quantity"),
    ],
)
async def test_create_validates_like_the_api_server(
    k8s: Clients, limits: dict[str, str], problem: str
) -> None:
    body = pod("bad", container(cpu=None, ram=None, extra=limits))
    with pytest.raises(ApiException) as refused:
        await k8s.core.create_namespaced_pod("default", body)
    assert refused.value.status == 422
    assert problem in json.loads(body_of(refused.value))["message"]


async def test_field_and_label_selectors(k8s: Clients, api: ApiServer) -> None:
    api.create(POD, pod("pending", labels={"team": "a"}))
    api.create(POD, pod("bound", node="gpu-1", labels={"team": "b"}))
    api.create(POD, pod("other", scheduler="default-scheduler"))
    done = api.create(POD, pod("done", labels={"team": "a"}))
    api.patch(
        POD,
        "default",
        "done",
        {"status": {"phase": "Succeeded"}},
        "application/merge-patch+json",
        "status",
    )
    assert done

    async def listed(**selectors: str) -> list[str]:
        return names_of((await k8s.core.list_pod_for_all_namespaces(**selectors)).items)

    assert await listed(field_selector="spec.schedulerName=tessera,spec.nodeName=") == [
        "done",
        "pending",
    ]
    assert await listed(field_selector="status.phase!=Succeeded,status.phase!=Failed") == [
        "bound",
        "other",
        "pending",
    ]
    assert await listed(field_selector="spec.nodeName==gpu-1") == ["bound"]
    assert await listed(label_selector="team in (a,b),team!=b") == ["done", "pending"]
    assert await listed(label_selector="!team") == ["other"]
    assert await listed(label_selector="team notin (a)") == ["bound", "other"]
    with pytest.raises(ApiException) as refused:
        await k8s.core.list_pod_for_all_namespaces(field_selector="spec.color=blue")
    assert refused.value.status == 400
    assert "field label not supported: spec.color" in body_of(refused.value)


async def test_list_pages_come_from_one_snapshot(k8s: Clients, api: ApiServer) -> None:
    for i in range(5):
        api.create(POD, pod(f"p{i}"))
    first = await k8s.core.list_pod_for_all_namespaces(limit=2)
    api.create(POD, pod("late"))
    names = names_of(first.items)
    token = first.metadata._continue
    while token:
        page = await k8s.core.list_pod_for_all_namespaces(limit=2, _continue=token)
        assert page.metadata.resource_version == first.metadata.resource_version
        names += names_of(page.items)
        token = page.metadata._continue
    assert sorted(names) == [f"p{i}" for i in range(5)]
    again = await k8s.core.list_pod_for_all_namespaces(limit=2)
    api.compact()
    with pytest.raises(ApiException) as expired:
        await k8s.core.list_pod_for_all_namespaces(limit=2, _continue=again.metadata._continue)
    assert expired.value.status == 410


async def test_watch_resumes_after_a_resource_version_and_sends_bookmarks(
    k8s: Clients, api: ApiServer
) -> None:
    api.create(POD, pod("before"))
    listed = await k8s.core.list_pod_for_all_namespaces()
    api.create(POD, pod("after"))
    api.delete(POD, "default", "before")
    events = await watch_lines(
        k8s, resource_version=listed.metadata.resource_version, allow_watch_bookmarks=True
    )
    changes = [(e["type"], e["object"]["metadata"].get("name")) for e in events]
    assert changes[:2] == [("ADDED", "after"), ("DELETED", "before")]
    bookmarks = [e for e in events if e["type"] == "BOOKMARK"]
    assert bookmarks, "bookmarks arrive while nothing changes"
    assert int(bookmarks[-1]["object"]["metadata"]["resourceVersion"]) == api.store.revision
    without = await watch_lines(k8s, resource_version=listed.metadata.resource_version)
    assert all(e["type"] != "BOOKMARK" for e in without)


async def test_watch_from_the_start_lists_current_objects_first(
    k8s: Clients, api: ApiServer
) -> None:
    api.create(POD, pod("a"))
    events = await watch_lines(k8s)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "a")]


async def test_watch_translates_selector_transitions(k8s: Clients, api: ApiServer) -> None:
    api.create(POD, pod("p"))
    start = str(api.store.revision)
    api.bind("default", "p", {"metadata": {"name": "p"}, "target": {"name": "gpu-1"}})
    events = await watch_lines(k8s, resource_version=start, field_selector="spec.nodeName=")
    assert [e["type"] for e in events] == ["DELETED"]
    deleted = events[0]["object"]
    assert "nodeName" not in deleted["spec"], "the previous content"
    assert deleted["metadata"]["resourceVersion"] == str(api.store.revision), "the new revision"


async def test_watch_from_a_compacted_revision_is_410(k8s: Clients, api: ApiServer) -> None:
    api.create(POD, pod("p"))
    start = str(api.store.revision)
    api.create(POD, pod("q"))
    api.compact()
    events = await watch_lines(k8s, resource_version=start)
    assert len(events) == 1 and events[0]["type"] == "ERROR"
    assert events[0]["object"]["code"] == 410 and events[0]["object"]["reason"] == "Expired"
    fresh = await watch_lines(k8s, resource_version=str(api.store.revision))
    assert fresh == [], "a watch from the compacted revision itself is fine"


async def test_binding_answers_201_status_merges_annotations_and_refuses_rebinding(
    k8s: Clients, api: ApiServer
) -> None:
    uid = api.create(POD, pod("p"))["metadata"]["uid"]

    def binding(node: str, name: str = "p", **meta: Any) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, **meta},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }

    async def bind(body: dict[str, Any], name: str = "p") -> tuple[int, Any]:
        return await raw(
            await k8s.core.create_namespaced_pod_binding(
                name, "default", body, _preload_content=False
            )
        )

    code, body = await bind(binding("gpu-1", uid=uid, annotations={"tessera.dev/x": "1"}))
    assert (code, body["kind"], body["status"]) == (201, "Status", "Success")
    stored = api.get(POD, "default", "p")
    assert stored["spec"]["nodeName"] == "gpu-1"
    assert stored["metadata"]["annotations"] == {"tessera.dev/x": "1"}
    scheduled = [c for c in stored["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert scheduled[0]["status"] == "True" and scheduled[0]["lastTransitionTime"]
    code, body = await bind(binding("gpu-2"))
    assert code == 409 and 'already assigned to node "gpu-1"' in body["message"]
    assert (await bind(binding("gpu-1", name="missing"), name="missing"))[0] == 404
    assert (await bind(binding("gpu-1", name="q")))[0] == 400, "names must agree"


async def test_binding_a_pod_of_another_uid_is_a_conflict(k8s: Clients, api: ApiServer) -> None:
    api.create(POD, pod("p"))
    response = await k8s.core.create_namespaced_pod_binding(
        "p",
        "default",
        {"metadata": {"name": "p", "uid": "not-this-one"}, "target": {"name": "gpu-1"}},
        _preload_content=False,
    )
    code, body = await raw(response)
    assert code == 409 and "Precondition failed: UID in precondition" in body["message"]


async def test_patch_formats(k8s: Clients, api: ApiServer) -> None:
    api.create(POD, pod("p", annotations={"keep": "1", "drop": "2"}))
    merged = await k8s.core.patch_namespaced_pod(
        "p",
        "default",
        {"metadata": {"annotations": {"drop": None, "new": "3"}}},
        _content_type="application/merge-patch+json",
    )
    assert merged.metadata.annotations == {"keep": "1", "new": "3"}
    patched = await k8s.core.patch_namespaced_pod(
        "p",
        "default",
        [
            {"op": "add", "path": "/metadata/labels", "value": {"a": "b"}},
            {"op": "replace", "path": "/metadata/annotations/keep", "value": "9"},
            {"op": "remove", "path": "/metadata/annotations/new"},
        ],
    )
    assert patched.metadata.labels == {"a": "b"} and patched.metadata.annotations == {"keep": "9"}
    with pytest.raises(ApiException) as failed:
        await k8s.core.patch_namespaced_pod(
            "p", "default", [{"op": "test", "path": "/metadata/name", "value": "q"}]
        )
    assert failed.value.status == 422
    with pytest.raises(ApiException) as immutable:
        await k8s.core.patch_namespaced_pod("p", "default", {"spec": {"schedulerName": "other"}})
    assert immutable.value.status == 422 and "pod updates may not change fields" in (
        body_of(immutable.value)
    )
    with pytest.raises(ApiException) as stale:
        await k8s.core.patch_namespaced_pod(
            "p", "default", {"metadata": {"resourceVersion": "1", "labels": {"c": "d"}}}
        )
    assert stale.value.status == 409
    with pytest.raises(ApiException) as replaced:
        await k8s.core.patch_namespaced_pod(
            "p",
            "default",
            {"metadata": {"uid": "another", "labels": {"c": "d"}}},
            _content_type="application/merge-patch+json",
        )
    assert replaced.value.status == 422 and "field is immutable" in body_of(replaced.value)


async def test_quantities_are_stored_canonical_and_an_equal_rewrite_changes_nothing(
    k8s: Clients, api: ApiServer
) -> None:
    """What a second, unchanged ``kubectl apply`` sends: the pod's quantities in the form the
    manifest has them (``1``, ``1024Mi``) where the pod holds the stored form (``"1"``, ``"1Gi"``).
    """
    body = pod("p", container(cpu=None, ram=None, extra={"tessera.dev/gpu": 1, "memory": "1024Mi"}))
    created = api.create(POD, body)
    limits = created["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"tessera.dev/gpu": "1", "memory": "1Gi"}
    version = created["metadata"]["resourceVersion"]
    same = await k8s.core.patch_namespaced_pod(
        "p",
        "default",
        {
            "spec": {
                "containers": [
                    {
                        "name": "main",
                        "resources": {"limits": {"tessera.dev/gpu": 1, "memory": "1024Mi"}},
                    }
                ]
            }
        },
    )
    assert same.metadata.resource_version == version, "an equal value is no change"
    with pytest.raises(ApiException) as changed:
        await k8s.core.patch_namespaced_pod(
            "p",
            "default",
            {
                "spec": {
                    "containers": [
                        {"name": "main", "resources": {"limits": {"tessera.dev/gpu": 2}}}
                    ]
                }
            },
        )
    assert changed.value.status == 422 and "pod updates may not change fields" in (
        body_of(changed.value)
    )


async def test_status_patch_merges_conditions_by_type_and_keeps_the_spec(
    k8s: Clients, api: ApiServer
) -> None:
    api.create(POD, pod("p"))
    api.patch(
        POD,
        "default",
        "p",
        {"status": {"conditions": [{"type": "Ready", "status": "False"}]}},
        "application/merge-patch+json",
        "status",
    )
    before = api.get(POD, "default", "p")["metadata"]["resourceVersion"]
    result = await k8s.core.patch_namespaced_pod_status(
        "p",
        "default",
        {
            "spec": {"nodeName": "sneaky"},
            "status": {
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": "why",
                    }
                ]
            },
        },
    )
    assert {c.type: c.status for c in result.status.conditions} == {
        "Ready": "False",
        "PodScheduled": "False",
    }
    assert result.spec.node_name is None, "status writes keep the spec"
    same = await k8s.core.patch_namespaced_pod_status(
        "p", "default", {"status": {"conditions": [{"type": "Ready", "status": "False"}]}}
    )
    assert same.metadata.resource_version != before
    again = await k8s.core.patch_namespaced_pod_status(
        "p", "default", {"status": {"conditions": [{"type": "Ready", "status": "False"}]}}
    )
    assert again.metadata.resource_version == same.metadata.resource_version, (
        "a write that changes nothing keeps the resourceVersion"
    )
    main = await k8s.core.patch_namespaced_pod(
        "p",
        "default",
        {"status": {"phase": "Running"}},
        _content_type="application/merge-patch+json",
    )
    assert main.status.phase == "Pending", "main-resource writes keep the status"


async def test_leases_conflict_on_a_stale_resource_version(k8s: Clients) -> None:
    body = {
        "metadata": {"name": "lock"},
        "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15},
    }
    created = await k8s.coordination.create_namespaced_lease("default", body)
    with pytest.raises(ApiException) as exists:
        await k8s.coordination.create_namespaced_lease("default", body)
    assert exists.value.status == 409
    renewed = {
        "metadata": {"name": "lock", "resourceVersion": created.metadata.resource_version},
        "spec": {"holderIdentity": "b", "leaseDurationSeconds": 15},
    }
    updated = await k8s.coordination.replace_namespaced_lease("lock", "default", renewed)
    assert updated.metadata.resource_version != created.metadata.resource_version
    with pytest.raises(ApiException) as stale:
        await k8s.coordination.replace_namespaced_lease("lock", "default", renewed)
    assert stale.value.status == 409 and "the object has been modified" in body_of(stale.value)


async def test_events_are_validated_and_shown_in_both_apis(k8s: Clients, api: ApiServer) -> None:
    event = {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": "p.1", "namespace": "default"},
        "eventTime": "2024-01-01T00:00:00.000000Z",
        "reportingController": "tessera.dev/binder",
        "reportingInstance": "binder-0",
        "action": "Scheduling",
        "reason": "FailedScheduling",
        "regarding": {"kind": "Pod", "namespace": "default", "name": "p", "uid": "u"},
        "note": "0/1 nodes are available: 1 insufficient GPU memory.",
        "type": "Warning",
    }
    await k8s.events.create_namespaced_event("default", event)
    with pytest.raises(ApiException) as invalid:
        await k8s.events.create_namespaced_event(
            "default", {**event, "metadata": {"name": "p.2"}, "reportingController": ""}
        )
    assert invalid.value.status == 422 and "reportingController: Required" in body_of(invalid.value)
    with pytest.raises(ApiException) as short_series:
        await k8s.events.patch_namespaced_event(
            "p.1",
            "default",
            {"series": {"count": 1, "lastObservedTime": event["eventTime"]}},
            _content_type="application/merge-patch+json",
        )
    assert short_series.value.status == 422
    core = await k8s.core.list_namespaced_event(
        "default", field_selector="involvedObject.name=p,reason=FailedScheduling"
    )
    assert [(e.involved_object.name, e.message, e.type) for e in core.items] == [
        ("p", event["note"], "Warning")
    ]
    assert api.objects(EVENT)[0]["note"] == event["note"]


@pytest.mark.parametrize(
    ("fault", "expect"),
    [
        pytest.param({"status": 503}, 503, id="status"),
        pytest.param({"status": 0, "delay_s": 0.3}, 200, id="delay"),
    ],
)
async def test_faults_apply_to_matching_requests(
    k8s: Clients, api: ApiServer, fault: dict[str, Any], expect: int
) -> None:
    api.create(NODE, node("n1"))
    armed = api.faults.add(verb="get", resource="nodes", times=1, **fault)
    loop = asyncio.get_running_loop()
    started = loop.time()
    code, _ = await raw(await k8s.core.read_node("n1", _preload_content=False))
    assert code == expect and armed.hits == 1
    if fault.get("delay_s"):
        assert loop.time() - started >= fault["delay_s"]
    assert (await raw(await k8s.core.read_node("n1", _preload_content=False)))[0] == 200


async def test_a_reset_fault_cuts_the_connection(k8s: Clients, api: ApiServer) -> None:
    api.create(NODE, node("n1"))
    # aiohttp retries an idempotent request once on a dropped keep-alive connection.
    reset = api.faults.add(verb="list", resource="nodes", reset=True, times=None)
    with pytest.raises(aiohttp.ClientError):
        await k8s.core.list_node()
    assert reset.hits >= 1
    api.faults.clear()
    assert names_of((await k8s.core.list_node()).items) == ["n1"]


async def test_dropped_watches_end_cleanly_or_abruptly(k8s: Clients, api: ApiServer) -> None:
    for abrupt in (False, True):
        response = await k8s.core.list_pod_for_all_namespaces(
            watch=True, resource_version=str(api.store.revision), _preload_content=False
        )
        assert api.drop_watches(POD, abrupt=abrupt) == 1
        try:
            if abrupt:
                with pytest.raises(Exception):  # noqa: PT011, B017 - a broken payload
                    await response.content.read()
            else:
                assert await response.content.read() == b""
        finally:
            response.release()


async def test_requests_need_the_token(api: ApiServer) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{api.url}/api/v1/pods") as response:
            assert response.status == 401
        async with session.get(
            f"{api.url}/api/v1/pods", headers={"Authorization": f"Bearer {api.token}"}
        ) as response:
            assert response.status == 200


async def test_lease_and_node_objects_round_trip(k8s: Clients, api: ApiServer) -> None:
    api.create(NODE, node("n1", labels={"gpu": "a100"}))
    nodes = await k8s.core.list_node(label_selector="gpu=a100")
    assert names_of(nodes.items) == ["n1"]
    assert nodes.items[0].status.allocatable["tessera.dev/gpu"] == "8"
    api.create(LEASE, {"metadata": {"name": "l", "namespace": "kube-system"}, "spec": {}})
    assert (await k8s.coordination.read_namespaced_lease("l", "kube-system")).metadata.name == "l"
