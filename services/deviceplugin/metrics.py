"""Prometheus metrics of the device plugin (the only module of it that imports prometheus_client).

Registered on the service's own registry (``ServiceContext.registry``), served at ``/metrics``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


@dataclass(frozen=True)
class PluginMetrics:
    """Allocate outcomes and latency, advertised devices, kubelet registrations, records held
    and the age of the inventory in use."""

    allocations: Counter
    allocate_seconds: Histogram
    cas_conflicts: Counter
    records_reread: Counter
    devices: Gauge
    registrations: Counter
    registered: Gauge
    records: Gauge
    inventory_age_seconds: Gauge
    grant_file_failures: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> PluginMetrics:
        return cls(
            allocations=Counter(
                "tessera_deviceplugin_allocations_total",
                "Containers answered by Allocate, by outcome (granted, or the refusal kind).",
                ["outcome"],
                registry=registry,
            ),
            allocate_seconds=Histogram(
                "tessera_deviceplugin_allocate_seconds",
                "Time to answer one Allocate call, the record's write included.",
                buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1.0, 5.0),
                registry=registry,
            ),
            cas_conflicts=Counter(
                "tessera_deviceplugin_record_conflicts_total",
                "Record writes lost to a concurrent writer (re-read and planned again).",
                registry=registry,
            ),
            records_reread=Counter(
                "tessera_deviceplugin_records_reread_total",
                "Allocates that found a record only by reading the bucket afresh (the records "
                "watch had not delivered it: a silent watch on a NATS cluster).",
                registry=registry,
            ),
            devices=Gauge(
                "tessera_deviceplugin_devices",
                "Devices advertised to the kubelet, by health.",
                ["health"],
                registry=registry,
            ),
            registrations=Counter(
                "tessera_deviceplugin_registrations_total",
                "Successful registrations with the kubelet (one more after each kubelet restart).",
                registry=registry,
            ),
            registered=Gauge(
                "tessera_deviceplugin_registered",
                "1 while the plugin is registered with its node's kubelet and serving, else 0.",
                registry=registry,
            ),
            records=Gauge(
                "tessera_deviceplugin_records",
                "Assignment records of this node held for Allocate, by state.",
                ["state"],
                registry=registry,
            ),
            inventory_age_seconds=Gauge(
                "tessera_deviceplugin_inventory_age_seconds",
                "Seconds since the inventory in use was observed (NaN before the first).",
                registry=registry,
            ),
            grant_file_failures=Counter(
                "tessera_deviceplugin_grant_file_failures_total",
                "Writes of the state file of granted records that failed (a restart would not "
                "know those grants).",
                registry=registry,
            ),
        )

    def count_records_with(self, states: Callable[[], Iterable[str]]) -> None:
        """Count the records held by state when scraped (nothing to do on each change)."""

        def counter(state: str) -> Callable[[], float]:
            return lambda: float(sum(1 for held in states() if held == state))

        for state in ("reserved", "bound", "allocated"):
            self.records.labels(state=state).set_function(counter(state))

    def count_devices(self, healthy: int, unhealthy: int) -> None:
        self.devices.labels(health="Healthy").set(healthy)
        self.devices.labels(health="Unhealthy").set(unhealthy)
