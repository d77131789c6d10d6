"""What the webhook knows of the cluster's GPUs: each node's, from its believed inventory."""

from __future__ import annotations

from services.webhook.capacity import ClusterGpus
from shared import codec
from tests.harness.wire import NOW, gpu, inventory


def test_the_cluster_is_each_node_s_believed_gpus_once_every_inventory_was_read() -> None:
    cluster = ClusterGpus()
    a100 = inventory(gpu(0, model="A100", memory_mib=81920), gpu(1, uuid="G1"), node="gpu-1.x")
    assert cluster.apply("gpu-1_x", codec.encode(a100), now=NOW) == ""
    assert cluster.nodes() == frozenset(), "nothing is judged before the initial values are read"
    cluster.synced = True
    assert cluster.nodes() == {(("A100", 16384), ("A100", 81920))}

    elsewhere = inventory(gpu(0, memory_mib=10**9), node="gpu-2")
    assert "on the subject or key of node 'gpu-1.x'" in cluster.apply(
        "gpu-1_x", codec.encode(elsewhere), now=NOW
    )
    assert "does not decode" in cluster.apply("gpu-3", b"{", now=NOW)
    too_big = inventory(gpu(0, memory_mib=2 << 20), node="gpu-3")
    assert "MiB" in cluster.apply("gpu-3", codec.encode(too_big), now=NOW)
    assert cluster.nodes() == {(("A100", 16384), ("A100", 81920))}, "kept what it had"

    cluster.apply("gpu-1_x", None, now=NOW)
    assert cluster.nodes() == frozenset() and len(cluster) == 0
    cluster.apply("gpu-1_x", codec.encode(a100), now=NOW)
    cluster.restart()
    assert cluster.nodes() == frozenset() and not cluster.synced
