"""Generated stubs of the kubelet's DRA plugin API (package k8s.io.kubelet.pkg.apis.dra.v1)."""
