"""Least privilege: only the binder holds Kubernetes API rights, and only the verbs it uses.

The chart's only RBAC rules are the binder's, exactly the list of the issue (docs/design.md §11);
every other Tessera component has a ServiceAccount with no binding and no mounted token. In
extender mode the second kube-scheduler gets the built-in roles every kube-scheduler has, and no
rule the chart writes.
"""

from __future__ import annotations

from collections import defaultdict

import pytest

from tests.deploy.chart import NAMESPACE, Object, component, containers, of_kind, render
from tests.deploy.variants import VARIANTS

# (apiGroup, resource, namespace or None for cluster-wide) -> verbs.
BINDER_RIGHTS: dict[tuple[str, str, str | None], set[str]] = {
    ("", "pods", None): {"get", "list", "watch", "patch"},
    ("", "pods/binding", None): {"create"},
    ("", "pods/status", None): {"patch"},
    ("", "nodes", None): {"get", "list", "watch"},
    ("", "namespaces", None): {"list", "watch"},
    ("events.k8s.io", "events", None): {"create", "patch"},
    ("coordination.k8s.io", "leases", NAMESPACE): {"get", "create", "update"},
}
# With gpuApi: dra (docs/design.md §14): follow claims and write their allocation (the finalizer
# with a patch of the claim itself), follow templates for the webhook's index of claim classes,
# publish ResourceSlices.
DRA_RIGHTS: dict[tuple[str, str, str | None], set[str]] = {
    ("resource.k8s.io", "resourceclaims", None): {"get", "list", "watch", "patch"},
    ("resource.k8s.io", "resourceclaims/status", None): {"update", "patch"},
    ("resource.k8s.io", "resourceclaims/binding", None): {"update", "patch"},
    ("resource.k8s.io", "resourceclaimtemplates", None): {"list", "watch"},
    ("resource.k8s.io", "resourceslices", None): {"list", "create", "update", "delete"},
}
KUBE_SCHEDULER_ROLES = {
    ("ClusterRole", "system:kube-scheduler", None),
    ("ClusterRole", "system:volume-scheduler", None),
    ("Role", "extension-apiserver-authentication-reader", "kube-system"),
}


def rights_by_service_account(
    objects: tuple[Object, ...],
) -> dict[str, dict[tuple[str, str, str | None], set[str]]]:
    """ServiceAccount -> the rights the chart's own Roles and ClusterRoles give it."""
    roles = {
        (role["kind"], role["metadata"]["name"], role["metadata"].get("namespace")): role
        for role in of_kind(objects, "Role") + of_kind(objects, "ClusterRole")
    }
    rights: dict[str, dict[tuple[str, str, str | None], set[str]]] = defaultdict(
        lambda: defaultdict(set)
    )
    for binding in of_kind(objects, "RoleBinding") + of_kind(objects, "ClusterRoleBinding"):
        namespace = binding["metadata"].get("namespace")
        ref = binding["roleRef"]
        role = roles.get((ref["kind"], ref["name"], namespace if ref["kind"] == "Role" else None))
        if role is None:
            continue  # a built-in role: test_kube_scheduler_gets_only_built_in_roles
        for subject in binding["subjects"]:
            assert subject["kind"] == "ServiceAccount", subject
            for rule in role["rules"]:
                assert not rule.get("resourceNames") and not rule.get("nonResourceURLs"), rule
                for group in rule["apiGroups"]:
                    for resource in rule["resources"]:
                        rights[subject["name"]][(group, resource, namespace)] |= set(rule["verbs"])
    return rights


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_only_the_binder_has_rules_and_exactly_the_list(variant: str) -> None:
    objects = render(VARIANTS[variant])
    rights = rights_by_service_account(objects)
    dra = DRA_RIGHTS if VARIANTS[variant].get("gpuApi") == "dra" else {}
    assert {name: dict(r) for name, r in rights.items()} == {
        component("binder"): {**BINDER_RIGHTS, **dra}
    }


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_chart_role_is_bound_to_the_binder_only(variant: str) -> None:
    objects = render(VARIANTS[variant])
    chart_roles = {
        (r["kind"], r["metadata"]["name"])
        for r in of_kind(objects, "Role") + of_kind(objects, "ClusterRole")
    }
    for binding in of_kind(objects, "RoleBinding") + of_kind(objects, "ClusterRoleBinding"):
        if (binding["roleRef"]["kind"], binding["roleRef"]["name"]) in chart_roles:
            assert binding["subjects"] == [
                {"kind": "ServiceAccount", "name": component("binder"), "namespace": NAMESPACE}
            ]


def test_kube_scheduler_gets_only_built_in_roles() -> None:
    objects = render(VARIANTS["extender"])
    bound: set[tuple[str, str, str | None]] = set()
    for binding in of_kind(objects, "RoleBinding") + of_kind(objects, "ClusterRoleBinding"):
        if binding["subjects"][0]["name"] != component("scheduler"):
            continue
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": component("scheduler"), "namespace": NAMESPACE}
        ]
        ref = binding["roleRef"]
        bound.add((ref["kind"], ref["name"], binding["metadata"].get("namespace")))
    assert bound == KUBE_SCHEDULER_ROLES


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_only_the_binder_and_kube_scheduler_mount_a_token(variant: str) -> None:
    objects = render(VARIANTS[variant])
    with_token = {component("binder"), component("scheduler")}
    for account in of_kind(objects, "ServiceAccount"):
        name = account["metadata"]["name"]
        assert account["automountServiceAccountToken"] is (name in with_token), name
    for container in containers(objects):
        pod = container.pod
        account_name = pod.get("serviceAccountName")
        mounts = pod.get("automountServiceAccountToken", account_name in with_token)
        assert mounts is (account_name in with_token), container.where


def test_the_rights_check_sees_an_extra_verb() -> None:
    """A rule added to the binder's ClusterRole shows up in what the test above compares."""
    objects = list(render({}))
    (role,) = [r for r in of_kind(objects, "ClusterRole")]
    widened = {
        **role,
        "rules": [*role["rules"], {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}],
    }
    objects[objects.index(role)] = widened
    rights = rights_by_service_account(tuple(objects))
    assert rights[component("binder")][("", "secrets", None)] == {"get"}
