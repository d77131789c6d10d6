"""The API double calls admission webhooks on updates as the API server does: with who asks and
the old object, and without losing a write made while the webhooks were called."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tessera.devcluster.apiserver import ApiServer, User
from tessera.devcluster.certs import make_serving_certificate
from tessera.devcluster.resources import POD, Obj
from tessera.up.system import register_webhook
from tests.binder.builders import container, pod
from tests.devcluster.conftest import Clients


class Recorder:
    """A webhook that allows everything and records the reviews; ``during`` runs inside the
    first UPDATE review (a kubelet writing while the webhook is called)."""

    def __init__(self) -> None:
        self.reviews: list[Obj] = []
        self.during: Any = None

    async def handle(self, request: web.Request) -> web.Response:
        review = (await request.json())["request"]
        self.reviews.append(review)
        if review["operation"] == "UPDATE" and self.during is not None:
            self.during, during = None, self.during
            during()
        return web.json_response(
            {
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "response": {"uid": review["uid"], "allowed": True},
            }
        )


@pytest.fixture
async def recorder(api: ApiServer, tmp_path: Path) -> AsyncIterator[Recorder]:
    certificate = make_serving_certificate(tmp_path / "tls", ["127.0.0.1"])
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certificate.cert_file, certificate.key_file)
    recorder = Recorder()
    app = web.Application()
    for path in ("mutate", "validate"):
        app.router.add_post(f"/{path}", recorder.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    register_webhook(api, f"https://127.0.0.1:{port}", ca_pem=certificate.ca_pem)
    try:
        yield recorder
    finally:
        await runner.cleanup()


async def test_an_update_meets_the_webhooks_with_who_asks_and_the_old_object(
    api: ApiServer, k8s: Clients, recorder: Recorder
) -> None:
    api.create(POD, pod("p", container(gpu=1)))
    await k8s.core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"a": "b"}}})
    (validating,) = [r for r in recorder.reviews if r["operation"] == "UPDATE"]
    assert validating["userInfo"] == {
        "username": "tessera-dev",
        "groups": ["system:masters", "system:authenticated"],
    }
    assert validating["oldObject"]["metadata"].get("labels") is None
    assert validating["object"]["metadata"]["labels"] == {"a": "b"}
    assert validating["options"]["kind"] == "UpdateOptions"


async def test_a_write_made_while_the_webhooks_are_called_is_not_lost(
    api: ApiServer, k8s: Clients, recorder: Recorder
) -> None:
    """The kubelet sets the pod Running while the binder's patch is being admitted: the patch
    is made again on the pod as it is now, as the API server's GuaranteedUpdate does."""
    api.create(POD, pod("p", container(gpu=1), node="n1"))
    recorder.during = lambda: api.patch(
        POD, "default", "p", {"status": {"phase": "Running"}}, "application/merge-patch+json",
        "status",
    )  # fmt: skip
    await k8s.core.patch_namespaced_pod(
        "p", "default", {"metadata": {"annotations": {"tessera.dev/assigned": "true"}}}
    )
    stored = api.get(POD, "default", "p")
    assert stored["status"]["phase"] == "Running"
    assert stored["metadata"]["annotations"] == {"tessera.dev/assigned": "true"}
    assert len([r for r in recorder.reviews if r["operation"] == "UPDATE"]) == 2


async def test_a_request_is_its_token_s_user_and_an_unknown_token_is_refused(
    tmp_path: Path,
) -> None:
    async with ApiServer(tls=True) as api:
        token = api.add_user(User("alice", ("team-a",)))
        assert api.url.startswith("https://")
        assert api.authenticate(f"Bearer {token}") == User("alice", ("team-a",))
        assert api.authenticate(f"Bearer {api.token}") is not None
        assert api.authenticate("Bearer nope") is None
        assert api.authenticate(None) is None, "anonymous only without an admin token"
    async with ApiServer(token="") as open_api:
        anonymous = open_api.authenticate(None)
        assert anonymous is not None and anonymous.info() == {
            "username": "system:anonymous",
            "groups": ["system:unauthenticated"],
        }
