"""The webhook refuses a scheduling constraint Tessera does not implement, naming the field, for
pods Tessera places itself; kube-scheduler's pods (extender mode) keep what it implements."""

from __future__ import annotations

from typing import Any

from services.webhook.admission import AdmissionPolicy, BadReview, validate
from tests.binder.builders import container, pod
from tests.webhook.test_admission import request_of

FUTURE_OPERATOR = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "gen", "operator": "Newer", "values": ["3"]}]}
            ]
        }
    }
}


def with_spec(scheduler: str, **spec: Any) -> dict[str, Any]:
    body = pod("p", container(gpu=1, memory=4096), scheduler=scheduler)
    body["spec"] |= spec
    return body


def test_an_operator_kubernetes_adds_later_is_refused_naming_the_field() -> None:
    review = validate(request_of(with_spec("tessera", affinity=FUTURE_OPERATOR)), AdmissionPolicy())
    assert not isinstance(review, BadReview)
    assert review.outcome == "denied"
    field = (
        "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
        ".nodeSelectorTerms[0].matchExpressions[0].operator"
    )
    assert review.reasons == (field,)
    status = review.answer.response.status
    assert status is not None and status.code == 422
    assert status.message == (
        f"Tessera cannot place this pod as written: {field}: 'Newer' is not implemented by "
        "Tessera; known: In, NotIn, Exists, DoesNotExist, Gt, Lt"
    )


def test_constraints_tessera_implements_are_admitted() -> None:
    body = with_spec(
        "tessera",
        nodeSelector={"kubernetes.io/hostname": "node-1"},
        tolerations=[{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        topologySpreadConstraints=[
            {
                "maxSkew": 1,
                "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"app": "x"}},
            }
        ],
        schedulingGates=[{"name": "example.com/wait"}],
    )
    review = validate(request_of(body), AdmissionPolicy())
    assert not isinstance(review, BadReview) and review.outcome == "allowed"


def test_an_extender_scheduler_s_pod_keeps_what_kube_scheduler_implements() -> None:
    policy = AdmissionPolicy(extender_scheduler_names=("default-scheduler",))
    body = with_spec("default-scheduler", affinity=FUTURE_OPERATOR)
    review = validate(request_of(body), policy)
    assert not isinstance(review, BadReview) and review.outcome == "allowed"
