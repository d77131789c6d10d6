"""Generated stubs of the kubelet's plugin registration API (package pluginregistration)."""
