"""A simulated Kubernetes cluster for development and tests (not part of the product install).

``apiserver``: the Kubernetes API test double (aiohttp; no Kubernetes client library). The
simulated kubelets of ``tessera up`` build on it.
"""
