"""Device plugin (DaemonSet): the kubelet's v1beta1 gRPC API and the exact Allocate hand-off."""
