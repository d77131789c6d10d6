"""Tessera as a Kubernetes DRA driver, ``gpu.tessera.dev`` (docs/design.md §14), as pure rules.

``devices``: what a GPU is as a DRA device (name, attributes, capacities and their request
policy); ``cel``: the selectors users write on those devices, evaluated as Kubernetes does;
``claims``: a pod's ResourceClaims turned into what the placement core judges, or the reasons
Tessera cannot honour them. The binder, the placer and the node plugin all read these, so a
device means the same to the one that publishes it, the one that places on it and the one that
prepares it.
"""
