"""A node's Prometheus metrics, in a registry of its own (served on the node's /metrics)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

GaugeSource = Callable[[], dict[tuple[str, ...], float]]


class NodeMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.executions = Counter(
            "corral_node_executions_total",
            "Executions this node ran, by runtime and outcome.",
            ["runtime", "outcome"],
            registry=self.registry,
        )
        self.claims = Counter(
            "corral_node_claims_total",
            "Claims of deliveries by outcome (ok, stale, taken, gone).",
            ["outcome"],
            registry=self.registry,
        )
        self.transport_retries = Counter(
            "corral_node_transport_retries_total",
            "Transport calls retried after a failure, by operation.",
            ["operation"],
            registry=self.registry,
        )
        self.idle_instance_seconds = Counter(
            "corral_pool_idle_instance_seconds_total",
            "Warm workers held idle (started, unused), in worker-seconds, by pool.",
            ["pool"],
            registry=self.registry,
        )
        self.idle_memory_mb_seconds = Counter(
            "corral_pool_idle_memory_mb_seconds_total",
            "Memory held by idle warm workers, in MB-seconds, by pool.",
            ["pool"],
            registry=self.registry,
        )
        self.pool_starts = Counter(
            "corral_pool_starts_total",
            "Warm workers started, by pool and whether a caller waited (cold).",
            ["pool", "cold"],
            registry=self.registry,
        )
        self._gauges = _Gauges()
        self.registry.register(self._gauges)

    def gauge(self, name: str, doc: str, labels: list[str], source: GaugeSource) -> None:
        """A gauge family read from ``source()`` at scrape time."""
        self._gauges.add(name, doc, labels, source)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _Gauges(Collector):
    def __init__(self) -> None:
        self._sources: list[tuple[str, str, list[str], GaugeSource]] = []

    def add(self, name: str, doc: str, labels: list[str], source: GaugeSource) -> None:
        self._sources.append((name, doc, labels, source))

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())

    def collect(self) -> Iterator[GaugeMetricFamily]:
        for name, doc, labels, source in self._sources:
            family = GaugeMetricFamily(name, doc, labels=labels)
            for values, value in source().items():
                family.add_metric(list(values), value)
            yield family
