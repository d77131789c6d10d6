"""Pod spec, annotations and labels into PodPending, or field-precise reasons it is invalid."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from shared.kubeobjects import Pod
from shared.messages.pods import ContainerRequest, PlacementHints, PodPending
from shared.podspec import InvalidPod, parse_pending
from tests.binder.builders import container, pod


def parsed(body: dict[str, Any], uid: str = "uid-1") -> PodPending | InvalidPod:
    body["metadata"] |= {
        "uid": uid,
        "resourceVersion": "7",
        "creationTimestamp": "2024-05-01T12:00:00Z",
    }
    return parse_pending(msgspec.convert(body, Pod))


def valid(body: dict[str, Any]) -> PodPending:
    result = parsed(body)
    assert isinstance(result, PodPending), getattr(result, "message", result)
    return result


def test_a_shared_gpu_pod_with_every_hint() -> None:
    result = valid(
        pod(
            "train",
            container("trainer", gpu=2, memory=8192, cores=30, cpu="1500m", ram="3Gi"),
            container("sidecar", cpu="100m", ram="128Mi"),
            namespace="ml",
            priority=1000,
            annotations={
                "tessera.dev/gpu-policy": "colocate",
                "tessera.dev/node-policy": "fgd",
                "tessera.dev/gpu-model": "A100 | H100",
                "tessera.dev/gpu-model-exclude": "T4,V100",
                "tessera.dev/gpu-type": "virtual",
                "tessera.dev/group": "research",
                "unrelated.example/x": "kept out",
            },
            labels={"tessera.dev/tenant": "lab", "tessera.dev/priority": "-3"},
        )
    )
    assert result.containers == (
        ContainerRequest(
            name="trainer",
            gpu_shares=2,
            gpu_memory_mib=8192,
            gpu_cores=30,
            cpu_milli=1500,
            memory_mib=3072,
            resources={
                "tessera.dev/gpu": 2,
                "tessera.dev/gpu-memory": 8192,
                "tessera.dev/gpu-cores": 30,
            },
        ),
        ContainerRequest(name="sidecar", cpu_milli=100, memory_mib=128),
    )
    assert result.hints == PlacementHints(
        gpu_policy="colocate",
        node_policy="fgd",
        gpu_models=("A100", "H100"),
        gpu_models_excluded=("T4", "V100"),
        gpu_type="virtual",
        group="research",
        tenant="lab",
        priority_label=-3,
    )
    assert (result.uid, result.namespace, result.name, result.priority) == (
        "uid-1",
        "ml",
        "train",
        1000,
    )
    assert result.resource_version == "7"
    assert result.created_at == 1_714_564_800.0


@pytest.mark.parametrize(
    ("body", "check"),
    [
        pytest.param(
            pod("whole", container(gpu=4)),
            lambda p: p.containers[0].gpu_shares == 4 and p.containers[0].gpu_memory_mib is None,
            id="whole-gpus",
        ),
        pytest.param(
            pod("pct", container(gpu=1, percentage=50)),
            lambda p: p.containers[0].gpu_memory_pct == 50,
            id="memory-percentage",
        ),
        pytest.param(
            pod("cpu-only", container(cpu="2", ram="1G")),
            lambda p: p.containers[0].gpu_shares == 0 and p.containers[0].memory_mib == 954,
            id="non-gpu-pod",
        ),
        pytest.param(
            pod("tenant", container(gpu=1), namespace="team-b"),
            lambda p: p.namespace == "team-b" and p.hints.tenant == "" and p.priority == 0,
            id="no-tenant-label",
        ),
        pytest.param(
            pod(
                "wide",
                *(container(f"gpu-{i}", gpu=1, memory=256) for i in range(64)),
                *(container(f"cpu-{i}") for i in range(8)),
            ),
            lambda p: sum(1 for c in p.containers if c.gpu_shares) == 64,
            id="64-gpu-containers-and-more-without",
        ),
        pytest.param(
            pod("ours", container(gpu=1), annotations={"tessera.dev/assignment": "{}"}),
            lambda p: p.containers[0].gpu_shares == 1,
            id="annotations-tessera-writes-are-ignored",
        ),
        pytest.param(
            pod("physical", container(gpu=2), annotations={"tessera.dev/gpu-type": "physical"}),
            lambda p: p.hints.gpu_type == "physical",
            id="physical-whole-gpus",
        ),
    ],
)
def test_valid_requests(body: dict[str, Any], check: Any) -> None:
    assert check(valid(body))


C0 = "spec.containers[0].resources.limits"


@pytest.mark.parametrize(
    ("body", "messages"),
    [
        pytest.param(
            pod("p", container(memory=4096)),
            [f"{C0}[tessera.dev/gpu-memory] (container 'main'): needs tessera.dev/gpu"],
            id="memory-without-gpu",
        ),
        pytest.param(
            pod("p", container(gpu=1, cores=150)),
            [f"{C0}[tessera.dev/gpu-cores] (container 'main'): 150 is not allowed; use 1..100"],
            id="cores-over-100",
        ),
        pytest.param(
            pod("p", container(gpu=1, cores=0)),
            [f"{C0}[tessera.dev/gpu-cores] (container 'main'): 0 is not allowed; use 1..100"],
            id="cores-zero",
        ),
        pytest.param(
            pod("p", container(gpu=1, memory=1024, percentage=10)),
            [
                "give GPU memory either as tessera.dev/gpu-memory (MiB) or as "
                "tessera.dev/gpu-memory-percentage, not both"
            ],
            id="memory-and-percentage",
        ),
        pytest.param(
            pod("p", container(gpu=1, percentage=101)),
            [
                "[tessera.dev/gpu-memory-percentage] (container 'main'): 101 is not allowed; "
                "use 1..100"
            ],
            id="percentage-over-100",
        ),
        pytest.param(
            pod("p", container(gpu=0, memory=10)),
            [
                f"{C0}[tessera.dev/gpu] (container 'main'): must be at least 1 when "
                "tessera.dev/gpu-memory is set"
            ],
            id="zero-shares-with-a-slice",
        ),
        pytest.param(
            pod("p", container(extra={"tessera.dev/gpu-mem": "4"})),
            [
                f"{C0}[tessera.dev/gpu-mem] (container 'main'): unknown Tessera resource; "
                "known: tessera.dev/gpu, tessera.dev/gpu-memory"
            ],
            id="unknown-resource",
        ),
        pytest.param(
            pod("p", annotations={"tessera.dev/gpu-policy": "fastest"}),
            [
                "metadata.annotations[tessera.dev/gpu-policy]: 'fastest' is not one of binpack, "
                "spread, colocate"
            ],
            id="unknown-gpu-policy",
        ),
        pytest.param(
            pod("p", annotations={"tessera.dev/node-policy": "random"}),
            [
                "metadata.annotations[tessera.dev/node-policy]: 'random' is not one of binpack, "
                "spread, fgd, balanced"
            ],
            id="unknown-node-policy",
        ),
        pytest.param(
            pod("p", annotations={"tessera.dev/gpu-type": "shared"}),
            [
                "metadata.annotations[tessera.dev/gpu-type]: 'shared' is not one of physical, "
                "virtual"
            ],
            id="unknown-gpu-type",
        ),
        pytest.param(
            pod("p", annotations={"tessera.dev/gpu-model": "A100||H100"}),
            [
                "metadata.annotations[tessera.dev/gpu-model]: 'A100||H100' must list GPU models "
                "separated by '|'"
            ],
            id="malformed-model-list",
        ),
        pytest.param(
            pod(
                "p",
                annotations={
                    "tessera.dev/gpu-model": "A100|H100",
                    "tessera.dev/gpu-model-exclude": "H100",
                },
            ),
            [
                "metadata.annotations[tessera.dev/gpu-model-exclude]: excludes H100, which "
                "tessera.dev/gpu-model requires"
            ],
            id="model-required-and-excluded",
        ),
        pytest.param(
            pod("p", annotations={"tessera.dev/gpu-polcy": "spread"}),
            ["metadata.annotations[tessera.dev/gpu-polcy]: unknown Tessera annotation"],
            id="annotation-typo",
        ),
        pytest.param(
            pod("p", annotations={"tessera.dev/group": "  "}),
            ["metadata.annotations[tessera.dev/group]: must name a resource group"],
            id="empty-group",
        ),
        pytest.param(
            pod("p", labels={"tessera.dev/priority": "high"}),
            ["metadata.labels[tessera.dev/priority]: 'high' is not an integer"],
            id="priority-label-not-integer",
        ),
        pytest.param(
            pod(
                "p", container(gpu=1, memory=4096), annotations={"tessera.dev/gpu-type": "physical"}
            ),
            ["tessera.dev/gpu-type: physical takes whole GPUs; remove tessera.dev/gpu-memory"],
            id="physical-with-a-slice",
        ),
        pytest.param(
            pod("p", container(gpu=1), annotations={"tessera.dev/gpu-type": "virtual"}),
            ["tessera.dev/gpu-type: virtual needs a slice per share"],
            id="virtual-without-a-slice",
        ),
        pytest.param(
            pod("p", container(gpu=1), init_containers=[container("init", gpu=1)]),
            [
                "spec.initContainers[0].resources.limits[tessera.dev/gpu] (container 'init'): "
                "init containers cannot ask for Tessera GPUs"
            ],
            id="init-container-gpu",
        ),
        pytest.param(
            pod("p", container(gpu=1, cores=500), annotations={"tessera.dev/gpu-policy": "nope"}),
            [
                "tessera.dev/gpu-cores] (container 'main'): 500 is not allowed",
                "tessera.dev/gpu-policy]: 'nope' is not one of",
            ],
            id="every-problem-at-once",
        ),
        pytest.param(
            pod("p", *(container(f"c{i}", gpu=1, memory=256) for i in range(65))),
            [
                "spec.containers: 65 containers ask for tessera.dev/gpu; at most 64 per pod can "
                "be handed GPUs"
            ],
            id="more-gpu-containers-than-a-record-holds",
        ),
    ],
)
def test_invalid_requests_name_the_field_and_what_is_allowed(
    body: dict[str, Any], messages: list[str]
) -> None:
    result = parsed(body)
    assert isinstance(result, InvalidPod)
    for message in messages:
        assert message in result.message
    assert (result.uid, result.namespace, result.name) == ("uid-1", "default", "p")


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        pytest.param(
            "2000m",
            "'2000m' means 2 (m is thousandths), but tessera.dev/gpu-memory counts MiB and takes "
            "a plain number; for 2000 MiB write 2000",
            id="milli",
        ),
        pytest.param(
            "2500000u",
            "'2500000u' means 2.5 (u is millionths), but tessera.dev/gpu-memory counts MiB and "
            "takes a plain number; for 2500000 MiB write 2500000",
            id="micro",
        ),
        pytest.param(
            "2e-3",
            "'2e-3' means 0.002 (a fraction), but tessera.dev/gpu-memory counts MiB and takes a "
            "plain number",
            id="negative-exponent",
        ),
        pytest.param(
            "2000000",
            "asks 2000000 MiB per GPU; no GPU has more than 1048576 MiB (1 TiB)",
            id="above-1-tib",
        ),
        pytest.param(
            "2M",  # how the API server stores 2000000
            "asks 2000000 MiB per GPU; no GPU has more than 1048576 MiB (1 TiB)",
            id="above-1-tib-canonical",
        ),
    ],
)
def test_gpu_memory_in_fractions_or_beyond_any_gpu_is_refused(value: str, problem: str) -> None:
    result = parsed(pod("p", container(gpu=1, extra={"tessera.dev/gpu-memory": value})))
    assert isinstance(result, InvalidPod)
    assert result.message == f"{C0}[tessera.dev/gpu-memory] (container 'main'): {problem}"


@pytest.mark.parametrize("value", ["1048576", "1e3", "2k", 4096])
def test_gpu_memory_up_to_1_tib_in_any_whole_form_is_taken(value: str | int) -> None:
    result = parsed(pod("p", container(gpu=1, extra={"tessera.dev/gpu-memory": value})))
    assert not isinstance(result, InvalidPod), result.message


@pytest.mark.parametrize(
    ("value", "write"), [("1Gi", 1024), ("512Mi", 512), ("1536Mi", 1536), ("1Ti", 1048576)]
)
def test_gpu_memory_with_a_unit_says_it_counts_mib(value: str, write: int) -> None:
    result = parsed(pod("p", container(gpu=1, extra={"tessera.dev/gpu-memory": value})))
    assert isinstance(result, InvalidPod)
    assert result.message == (
        f"{C0}[tessera.dev/gpu-memory] (container 'main'): {value!r} has a unit, but "
        f"tessera.dev/gpu-memory counts MiB and takes a plain number; for {value} write {write}"
    )


def test_gpu_memory_in_plain_numbers_and_exponents_is_mib() -> None:
    # The API server stores a plain 2000 as "2k" and 1000000 as "1M" (its canonical form).
    for value, mib in (("4096", 4096), (4096, 4096), ("4e3", 4000), ("2k", 2000), ("1M", 10**6)):
        request = valid(pod("p", container(gpu=1, extra={"tessera.dev/gpu-memory": value})))
        assert request.containers[0].gpu_memory_mib == mib


def test_fractional_extended_resources_are_refused() -> None:
    body = pod("p", container(extra={"tessera.dev/gpu": 1.5}))
    result = parsed(body)
    assert isinstance(result, InvalidPod)
    assert "[tessera.dev/gpu] (container 'main'): 1.5 is not allowed" in result.message
