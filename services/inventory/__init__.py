"""Inventory service (DaemonSet): NVML telemetry and GPU health, published to NATS."""
