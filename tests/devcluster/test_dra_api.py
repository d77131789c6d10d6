"""The API test double serves ``resource.k8s.io/v1`` as a 1.37 kube-apiserver does: discovery,
create/list/watch with field selectors, the strict schema's decoding, and the registry rules the
schema cannot say, each refused with the real API server's status code and a message that names
the field (``pkg/apis/resource/validation``, ``pkg/registry/resource``)."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from kubernetes_asyncio import client, config

from tessera.devcluster import schemagen
from tessera.devcluster.apiserver import ApiServer
from tessera.devcluster.dra import FINALIZER
from tessera.devcluster.resources import RESOURCE_CLAIM, RESOURCE_SLICE
from tests.devcluster import dra_builders as b

pytestmark = pytest.mark.asyncio(loop_scope="module")

Obj = dict[str, Any]


class Http:
    """A plain HTTP client of the double: status and JSON body of every call."""

    def __init__(self, api: ApiServer, session: aiohttp.ClientSession) -> None:
        self.api = api
        self.session = session

    async def call(
        self, method: str, path: str, body: Any = None, content_type: str = "", **params: str
    ) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {self.api.token}"}
        data = None
        if body is not None:
            data = json.dumps(body)
            headers["Content-Type"] = content_type or "application/json"
        async with self.session.request(
            method, self.api.url + path, data=data, headers=headers, params=params
        ) as response:
            text = await response.text()
            return response.status, (json.loads(text) if text.startswith("{") else text)

    async def create(self, path: str, body: Obj, **params: str) -> tuple[int, Any]:
        return await self.call("POST", path, body, **params)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def http() -> AsyncIterator[Http]:
    async with ApiServer() as api, aiohttp.ClientSession() as session:
        yield Http(api, session)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def resource_api(http: Http, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Any]:
    """The real kubernetes-asyncio client's ``ResourceV1Api`` for the double."""
    configuration = client.Configuration()
    kubeconfig = http.api.write_kubeconfig(tmp_path_factory.mktemp("kube") / "kubeconfig")
    await config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    async with client.ApiClient(configuration) as api_client:
        yield client.ResourceV1Api(api_client)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


CLAIMS = f"{b.API}/namespaces/default/resourceclaims"


async def test_discovery_lists_the_group_and_its_kinds(http: Http) -> None:
    status, groups = await http.call("GET", "/apis")
    assert status == 200
    (group,) = [g for g in groups["groups"] if g["name"] == "resource.k8s.io"]
    assert group["preferredVersion"]["groupVersion"] == "resource.k8s.io/v1"
    status, listing = await http.call("GET", b.API)
    scoped = {r["name"]: r["namespaced"] for r in listing["resources"]}
    assert scoped == {
        "deviceclasses": False,
        "resourceslices": False,
        "resourceclaims": True,
        "resourceclaims/status": True,
        "resourceclaimtemplates": True,
    }


async def test_the_schema_extract_is_what_kubernetes_validate_ships() -> None:
    assert schemagen.main(["--check"]) == 0


async def test_the_real_client_creates_and_lists_slices_by_node_and_driver(
    http: Http, resource_api: Any
) -> None:
    node = unique("node")
    for name, on, driver in (
        (f"{node}-a", node, b.DRIVER),
        (f"{node}-b", node, "net.test.tessera.dev"),
        (f"{node}-c", unique("other"), b.DRIVER),
    ):
        await resource_api.create_resource_slice(b.resource_slice(name, on, driver=driver))
    mine = await resource_api.list_resource_slice(field_selector=f"spec.nodeName={node}")
    assert sorted(s.metadata.name for s in mine.items) == [f"{node}-a", f"{node}-b"]
    both = await resource_api.list_resource_slice(
        field_selector=f"spec.nodeName={node},spec.driver={b.DRIVER}"
    )
    assert [s.metadata.name for s in both.items] == [f"{node}-a"]
    assert both.items[0].metadata.generation == 1
    assert both.items[0].spec.devices[0].capacity["memory"].value == "80Gi"
    status, refused = await http.call(
        "GET", f"{b.API}/resourceslices", fieldSelector="spec.pool.name=x"
    )
    assert status == 400 and "field label not supported: spec.pool.name" in refused["message"]


async def test_the_real_client_allocates_and_reserves_a_claim_through_status(
    resource_api: Any,
) -> None:
    """What an allocator writes with kubernetes-asyncio: strategic merge patches of the status
    (``reservedFor`` merged by uid) and a replace of the status with the typed object it read
    (whose times the client writes in its own RFC 3339 form)."""
    name = unique("c")
    created = await resource_api.create_namespaced_resource_claim("default", b.claim(name))
    assert created.spec.devices.requests[0].exactly.count == 1
    first, second = b.consumer("p1"), b.consumer("p2")
    await resource_api.patch_namespaced_resource_claim_status(
        name, "default", {"status": {"allocation": b.allocation(), "reservedFor": [first]}}
    )
    both = await resource_api.patch_namespaced_resource_claim_status(
        name, "default", {"status": {"reservedFor": [second]}}
    )
    assert [r.name for r in both.status.reserved_for] == ["p1", "p2"]
    both.status.reserved_for = both.status.reserved_for[1:]
    one = await resource_api.replace_namespaced_resource_claim_status(name, "default", both)
    assert [r.uid for r in one.status.reserved_for] == [second["uid"]]
    assert one.status.allocation.devices.results[0].device == "gpu-0"


async def test_a_watch_follows_one_node_s_slices(http: Http) -> None:
    node = unique("node")
    await http.create(f"{b.API}/resourceslices", b.resource_slice(f"{node}-s", node))
    async with http.session.get(
        http.api.url + f"{b.API}/resourceslices",
        params={"watch": "true", "fieldSelector": f"spec.nodeName={node}"},
        headers={"Authorization": f"Bearer {http.api.token}"},
    ) as response:
        first = json.loads(await response.content.readline())
        await http.create(f"{b.API}/resourceslices", b.resource_slice(f"{node}-x", unique("other")))
        await http.call(
            "PATCH",
            f"{b.API}/resourceslices/{node}-s",
            {"metadata": {"labels": {"seen": "yes"}}},
            "application/merge-patch+json",
        )
        second = json.loads(await response.content.readline())
    assert (first["type"], first["object"]["metadata"]["name"]) == ("ADDED", f"{node}-s")
    assert (second["type"], second["object"]["metadata"]["labels"]) == (
        "MODIFIED",
        {"seen": "yes"},
    ), "another node's slice is not seen"


async def test_a_claim_is_defaulted_and_its_status_dropped_on_create(http: Http) -> None:
    body = b.claim(unique("c"))
    body["status"] = {"allocation": b.allocation()}
    status, created = await http.create(CLAIMS, body)
    assert status == 201
    assert created["status"] == {}
    assert created["spec"]["devices"]["requests"][0]["exactly"] == {
        "deviceClassName": b.CLASS,
        "allocationMode": "ExactCount",
        "count": 1,
    }


def _too_many_devices(count: int, **extra: Any) -> Obj:
    return b.resource_slice(devices=[b.device(f"gpu-{i}", **extra) for i in range(count)])


_TAINT = {"taints": [{"key": "example.com/broken", "effect": "NoSchedule"}]}
_POLICY = {"default": "8Gi", "validRange": {"min": "8Gi", "step": "8Gi"}}
CREATE_REFUSALS = [
    pytest.param(
        "resourceslices",
        b.resource_slice(sharedCounters=[{"name": "gpu", "counters": {"memory": {"value": "1"}}}]),
        'spec: Invalid value: "": only one of `sharedCounters` or `devices` is allowed',
        id="slice-devices-xor-shared-counters",
    ),
    pytest.param(
        "resourceslices",
        _too_many_devices(129),
        "spec.devices: Too many: 129: must have at most 128 items",
        id="slice-128-devices",
    ),
    pytest.param(
        "resourceslices",
        _too_many_devices(65, **_TAINT),
        "spec.devices: Too many: 65: must have at most 64 items",
        id="slice-64-devices-with-taints",
    ),
    pytest.param(
        "resourceslices",
        b.resource_slice(
            devices=[
                b.device("gpu-0", attributes={f"a{i}": {"int": i} for i in range(32)}),
            ]
        ),
        "spec.devices[0]: Invalid value: 33: the total number of attributes and capacities "
        "must not exceed 32",
        id="slice-attributes-and-capacities",
    ),
    pytest.param(
        "resourceslices",
        b.resource_slice(devices=[b.device("gpu-0"), b.device("gpu-0")]),
        'spec.devices[1]: Duplicate value: "gpu-0"',
        id="slice-duplicate-device",
    ),
    pytest.param(
        "resourceslices",
        b.resource_slice(allNodes=True),
        'spec: Invalid value: "{`nodeName`, `allNodes`}": exactly one of `nodeName`, '
        "`nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required, but multiple fields "
        "are set",
        id="slice-one-node-choice",
    ),
    pytest.param(
        "resourceslices",
        b.resource_slice(
            devices=[
                b.device("gpu-0", capacity={"memory": {"value": "80Gi", "requestPolicy": _POLICY}})
            ]
        ),
        "spec.devices[0].capacity[memory].requestPolicy: Forbidden: allowMultipleAllocations "
        "must be true",
        id="slice-request-policy-needs-multiple-allocations",
    ),
    pytest.param(
        "resourceslices",
        b.resource_slice(
            devices=[
                b.device(
                    "gpu-0",
                    allowMultipleAllocations=True,
                    capacity={
                        "memory": {
                            "value": "80Gi",
                            "requestPolicy": {
                                "default": "12Gi",
                                "validRange": {"min": "8Gi", "step": "8Gi"},
                            },
                        }
                    },
                )
            ]
        ),
        'spec.devices[0].capacity[memory].requestPolicy.validRange.step: Invalid value: "12Gi": '
        "value is not a multiple of a given step (8Gi) from (8Gi)",
        id="slice-request-policy-step",
    ),
    pytest.param(
        "resourceslices",
        b.resource_slice(pool={"name": "node-a", "generation": 0, "resourceSliceCount": 0}),
        "spec.pool.resourceSliceCount: Invalid value: 0: must be greater than zero",
        id="slice-count",
    ),
    pytest.param(
        "resourceslices",
        b.resource_slice(driver=""),
        "spec.driver: Required value",
        id="slice-driver-required",
    ),
    pytest.param(
        "resourceclaims",
        b.claim("c", {"name": "gpu"}),
        "spec.devices.requests[0]: Required value: exactly one of `exactly` or `firstAvailable` "
        "is required",
        id="claim-exactly-or-first-available",
    ),
    pytest.param(
        "resourceclaims",
        b.claim("c", b.request("gpu"), b.request("gpu")),
        'spec.devices.requests[1]: Duplicate value: "gpu"',
        id="claim-duplicate-request",
    ),
    pytest.param(
        "resourceclaims",
        b.claim("c", b.request(allocationMode="All", count=2)),
        "spec.devices.requests[0].exactly.count: Invalid value: 2: must not be specified when "
        "allocationMode is 'All'",
        id="claim-count-with-all",
    ),
    pytest.param(
        "resourceclaims",
        b.claim("c", b.request(allocationMode="Some")),
        'spec.devices.requests[0].exactly.allocationMode: Unsupported value: "Some": supported '
        'values: "All", "ExactCount"',
        id="claim-allocation-mode",
    ),
    pytest.param(
        "resourceclaims",
        b.claim("c", {"name": "gpu", "exactly": {"allocationMode": "ExactCount"}}),
        "spec.devices.requests[0].exactly.deviceClassName: Required value",
        id="claim-device-class-required",
    ),
    pytest.param(
        "resourceclaimtemplates",
        b.template("t", b.request(selectors=[{}])),
        "spec.spec.devices.requests[0].exactly.selectors[0].cel: Required value",
        id="template-selector-cel",
    ),
    pytest.param(
        "resourceclaimtemplates",
        {
            **b.template("t"),
            "spec": {**b.template("t")["spec"], "metadata": {"labels": {"a": "-x"}}},
        },
        'spec.metadata.labels[a]: Invalid value: "-x": a valid label must be',
        id="template-label",
    ),
    pytest.param(
        "deviceclasses",
        {**b.device_class(), "spec": {"config": [{"opaque": {"driver": b.DRIVER}}]}},
        "spec.config[0].opaque.parameters: Required value",
        id="class-opaque-parameters",
    ),
]


def _collection(plural: str) -> str:
    namespaced = plural in ("resourceclaims", "resourceclaimtemplates")
    return f"{b.API}/namespaces/default/{plural}" if namespaced else f"{b.API}/{plural}"


@pytest.mark.parametrize(("plural", "body", "message"), CREATE_REFUSALS)
async def test_a_bad_object_is_refused_with_422_naming_the_field(
    http: Http, plural: str, body: Obj, message: str
) -> None:
    body["metadata"]["name"] = unique("bad")
    status, answer = await http.create(_collection(plural), body)
    assert (status, answer["reason"]) == (422, "Invalid"), answer
    assert message in answer["message"], answer["message"]


async def test_a_value_of_the_wrong_type_is_a_400_from_the_decoder(http: Http) -> None:
    status, answer = await http.create(CLAIMS, b.claim(unique("c"), b.request(count="two")))
    assert (status, answer["reason"]) == (400, "BadRequest")
    assert answer["message"] == (
        'ResourceClaim in version "v1" cannot be handled as a ResourceClaim: json: cannot '
        "unmarshal string into Go struct field ExactDeviceRequest.spec.devices.requests.exactly."
        "count of type int64"
    )
    status, answer = await http.create(
        f"{b.API}/resourceslices",
        b.resource_slice(unique("s"), devices=[b.device("gpu-0", capacity={"m": {"value": "x"}})]),
    )
    assert status == 400 and "quantities must match the regular expression" in answer["message"]


async def test_unknown_fields_are_refused_under_strict_and_dropped_otherwise(http: Http) -> None:
    body = b.claim(unique("c"), b.request(colour="green"))
    status, answer = await http.create(CLAIMS, body, fieldValidation="Strict")
    assert status == 400
    assert answer["message"].endswith(
        'strict decoding error: unknown field "spec.devices.requests[0].exactly.colour"'
    )
    status, created = await http.create(CLAIMS, body)
    assert status == 201 and "colour" not in created["spec"]["devices"]["requests"][0]["exactly"]


async def _allocated_claim(http: Http, *, finalizer: bool = False) -> tuple[str, Obj]:
    name = unique("c")
    body = b.claim(name)
    if finalizer:
        body["metadata"]["finalizers"] = [FINALIZER]
    status, created = await http.create(CLAIMS, body)
    assert status == 201, created
    created["status"] = {"allocation": b.allocation(), "reservedFor": [b.consumer("p")]}
    status, allocated = await http.call("PUT", f"{CLAIMS}/{name}/status", created)
    assert status == 200, allocated
    return name, allocated


async def test_status_changes_only_through_the_status_subresource(http: Http) -> None:
    name = unique("c")
    _, created = await http.create(CLAIMS, b.claim(name))
    created["status"] = {"allocation": b.allocation()}
    created["metadata"]["labels"] = {"seen": "yes"}
    status, written = await http.call("PUT", f"{CLAIMS}/{name}", created)
    assert status == 200 and written["status"] == {}, "the main resource keeps the stored status"
    assert written["metadata"]["labels"] == {"seen": "yes"}
    written["status"] = {"allocation": b.allocation()}
    written["metadata"]["labels"] = {"seen": "no"}
    written["spec"]["devices"]["requests"][0]["name"] = "other"
    status, allocated = await http.call("PUT", f"{CLAIMS}/{name}/status", written)
    assert status == 200 and allocated["status"]["allocation"] == b.allocation()
    assert allocated["metadata"]["labels"] == {"seen": "yes"}, "/status keeps the metadata"
    assert allocated["spec"]["devices"]["requests"][0]["name"] == "gpu", "and the spec"
    allocated["spec"]["devices"]["requests"][0]["name"] = "other"
    status, answer = await http.call("PUT", f"{CLAIMS}/{name}", allocated)
    assert status == 422 and "spec: Invalid value" in answer["message"]
    assert "field is immutable" in answer["message"]


STATUS_REFUSALS = [
    pytest.param(
        {"allocation": b.allocation(*[b.result(f"gpu-{i}") for i in range(33)])},
        "status.allocation.devices.results: Too many: 33: must have at most 32 items",
        id="results-32",
    ),
    pytest.param(
        {"allocation": b.allocation(), "reservedFor": [b.consumer(f"p{i}") for i in range(257)]},
        "status.reservedFor: Too many: 257: must have at most 256 items",
        id="reserved-for-256",
    ),
    pytest.param(
        {"reservedFor": [b.consumer("p")]},
        "status.reservedFor: Forbidden: may not be specified when `allocated` is not set",
        id="reserved-for-needs-allocation",
    ),
    pytest.param(
        {"allocation": b.allocation(b.result(request_name="nic"))},
        'status.allocation.devices.results[0].request: Invalid value: "nic": must be the name '
        "of a request in the claim",
        id="result-names-a-request",
    ),
    pytest.param(
        {"allocation": b.allocation(b.result(shareID="not-a-uid"))},
        'status.allocation.devices.results[0].shareID: Invalid value: "not-a-uid"',
        id="result-share-id",
    ),
    pytest.param(
        {"allocation": b.allocation(), "reservedFor": [{"resource": "pods", "name": "p"}]},
        "status.reservedFor[0].uid: Required value",
        id="reserved-for-uid",
    ),
]


@pytest.mark.parametrize(("status_body", "message"), STATUS_REFUSALS)
async def test_a_bad_status_write_is_refused_with_422_naming_the_field(
    http: Http, status_body: Obj, message: str
) -> None:
    name = unique("c")
    _, created = await http.create(CLAIMS, b.claim(name))
    created["status"] = status_body
    status, answer = await http.call("PUT", f"{CLAIMS}/{name}/status", created)
    assert (status, answer["reason"]) == (422, "Invalid"), answer
    assert message in answer["message"], answer["message"]


async def test_an_allocation_is_immutable_but_may_be_cleared(http: Http) -> None:
    name, claim = await _allocated_claim(http)
    claim["status"]["allocation"]["devices"]["results"][0]["device"] = "gpu-1"
    status, answer = await http.call("PUT", f"{CLAIMS}/{name}/status", claim)
    assert status == 422 and "status.allocation: Invalid value" in answer["message"]
    assert "field is immutable" in answer["message"]
    status, cleared = await http.call(
        "PATCH",
        f"{CLAIMS}/{name}/status",
        {"status": {"allocation": None, "reservedFor": None}},
        "application/merge-patch+json",
    )
    assert status == 200 and cleared["status"] == {}


async def test_the_delete_protection_finalizer_holds_a_claim_until_it_is_removed(
    http: Http,
) -> None:
    name, _ = await _allocated_claim(http, finalizer=True)
    status, held = await http.call("DELETE", f"{CLAIMS}/{name}")
    assert status == 200 and held["metadata"]["deletionTimestamp"], "answered with the object"
    assert http.api.find(RESOURCE_CLAIM, "default", name) is not None
    held["status"]["reservedFor"].append(b.consumer("late"))
    status, answer = await http.call("PUT", f"{CLAIMS}/{name}/status", held)
    assert (
        status == 422
        and "status.reservedFor: Forbidden: new entries may not be added" in (answer["message"])
    )
    status, answer = await http.call(
        "PATCH",
        f"{CLAIMS}/{name}",
        {"metadata": {"finalizers": [FINALIZER, "example.com/other"]}},
        "application/merge-patch+json",
    )
    assert (
        status == 422 and "metadata.finalizers: Forbidden: no new finalizers" in (answer["message"])
    )
    status, _ = await http.call(
        "PATCH",
        f"{CLAIMS}/{name}",
        {"metadata": {"finalizers": None}},
        "application/merge-patch+json",
    )
    assert status == 200
    assert http.api.find(RESOURCE_CLAIM, "default", name) is None, "gone with its last finalizer"


async def test_a_slice_update_bumps_its_generation_and_keeps_driver_pool_and_node(
    http: Http,
) -> None:
    name = unique("s")
    await http.create(f"{b.API}/resourceslices", b.resource_slice(name))
    path = f"{b.API}/resourceslices/{name}"
    status, updated = await http.call(
        "PATCH",
        path,
        {"spec": {"devices": [b.device("gpu-0"), b.device("gpu-1")]}},
        "application/merge-patch+json",
    )
    assert status == 200 and updated["metadata"]["generation"] == 2
    status, answer = await http.call(
        "PATCH", path, {"spec": {"nodeName": "node-b"}}, "application/merge-patch+json"
    )
    assert (
        status == 422
        and 'spec.nodeName: Invalid value: "node-b": field is immutable' in (answer["message"])
    )
    assert http.api.get(RESOURCE_SLICE, "", name)["metadata"]["generation"] == 2


async def test_a_template_spec_is_immutable(http: Http) -> None:
    name = unique("t")
    path = f"{b.API}/namespaces/default/resourceclaimtemplates"
    await http.create(path, b.template(name))
    status, answer = await http.call(
        "PATCH",
        f"{path}/{name}",
        {"spec": {"spec": b.claim_spec(b.request(count=2))}},
        "application/merge-patch+json",
    )
    assert status == 422 and "spec: Invalid value" in answer["message"]


POD_REFUSALS = [
    pytest.param(
        [{"name": "gpu"}],
        None,
        'spec.resourceClaims[0]: Invalid value: core.PodResourceClaim{Name:"gpu", '
        "ResourceClaimName:(*string)(nil), ResourceClaimTemplateName:(*string)(nil)}: must "
        "specify one of: `resourceClaimName`, `resourceClaimTemplateName`",
        id="pod-claim-source",
    ),
    pytest.param(
        [{"name": "gpu", "resourceClaimName": "a", "resourceClaimTemplateName": "b"}],
        None,
        "at most one of `resourceClaimName` or `resourceClaimTemplateName` may be specified",
        id="pod-claim-one-source",
    ),
    pytest.param(
        [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
        [{"name": "nic"}],
        'spec.containers[0].resources.claims[0]: Not found: "nic": must be one of the names in '
        "pod.spec.resourceClaims: gpu",
        id="container-claim-not-found",
    ),
    pytest.param(
        [
            {"name": "gpu", "resourceClaimTemplateName": "one-gpu"},
            {"name": "gpu", "resourceClaimName": "shared"},
        ],
        [],
        'spec.resourceClaims[1].name: Duplicate value: "gpu"',
        id="pod-claim-duplicate",
    ),
]


@pytest.mark.parametrize(("claims", "container_claims", "message"), POD_REFUSALS)
async def test_a_pod_s_claims_are_validated(
    http: Http, claims: list[Obj], container_claims: list[Obj] | None, message: str
) -> None:
    body = b.pod_with_claims(unique("p"), claims, container_claims)
    status, answer = await http.create("/api/v1/namespaces/default/pods", body)
    assert (status, answer["reason"]) == (422, "Invalid"), answer
    assert message in answer["message"], answer["message"]


async def test_a_pod_s_claim_statuses_must_name_its_claims(http: Http) -> None:
    name = unique("p")
    pods = "/api/v1/namespaces/default/pods"
    await http.create(
        pods, b.pod_with_claims(name, [{"name": "gpu", "resourceClaimTemplateName": "t"}])
    )
    status, answer = await http.call(
        "PATCH",
        f"{pods}/{name}/status",
        {"status": {"resourceClaimStatuses": [{"name": "nic", "resourceClaimName": "x"}]}},
        "application/strategic-merge-patch+json",
    )
    assert (
        status == 422
        and (
            'status.resourceClaimStatuses[0].name: Invalid value: "nic": must match the name of an '
            "entry in `spec.resourceClaims`"
        )
        in answer["message"]
    )
    status, patched = await http.call(
        "PATCH",
        f"{pods}/{name}/status",
        {"status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": f"{name}-g"}]}},
        "application/strategic-merge-patch+json",
    )
    assert status == 200
    assert patched["status"]["resourceClaimStatuses"] == [
        {"name": "gpu", "resourceClaimName": f"{name}-g"}
    ]


async def test_kubectl_s_table_shows_each_claim_s_state(http: Http) -> None:
    name, _ = await _allocated_claim(http)
    pending = unique("c")
    await http.create(CLAIMS, b.claim(pending))
    headers = {
        "Authorization": f"Bearer {http.api.token}",
        "Accept": "application/json;as=Table;v=v1;g=meta.k8s.io",
    }
    async with http.session.get(http.api.url + CLAIMS, headers=headers) as response:
        table = await response.json()
    assert [c["name"] for c in table["columnDefinitions"]] == ["Name", "State", "Age"]
    states = {row["cells"][0]: row["cells"][1] for row in table["rows"]}
    assert states[name] == "allocated,reserved" and states[pending] == "pending"
