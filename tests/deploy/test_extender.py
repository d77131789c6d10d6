"""Extender mode: the KubeSchedulerConfiguration the chart renders, and the kube-scheduler using it.

kube-scheduler decodes its --config strictly and then validates it; neither kube-scheduler nor
its config API can run here, so the config is checked against a schema written from the v1 Go
types (schemas/kubescheduler-config-v1.json) and against the rules of kube-scheduler's
validateExtenders (positive weight with a prioritize verb, one binder at most, managed resources
that are valid, non-duplicate extended resource names).
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import pytest
import yaml

from tests.deploy.chart import (
    NAMESPACE,
    Object,
    component,
    containers,
    named,
    option_values,
    render,
    run_helm,
    template_args,
    template_error,
)
from tests.deploy.variants import VARIANTS

SCHEMA = json.loads(
    (Path(__file__).parent / "schemas" / "kubescheduler-config-v1.json").read_text()
)
# The pod-facing resources of docs/design.md §3; kube-scheduler must leave their fit to Tessera.
TESSERA_RESOURCES = (
    "tessera.dev/gpu",
    "tessera.dev/gpu-memory",
    "tessera.dev/gpu-memory-percentage",
    "tessera.dev/gpu-cores",
)
_QUALIFIED_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_GO_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h))+$")
_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def go_duration_s(text: str) -> float:
    assert _GO_DURATION.match(text), f"{text!r} is not a Go duration"
    return sum(
        float(n) * _SECONDS[unit]
        for n, unit in re.findall(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)", text)
    )


def extended_resource_problem(name: str) -> str | None:
    """kube-scheduler's validateExtendedResourceName, as a reason or None."""
    prefix, slash, local = name.partition("/")
    if not slash or prefix == "kubernetes.io" or prefix.endswith(".kubernetes.io"):
        return "must be a non-native resource: a domain-prefixed name outside kubernetes.io"
    if len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix):
        return "prefix must be a DNS subdomain"
    # Kubernetes also requires the quota name "requests.<name>" to be a qualified name.
    if len(local) > 63 or not _QUALIFIED_NAME.match(local):
        return "name must be a qualified name of at most 63 characters"
    return None


def extender_problems(config: dict[str, Any]) -> list[str]:
    """What kube-scheduler would refuse in ``config``: its schema, then validateExtenders."""
    problems = [
        f"{'.'.join(map(str, e.path))}: {e.message}"
        for e in jsonschema.Draft7Validator(SCHEMA).iter_errors(config)
    ]
    binders = 0
    seen: set[str] = set()
    for i, extender in enumerate(config.get("extenders", [])):
        if extender.get("prioritizeVerb") and extender.get("weight", 0) <= 0:
            problems.append(f"extenders[{i}].weight: must have a positive weight applied to it")
        binders += bool(extender.get("bindVerb"))
        for resource in extender.get("managedResources", []):
            reason = extended_resource_problem(resource["name"])
            if reason:
                problems.append(f"extenders[{i}] managed resource {resource['name']}: {reason}")
            if resource["name"] in seen:
                problems.append(f"duplicate extender managed resource name {resource['name']}")
            seen.add(resource["name"])
    if binders > 1:
        problems.append("only one extender can implement bind")
    return problems


def scheduler_config(objects: tuple[Object, ...]) -> dict[str, Any]:
    config_map = named(objects, "ConfigMap", component("scheduler"))
    loaded: dict[str, Any] = yaml.safe_load(config_map["data"]["config.yaml"])
    return loaded


@pytest.fixture(scope="module")
def extender_objects() -> tuple[Object, ...]:
    return render(VARIANTS["extender"])


def test_config_is_a_valid_kube_scheduler_configuration(
    extender_objects: tuple[Object, ...],
) -> None:
    config = scheduler_config(extender_objects)
    assert extender_problems(config) == []
    (extender,) = config["extenders"]
    assert extender["filterVerb"] == "filter"
    assert extender["prioritizeVerb"] == "prioritize"
    assert extender["bindVerb"] == "bind"
    assert extender["nodeCacheCapable"] is True
    assert extender["ignorable"] is False
    assert 0 < go_duration_s(extender["httpTimeout"]) <= 30


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        (lambda e: e.update(weight=0), "positive weight"),
        (lambda e: e.update(nodeCacheCapeable=True), "nodeCacheCapeable"),
        (lambda e: e.update(httpTimeout="10 seconds"), "httpTimeout"),
        (lambda e: e["managedResources"].append({"name": "nvidia.com/gpu"}), None),
        (lambda e: e["managedResources"].append({"name": "tessera.dev/gpu"}), "duplicate"),
        (lambda e: e["managedResources"].append({"name": "gpu"}), "non-native"),
        (lambda e: e["managedResources"].append({"name": "kubernetes.io/gpu"}), "non-native"),
    ],
)
def test_the_config_check_refuses_what_kube_scheduler_refuses(
    extender_objects: tuple[Object, ...], change: Any, complaint: str | None
) -> None:
    config = copy.deepcopy(scheduler_config(extender_objects))
    change(config["extenders"][0])
    problems = extender_problems(config)
    if complaint is None:
        assert problems == []
    else:
        assert any(complaint in p for p in problems), problems


def test_every_tessera_resource_is_managed_and_ignored_by_kube_scheduler(
    extender_objects: tuple[Object, ...],
) -> None:
    (extender,) = scheduler_config(extender_objects)["extenders"]
    managed = {r["name"]: r.get("ignoredByScheduler", False) for r in extender["managedResources"]}
    assert managed == dict.fromkeys(TESSERA_RESOURCES, True)


def test_url_prefix_reaches_the_placers_extender_port(extender_objects: tuple[Object, ...]) -> None:
    (extender,) = scheduler_config(extender_objects)["extenders"]
    url = urlsplit(extender["urlPrefix"])
    assert url.scheme == "http"
    service_name, service_namespace, svc = str(url.hostname).split(".")
    assert (service_namespace, svc) == (NAMESPACE, "svc")
    service = named(extender_objects, "Service", service_name)
    (port,) = [p for p in service["spec"]["ports"] if p["port"] == url.port]
    placer = next(c for c in containers(extender_objects) if c.spec["name"] == "placer")
    assert (
        service["spec"]["selector"].items()
        <= placer.workload["spec"]["template"]["metadata"]["labels"].items()
    )
    (target,) = [p for p in placer.spec["ports"] if p["name"] == port["targetPort"]]
    assert option_values(placer.args())["--extender-port"] == str(target["containerPort"])


def test_kube_scheduler_runs_that_config_under_its_own_scheduler_name(
    extender_objects: tuple[Object, ...],
) -> None:
    config = scheduler_config(extender_objects)
    (profile,) = config["profiles"]
    assert profile["schedulerName"] == "tessera-extender"
    assert profile["schedulerName"] not in ("tessera", "default-scheduler")
    # The built-in system:kube-scheduler role lets it update only Leases named kube-scheduler;
    # the default scheduler's Lease of that name is in kube-system, this one in the release's.
    assert config["leaderElection"] == {
        "leaderElect": True,
        "resourceName": "kube-scheduler",
        "resourceNamespace": NAMESPACE,
    }
    scheduler = next(c for c in containers(extender_objects) if c.spec["name"] == "kube-scheduler")
    (config_arg,) = [a for a in scheduler.spec["command"] if a.startswith("--config=")]
    config_path = Path(config_arg.removeprefix("--config="))
    (mount,) = [
        m for m in scheduler.spec["volumeMounts"] if Path(m["mountPath"]) == config_path.parent
    ]
    volume = scheduler.volume(mount["name"])
    assert volume["configMap"]["name"] == component("scheduler")
    assert config_path.name == "config.yaml"
    assert scheduler.pod["serviceAccountName"] == component("scheduler")


@pytest.mark.parametrize(
    ("cluster", "tag", "image"),
    [
        ("v1.31.2", "", "registry.k8s.io/kube-scheduler:v1.31.2"),
        ("v1.30.4-eks-a737599", "", "registry.k8s.io/kube-scheduler:v1.30.4"),
        ("v1.33.1+k3s1", "", "registry.k8s.io/kube-scheduler:v1.33.1"),
        ("v1.31.2", "v1.31.0", "registry.k8s.io/kube-scheduler:v1.31.0"),
    ],
)
def test_the_kube_scheduler_image_follows_the_cluster_version(
    cluster: str, tag: str, image: str
) -> None:
    """A kube-scheduler must match its control plane: the cluster's version unless set."""
    values = {"extender": {"enabled": True, "scheduler": {"image": {"tag": tag}}}}
    done = run_helm(*template_args(), "--kube-version", cluster, values=values)
    assert done.returncode == 0, done.stderr
    objects = [doc for doc in yaml.safe_load_all(done.stdout) if doc]
    scheduler = next(c for c in containers(objects) if c.spec["name"] == "kube-scheduler")
    assert scheduler.spec["image"] == image


def test_extender_values_reach_the_config() -> None:
    objects = render(
        {
            "extender": {
                "enabled": True,
                "urlPrefix": "https://tessera-extender.example:9443/v1",
                "weight": 5,
                "nodeCacheCapable": False,
                "httpTimeoutSeconds": 3,
                "managedResources": [{"name": "tessera.dev/gpu", "ignoredByScheduler": False}],
            }
        }
    )
    (extender,) = scheduler_config(objects)["extenders"]
    assert extender_problems(scheduler_config(objects)) == []
    assert extender["urlPrefix"] == "https://tessera-extender.example:9443/v1"
    assert (extender["weight"], extender["nodeCacheCapable"], extender["httpTimeout"]) == (
        5,
        False,
        "3s",
    )
    assert extender["managedResources"] == [
        {"name": "tessera.dev/gpu", "ignoredByScheduler": False}
    ]


def test_no_extender_objects_by_default() -> None:
    objects = render({})
    assert not [o for o in objects if o["metadata"]["name"].startswith(component("scheduler"))]
    placer = next(c for c in containers(objects) if c.spec["name"] == "placer")
    assert "--extender-port" not in option_values(placer.args())
    binder = next(c for c in containers(objects) if c.spec["name"] == "binder")
    assert option_values(binder.args())["--extender-scheduler-names"] == ""


@pytest.mark.parametrize("seconds", [3, 10, 30])
def test_the_placer_answers_bind_before_kube_scheduler_gives_up(seconds: int) -> None:
    objects = render({"extender": {"enabled": True, "httpTimeoutSeconds": seconds}})
    (extender,) = scheduler_config(objects)["extenders"]
    placer = next(c for c in containers(objects) if c.spec["name"] == "placer")
    bind_timeout = float(option_values(placer.args())["--extender-bind-timeout-s"])
    assert 0 < bind_timeout <= go_duration_s(extender["httpTimeout"]) - 2


def test_the_binder_takes_the_second_scheduler_s_pods_as_tessera_s(
    extender_objects: tuple[Object, ...],
) -> None:
    (profile,) = scheduler_config(extender_objects)["profiles"]
    binder = next(c for c in containers(extender_objects) if c.spec["name"] == "binder")
    names = option_values(binder.args())["--extender-scheduler-names"]
    assert names.split(",") == [profile["schedulerName"]]


def test_node_pools_reach_the_placer_and_are_refused_beside_the_extender() -> None:
    placer = next(
        c for c in containers(render(VARIANTS["placer-pools"])) if c.spec["name"] == "placer"
    )
    options = option_values(placer.args())
    assert (options["--pools"], options["--pool-lease-s"]) == ("3", "2.5")
    default = next(c for c in containers(render({})) if c.spec["name"] == "placer")
    assert option_values(default.args())["--pools"] == "2"  # one per replica
    extender = next(
        c for c in containers(render(VARIANTS["extender"])) if c.spec["name"] == "placer"
    )
    assert "--pools" not in option_values(extender.args())
    refused = template_error({"placer": {"pools": 2}, "extender": {"enabled": True}})
    assert "placer.pools above 1 cannot go with extender.enabled" in refused
