"""The committed stubs are what the protos generate, and speak the kubelet's APIs: the device
plugin API (v1beta1), the DRA plugin API (v1) and plugin registration (v1)."""

from __future__ import annotations

from typing import Any

import pytest

from services.deviceplugin import protogen
from services.deviceplugin._proto import api_pb2
from services.deviceplugin._proto.dra.v1 import api_pb2 as dra_pb2
from services.deviceplugin._proto.dra.v1 import api_pb2_grpc as dra_grpc
from services.deviceplugin._proto.pluginregistration.v1 import api_pb2 as registration_pb2
from services.deviceplugin._proto.pluginregistration.v1 import api_pb2_grpc as registration_grpc


def test_regeneration_reproduces_the_committed_files() -> None:
    assert protogen.differences() == []


def test_check_command_reports_up_to_date(capsys: pytest.CaptureFixture[str]) -> None:
    assert protogen.main(["--check"]) == 0
    assert capsys.readouterr().out.strip() == "generated files are up to date"


def test_services_and_field_numbers_match_the_kubelet_api() -> None:
    package = api_pb2.DESCRIPTOR
    assert package.package == "v1beta1"
    assert set(package.services_by_name) == {"Registration", "DevicePlugin"}
    assert [m.name for m in package.services_by_name["DevicePlugin"].methods] == [
        "GetDevicePluginOptions",
        "ListAndWatch",
        "GetPreferredAllocation",
        "Allocate",
        "PreStartContainer",
    ]
    numbers = {
        name: {f.name: f.number for f in message.fields}
        for name, message in package.message_types_by_name.items()
    }
    assert numbers["RegisterRequest"] == {
        "version": 1,
        "endpoint": 2,
        "resource_name": 3,
        "options": 4,
    }
    assert numbers["Device"] == {"ID": 1, "health": 2, "topology": 3}
    assert numbers["ContainerPreferredAllocationRequest"] == {
        "available_deviceIDs": 1,
        "must_include_deviceIDs": 2,
        "allocation_size": 3,
    }
    assert numbers["ContainerAllocateResponse"] == {
        "envs": 1,
        "mounts": 2,
        "devices": 3,
        "annotations": 4,
        "cdi_devices": 5,
    }
    assert numbers["Mount"] == {"container_path": 1, "host_path": 2, "read_only": 3}
    assert numbers["DeviceSpec"] == {"container_path": 1, "host_path": 2, "permissions": 3}
    assert numbers["DevicePluginOptions"] == {
        "pre_start_required": 1,
        "get_preferred_allocation_available": 2,
    }


def _field_numbers(package: Any) -> dict[str, dict[str, int]]:
    messages = package.message_types_by_name
    return {name: {f.name: f.number for f in m.fields} for name, m in messages.items()}


def test_the_dra_api_keeps_the_kubelet_s_package_methods_and_field_numbers() -> None:
    """The package line is the upstream one: it is the method path a kubelet calls."""
    package = dra_pb2.DESCRIPTOR
    assert package.package == "k8s.io.kubelet.pkg.apis.dra.v1"
    service = package.services_by_name["DRAPlugin"]
    assert service.full_name == "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
    assert [m.name for m in service.methods] == ["NodePrepareResources", "NodeUnprepareResources"]
    numbers = _field_numbers(package)
    assert numbers["Claim"] == {"namespace": 1, "uid": 2, "name": 3}
    assert numbers["Device"] == {
        "request_names": 1,
        "pool_name": 2,
        "device_name": 3,
        "cdi_device_ids": 4,
        "share_id": 5,
    }
    assert numbers["NodePrepareResourceResponse"] == {"devices": 1, "error": 2}
    assert numbers["NodeUnprepareResourceResponse"] == {"error": 1}
    assert numbers["NodePrepareResourcesRequest"] == {"claims": 1}
    assert numbers["NodePrepareResourcesResponse"] == {"claims": 1}
    share = package.message_types_by_name["Device"].fields_by_name["share_id"]
    assert share.has_presence, "share_id is proto3 optional: unset and empty differ"
    assert hasattr(dra_grpc, "DRAPluginStub") and hasattr(dra_grpc, "DRAPluginServicer")


def test_plugin_registration_keeps_its_unversioned_package() -> None:
    package = registration_pb2.DESCRIPTOR
    assert package.package == "pluginregistration"
    service = package.services_by_name["Registration"]
    assert service.full_name == "pluginregistration.Registration"
    assert [m.name for m in service.methods] == ["GetInfo", "NotifyRegistrationStatus"]
    numbers = _field_numbers(package)
    assert numbers["PluginInfo"] == {
        "type": 1,
        "name": 2,
        "endpoint": 3,
        "supported_versions": 4,
    }
    assert numbers["RegistrationStatus"] == {"plugin_registered": 1, "error": 2}
    assert hasattr(registration_grpc, "RegistrationStub")
