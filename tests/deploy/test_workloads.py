"""Probes, ports, security contexts and resources of every rendered workload.

A probe must reach the port its container serves: for a Tessera service the port named http is
its --http-port (where /healthz and /readyz are served), for NATS the monitoring port of its
configuration, for kube-scheduler its --secure-port.
"""

from __future__ import annotations

import re

import pytest

from tests.deploy.chart import (
    Container,
    Object,
    component,
    containers,
    named,
    option_values,
    render,
)
from tests.deploy.variants import VARIANTS

TESSERA_SERVICES = {"inventory", "deviceplugin", "placer", "binder", "dashboard", "webhook"}
PROBES = ("startupProbe", "livenessProbe", "readinessProbe")


def served_port(container: Container, objects: tuple[Object, ...]) -> int:
    """The port the container's process serves health on, from its own command or config."""
    args = container.args()
    if args and args[0] in TESSERA_SERVICES:
        return int(option_values(args)["--http-port"])
    if container.spec["name"] == "nats":
        config = named(objects, "ConfigMap", component("nats-config"))["data"]["nats.conf"]
        (port,) = re.findall(r"^http_port: (\d+)$", config, flags=re.MULTILINE)
        return int(port)
    if container.spec["name"] == "kube-scheduler":
        (port,) = [
            a.split("=")[1] for a in container.spec["command"] if a.startswith("--secure-port=")
        ]
        return int(port)
    raise AssertionError(f"{container.where}: unknown container")


def probe_port(container: Container, probe: Object) -> int:
    port = probe["httpGet"]["port"]
    if isinstance(port, int):
        return port
    (declared,) = [p for p in container.spec["ports"] if p["name"] == port]
    return int(declared["containerPort"])


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_probe_points_at_the_port_its_container_serves(variant: str) -> None:
    objects = render(VARIANTS[variant])
    for container in containers(objects):
        if container.init:
            continue
        probes = {name: container.spec[name] for name in PROBES if name in container.spec}
        assert {"livenessProbe", "readinessProbe"} <= probes.keys(), container.where
        for name, probe in probes.items():
            assert probe_port(container, probe) == served_port(container, objects), (
                f"{container.where}: {name} on another port"
            )
        if container.args() and container.args()[0] in TESSERA_SERVICES:
            assert probes["livenessProbe"]["httpGet"]["path"] == "/healthz"
            assert probes["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_a_different_http_port_moves_every_tessera_probe() -> None:
    objects = render({"httpPort": 9090, "dashboard": {"enabled": True}})
    tessera = [c for c in containers(objects) if c.args() and c.args()[0] in TESSERA_SERVICES]
    assert len(tessera) == len(TESSERA_SERVICES)
    for container in tessera:
        assert probe_port(container, container.spec["livenessProbe"]) == 9090
        assert served_port(container, objects) == 9090


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_containers_run_without_privilege_and_with_limits(variant: str) -> None:
    for container in containers(render(VARIANTS[variant])):
        security = container.spec["securityContext"]
        assert security["allowPrivilegeEscalation"] is False, container.where
        assert security["readOnlyRootFilesystem"] is True, container.where
        assert security["capabilities"] == {"drop": ["ALL"]}, container.where
        assert not security.get("privileged"), container.where
        assert container.pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        if container.spec["name"] == "deviceplugin":
            # The one root component: the kubelet's socket directory (see its template).
            assert container.pod["securityContext"]["runAsUser"] == 0
        else:
            assert container.pod["securityContext"]["runAsNonRoot"] is True, container.where
            assert container.pod["securityContext"]["runAsUser"] > 0, container.where
        resources = container.spec["resources"]
        assert {"cpu", "memory"} <= resources["requests"].keys(), container.where
        assert "memory" in resources["limits"], container.where


def test_per_node_services_run_on_gpu_nodes_and_know_their_node() -> None:
    objects = render({})
    for name in ("inventory", "deviceplugin"):
        daemonset = named(objects, "DaemonSet", component(name))
        pod = daemonset["spec"]["template"]["spec"]
        assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
        (container,) = pod["containers"]
        node = [e for e in container["env"] if e["name"] == "NODE_NAME"]
        assert node == [
            {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
        ]
        assert pod["enableServiceLinks"] is False


def test_device_plugin_mounts_the_kubelet_directory_it_is_told() -> None:
    objects = render({"deviceplugin": {"pluginDir": "/var/lib/k0s/kubelet/device-plugins"}})
    (plugin,) = [c for c in containers(objects) if c.spec["name"] == "deviceplugin"]
    directory = option_values(plugin.args())["--plugin-dir"]
    assert directory == "/var/lib/k0s/kubelet/device-plugins"
    (mount,) = [m for m in plugin.spec["volumeMounts"] if m["mountPath"] == directory]
    assert plugin.volume(mount["name"])["hostPath"] == {"path": directory, "type": "Directory"}


def test_inventory_reaches_nvml_through_the_nvidia_runtime() -> None:
    objects = render({"inventory": {"runtimeClassName": "nvidia", "nvidiaVisibleDevices": "all"}})
    (inventory,) = [c for c in containers(objects) if c.spec["name"] == "inventory"]
    assert inventory.pod["runtimeClassName"] == "nvidia"
    env = {e["name"]: e.get("value") for e in inventory.env()}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert option_values(inventory.args())["--backend"] == "nvml"


def test_placer_and_binder_replicas_and_disruption_budgets() -> None:
    objects = render({})
    placer = named(objects, "Deployment", component("placer"))
    binder = named(objects, "Deployment", component("binder"))
    assert (placer["spec"]["replicas"], binder["spec"]["replicas"]) == (2, 2)
    (binder_container,) = binder["spec"]["template"]["spec"]["containers"]
    assert "--leader-elect" in binder_container["args"]
    for name in ("placer", "binder"):
        budget = named(objects, "PodDisruptionBudget", component(name))
        deployment = named(objects, "Deployment", component(name))
        assert budget["spec"]["maxUnavailable"] == 1
        assert budget["spec"]["selector"] == deployment["spec"]["selector"]


def test_placement_can_be_stopped_for_an_upgrade() -> None:
    """``placer.replicas=0`` (README, upgrading): no placer runs, everything else does, and the
    placers' disruption budget still renders."""
    objects = render({"placer": {"replicas": 0}})
    assert named(objects, "Deployment", component("placer"))["spec"]["replicas"] == 0
    assert named(objects, "Deployment", component("binder"))["spec"]["replicas"] == 2
    assert named(objects, "PodDisruptionBudget", component("placer"))["spec"]["maxUnavailable"]


def test_every_service_selects_pods_of_its_own_component() -> None:
    objects = render(VARIANTS["extender"])
    pods = {
        w["metadata"]["name"]: w["spec"]["template"]["metadata"]["labels"]
        for w in objects
        if w["kind"] in ("Deployment", "DaemonSet", "StatefulSet")
    }
    for service in (o for o in objects if o["kind"] == "Service"):
        selector = service["spec"]["selector"]
        matching = [name for name, labels in pods.items() if selector.items() <= labels.items()]
        assert len(matching) == 1, (service["metadata"]["name"], matching)


def test_per_node_services_can_run_on_every_node() -> None:
    objects = render(VARIANTS["fake-gpus-tenancy-profile"])
    for name in ("inventory", "deviceplugin"):
        pod = named(objects, "DaemonSet", component(name))["spec"]["template"]["spec"]
        assert "nodeSelector" not in pod and "tolerations" not in pod
    (inventory,) = [c for c in containers(objects) if c.spec["name"] == "inventory"]
    assert option_values(inventory.args())["--fake-gpus"] == "4xA100-80GB"
    assert "NVIDIA_VISIBLE_DEVICES" not in {e["name"] for e in inventory.env()}
