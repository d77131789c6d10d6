"""The service shell every Tessera service shares: bus, edge decoding, health, metrics, lifecycle.

This is the only part of ``shared`` that imports I/O libraries (nats, aiohttp, prometheus_client).
"""
