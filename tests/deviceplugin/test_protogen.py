"""The committed v1beta1 stubs are what the proto generates, and speak the kubelet's API."""

from __future__ import annotations

import pytest

from services.deviceplugin import protogen
from services.deviceplugin._proto import api_pb2


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
