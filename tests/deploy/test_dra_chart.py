"""The chart's DRA mode (``gpuApi: dra``): off by default; on, the DeviceClass gpu.tessera.dev, the
binder in DRA mode with exactly its DRA rights, and on each GPU node either the device plugin or,
where the node is labelled ``tessera.dev/gpu-api=dra``, the DRA node plugin with the kubelet's
plugin registry, its plugin directory and the CDI directory mounted (valid against the newest
strict schemas: ``test_render`` checks every object of the ``dra`` variant)."""

from __future__ import annotations

from typing import Any

import celpy
import kubernetes_validate
from celpy.adapter import json_to_cel

from tests.deploy.chart import component, containers, named, of_kind, option_values, render
from tests.deploy.test_rbac import BINDER_RIGHTS, DRA_RIGHTS, rights_by_service_account

DRA = {"gpuApi": "dra"}


def api_terms(daemonset: dict[str, Any]) -> list[list[dict[str, Any]]]:
    pod = daemonset["spec"]["template"]["spec"]
    required = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return [term["matchExpressions"] for term in required["nodeSelectorTerms"]]


def test_dra_mode_is_off_by_default() -> None:
    objects = render({})
    assert of_kind(objects, "DeviceClass") == []
    rights = rights_by_service_account(objects)[component("binder")]
    assert not any(group == "resource.k8s.io" for group, _, _ in rights)
    (daemonset,) = [
        d for d in of_kind(objects, "DaemonSet") if "deviceplugin" in d["metadata"]["name"]
    ]
    assert "affinity" not in daemonset["spec"]["template"]["spec"]
    (binder,) = [c for c in containers(objects) if c.spec["name"] == "binder"]
    assert "--dra" not in binder.args()


def test_dra_mode_brings_the_device_class_and_the_binders_claim_rights() -> None:
    objects = render(DRA)
    device_class = named(objects, "DeviceClass", "gpu.tessera.dev")
    assert device_class["spec"]["selectors"] == [
        {"cel": {"expression": 'device.driver == "gpu.tessera.dev"'}}
    ]
    kubernetes_validate.validate(device_class, kubernetes_validate.latest_version(), strict=True)
    rights = rights_by_service_account(objects)
    assert {name: dict(r) for name, r in rights.items()} == {
        component("binder"): {**BINDER_RIGHTS, **DRA_RIGHTS}
    }
    (binder,) = [c for c in containers(objects) if c.spec["name"] == "binder"]
    assert "--dra" in binder.args()


def test_each_gpu_node_runs_the_device_plugin_or_by_its_label_the_dra_node_plugin() -> None:
    objects = render(DRA)
    plugin = named(objects, "DaemonSet", component("deviceplugin"))
    dra = named(objects, "DaemonSet", component("deviceplugin-dra"))
    label = {"key": "tessera.dev/gpu-api", "values": ["dra"]}
    assert api_terms(plugin) == [[{**label, "operator": "NotIn"}]]
    assert api_terms(dra) == [[{**label, "operator": "In"}]]
    for daemonset in (plugin, dra):
        pod = daemonset["spec"]["template"]["spec"]
        assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
        assert pod["serviceAccountName"] == component("deviceplugin")
    selectors = [d["spec"]["selector"]["matchLabels"] for d in (plugin, dra)]
    assert selectors[0] != selectors[1]
    for daemonset, other in ((plugin, dra), (dra, plugin)):
        labels = other["spec"]["template"]["metadata"]["labels"]
        assert not daemonset["spec"]["selector"]["matchLabels"].items() <= labels.items()

    (node_plugin,) = [
        c
        for c in containers(objects)
        if c.spec["name"] == "deviceplugin" and "--api=dra" in c.args()
    ]
    options = option_values(node_plugin.args())
    assert options["--registry-dir"] == "/var/lib/kubelet/plugins_registry"
    assert options["--dra-plugin-dir"] == "/var/lib/kubelet/plugins"
    assert options["--plugin-dir"] == "/var/lib/kubelet/plugins/gpu.tessera.dev"
    assert options["--cdi-dir"] == "/var/run/cdi"
    mounted = {
        m["mountPath"]: node_plugin.volume(m["name"])["hostPath"]
        for m in node_plugin.spec["volumeMounts"]
        if "hostPath" in node_plugin.volume(m["name"])
    }
    assert mounted == {
        "/var/lib/kubelet/plugins_registry": {
            "path": "/var/lib/kubelet/plugins_registry",
            "type": "Directory",
        },
        "/var/lib/kubelet/plugins/gpu.tessera.dev": {
            "path": "/var/lib/kubelet/plugins/gpu.tessera.dev",
            "type": "DirectoryOrCreate",
        },
        "/var/run/cdi": {"path": "/var/run/cdi", "type": "DirectoryOrCreate"},
    }
    metrics = named(objects, "Service", component("deviceplugin-dra"))
    assert metrics["spec"]["selector"] == dra["spec"]["selector"]["matchLabels"]


def test_the_api_label_joins_every_term_of_the_operators_node_affinity() -> None:
    zone = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}
    pool = {"key": "pool", "operator": "Exists"}
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [zone]}, {"matchExpressions": [pool]}]
            }
        }
    }
    objects = render({**DRA, "deviceplugin": {"affinity": affinity}})
    dra = {"key": "tessera.dev/gpu-api", "operator": "In", "values": ["dra"]}
    assert api_terms(named(objects, "DaemonSet", component("deviceplugin-dra"))) == [
        [zone, dra],
        [pool, dra],
    ]
    plugin = api_terms(named(objects, "DaemonSet", component("deviceplugin")))
    assert plugin == [[zone, {**dra, "operator": "NotIn"}], [pool, {**dra, "operator": "NotIn"}]]


def _reaches_the_webhook(values: dict[str, Any], pod: dict[str, Any]) -> bool:
    """The mutating webhook's matchCondition, evaluated by a CEL implementation on ``pod``."""
    (configuration,) = of_kind(render(values), "MutatingWebhookConfiguration")
    (condition,) = configuration["webhooks"][0]["matchConditions"]
    environment = celpy.Environment()
    program = environment.program(environment.compile(condition["expression"]))
    return bool(program.evaluate({"object": json_to_cel(pod)}))


def test_in_dra_mode_a_pod_with_claims_reaches_the_webhook_which_tells_their_class() -> None:
    plain = {"spec": {"containers": [{"name": "main", "image": "x"}]}}
    claims = {
        "spec": {
            **plain["spec"],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "a100-8gi-quarter"}],
        }
    }
    assert _reaches_the_webhook(DRA, claims)
    assert not _reaches_the_webhook(DRA, plain)
    assert not _reaches_the_webhook({}, claims), "device-plugin mode: no claim is Tessera's"
