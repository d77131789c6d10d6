"""The chart lints, renders every variant, and every object is valid Kubernetes.

Objects are checked with kubernetes-validate --strict (the API server's own OpenAPI schemas,
unknown fields rejected) for the oldest Kubernetes the chart supports (Chart.yaml kubeVersion)
and current ones. The ServiceMonitor (a CRD) and the kube-scheduler's configuration are not in
those schemas: test_extender and the ServiceMonitor test below check them against schemas written
from their API types.
"""

from __future__ import annotations

import json
import tomllib
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.deploy.chart import (
    CERT_MANAGER_API,
    CHART_DIR,
    NAMESPACE,
    PROMETHEUS_RULE_API,
    REPO_ROOT,
    SERVICE_MONITOR_API,
    Object,
    of_kind,
    render,
    run_helm,
)
from tests.deploy.variants import VARIANTS, WITH_CERT_MANAGER_API, WITH_SERVICE_MONITOR_API

# The chart's floor (Chart.yaml kubeVersion), the release the pinned helm/kubectl come with, and
# the newest kubernetes-validate knows.
KUBERNETES_VERSIONS = ("1.29.0", "1.35.0", kubernetes_validate.latest_version())
SCHEMAS = Path(__file__).parent / "schemas"
CUSTOM_SCHEMAS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor-v1.json",
    ("cert-manager.io/v1", "Certificate"): "certmanager-certificate-v1.json",
    ("cert-manager.io/v1", "Issuer"): "certmanager-issuer-v1.json",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheusrule-v1.json",
}


def rendered(variant: str) -> tuple[Object, ...]:
    api = [SERVICE_MONITOR_API, PROMETHEUS_RULE_API] if variant in WITH_SERVICE_MONITOR_API else []
    if variant in WITH_CERT_MANAGER_API:
        api.append(CERT_MANAGER_API)
    return render(VARIANTS[variant], api)


def test_chart_app_version_is_the_package_version() -> None:
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert chart["apiVersion"] == "v2"
    assert chart["appVersion"] == project["version"]
    floor = chart["kubeVersion"].removeprefix(">=").removesuffix("-0")
    assert floor == KUBERNETES_VERSIONS[0]


@pytest.mark.parametrize("variant", ["default", "extender", "clustered-nats-user-password"])
def test_helm_lint_strict(variant: str) -> None:
    done = run_helm(
        "lint", "--strict", "--namespace", NAMESPACE, str(CHART_DIR), values=VARIANTS[variant]
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 chart(s) failed" in done.stdout


def _custom_schema(obj: Object) -> dict[str, Any] | None:
    name = CUSTOM_SCHEMAS.get((obj["apiVersion"], obj["kind"]))
    return json.loads((SCHEMAS / name).read_text()) if name else None


def _versions_of(obj: dict[str, Any]) -> tuple[str, ...]:
    """The Kubernetes versions an object is checked against: DRA's (resource.k8s.io/v1) exist
    from 1.34, which DRA mode needs."""
    if not obj["apiVersion"].startswith("resource.k8s.io/"):
        return KUBERNETES_VERSIONS
    return tuple(v for v in KUBERNETES_VERSIONS if tuple(map(int, v.split(".")[:2])) >= (1, 34))


@cache
def _validation_problem(version: str, text: str) -> str | None:
    """kubernetes-validate's complaint about one object (JSON text), None when valid.

    Cached: most objects are the same in many variants, and each check reads the schemas again.
    """
    obj = json.loads(text)
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as error:
        return f"{'.'.join(map(str, error.path))}: {error.message}"
    except kubernetes_validate.SchemaNotFoundError as error:
        return str(error.message)
    return None


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_object_passes_kubernetes_validate_strict(variant: str) -> None:
    objects = rendered(variant)
    assert objects, "nothing rendered"
    problems: list[str] = []
    for obj in objects:
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        custom = _custom_schema(obj)
        if custom is not None:
            for error in jsonschema.Draft7Validator(custom).iter_errors(obj):
                problems.append(f"{where}: {'.'.join(map(str, error.path))}: {error.message}")
            continue
        text = json.dumps(obj, sort_keys=True)
        for version in _versions_of(obj):
            problem = _validation_problem(version, text)
            if problem is not None:
                problems.append(f"{where} (Kubernetes {version}): {problem}")
    assert not problems, "\n".join(problems)


def test_strict_validation_catches_an_unknown_field() -> None:
    """The validation above would notice a misspelt field (the check can fail)."""
    deployment = dict(of_kind(rendered("default"), "Deployment")[0])
    spec = dict(deployment["spec"])
    spec["replica"] = 2
    deployment["spec"] = spec
    with pytest.raises(kubernetes_validate.ValidationError, match="replica"):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[1], strict=True)


def test_objects_are_namespaced_in_the_release_namespace() -> None:
    cluster_scoped = {
        "ClusterRole",
        "ClusterRoleBinding",
        "DeviceClass",
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    }
    for variant in VARIANTS:
        for obj in rendered(variant):
            namespace = obj["metadata"].get("namespace")
            if obj["kind"] in cluster_scoped:
                assert namespace is None, obj["metadata"]["name"]
            elif obj["kind"] == "RoleBinding" and namespace == "kube-system":
                # the extender's kube-scheduler reads the client CA there (test_extender)
                assert variant == "extender"
            else:
                assert namespace == NAMESPACE, f"{obj['kind']}/{obj['metadata']['name']}"


def test_service_monitor_follows_the_cluster_api_when_auto() -> None:
    with_api = of_kind(render({}, [SERVICE_MONITOR_API]), "ServiceMonitor")
    without_api = of_kind(render({}), "ServiceMonitor")
    forced = of_kind(render({"serviceMonitor": {"enabled": True}}), "ServiceMonitor")
    switched_off = of_kind(rendered("no-servicemonitor"), "ServiceMonitor")
    assert (len(with_api), len(without_api), len(forced), len(switched_off)) == (1, 0, 1, 0)


def test_service_monitor_selects_every_tessera_metrics_service() -> None:
    objects = rendered("dashboard")
    (monitor,) = of_kind(objects, "ServiceMonitor")
    selector = monitor["spec"]["selector"]["matchLabels"]
    selected = {
        svc["metadata"]["name"]
        for svc in of_kind(objects, "Service")
        if selector.items() <= svc["metadata"]["labels"].items()
    }
    assert selected == {
        f"tessera-{name}"
        for name in ("placer", "binder", "inventory", "deviceplugin", "dashboard", "webhook")
    }
    assert monitor["spec"]["endpoints"] == [
        {"port": "http", "path": "/metrics", "interval": "30s", "scrapeTimeout": "10s"}
    ]
    for svc in of_kind(objects, "Service"):
        if svc["metadata"]["name"] in selected:
            assert any(port["name"] == "http" for port in svc["spec"]["ports"])
