"""Tessera's shared library: wire contracts, codec, config, clock and the service runtime.

Everything services agree on lives here; services never import each other.
"""
