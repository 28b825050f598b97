"""Prometheus metrics, in a registry per app (so tests can build many apps)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)

GaugeSource = Callable[[], dict[str, float]]


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "corral_http_requests_total",
            "HTTP requests by method, route and status.",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "corral_http_request_seconds",
            "HTTP request latency by route.",
            ["method", "route"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.invocations = Counter(
            "corral_invocations_total",
            "Invocations answered by the gateway, by kind and final status.",
            ["kind", "status"],
            registry=self.registry,
        )
        self.node_executions = Counter(
            "corral_node_executions_total",
            "Executions stored by this process's node agent, by runtime and status.",
            ["runtime", "status"],
            registry=self.registry,
        )
        self._gauges = _Gauges()
        self.registry.register(self._gauges)

    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None:
        self.requests.labels(method, route, str(status)).inc()
        self.latency.labels(method, route).observe(seconds)

    def gauge(self, name: str, doc: str, source: GaugeSource, label: str) -> None:
        """Register a gauge family read from ``source()`` at scrape time."""
        self._gauges.add(name, doc, source, label)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _Gauges(Collector):
    def __init__(self) -> None:
        self._sources: list[tuple[str, str, GaugeSource, str]] = []
        self.cached: dict[str, dict[str, float]] = {}

    def add(self, name: str, doc: str, source: GaugeSource, label: str) -> None:
        self._sources.append((name, doc, source, label))

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())

    def collect(self) -> Iterator[GaugeMetricFamily]:
        for name, doc, source, label in self._sources:
            family = GaugeMetricFamily(name, doc, labels=[label])
            for key, value in source().items():
                family.add_metric([key], value)
            yield family
