"""The kubelet's plugin registration API, by version."""
