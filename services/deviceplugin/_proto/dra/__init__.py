"""The kubelet's DRA plugin API, by version."""
