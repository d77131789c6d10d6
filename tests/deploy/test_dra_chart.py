"""The chart's DRA mode: off by default; on, the DeviceClass gpu.tessera.dev (valid against the
newest strict schemas) and the binder's DRA rights, exactly these and nothing more."""

from __future__ import annotations

import kubernetes_validate

from tests.deploy.chart import component, named, of_kind, render
from tests.deploy.test_rbac import BINDER_RIGHTS, rights_by_service_account

DRA_RIGHTS: dict[tuple[str, str, str | None], set[str]] = {
    ("resource.k8s.io", "resourceclaims", None): {"get", "list", "watch", "patch"},
    ("resource.k8s.io", "resourceclaims/status", None): {"update", "patch"},
    ("resource.k8s.io", "resourceclaims/binding", None): {"update", "patch"},
    ("resource.k8s.io", "resourceslices", None): {"list", "create", "update", "delete"},
}


def test_dra_mode_is_off_by_default() -> None:
    objects = render({})
    assert of_kind(objects, "DeviceClass") == []
    rights = rights_by_service_account(objects)[component("binder")]
    assert not any(group == "resource.k8s.io" for group, _, _ in rights)


def test_dra_mode_brings_the_device_class_and_the_binders_claim_rights() -> None:
    objects = render({"dra": {"enabled": True}})
    device_class = named(objects, "DeviceClass", "gpu.tessera.dev")
    assert device_class["spec"]["selectors"] == [
        {"cel": {"expression": 'device.driver == "gpu.tessera.dev"'}}
    ]
    kubernetes_validate.validate(device_class, kubernetes_validate.latest_version(), strict=True)
    rights = rights_by_service_account(objects)
    assert {name: dict(r) for name, r in rights.items()} == {
        component("binder"): {**BINDER_RIGHTS, **DRA_RIGHTS}
    }
