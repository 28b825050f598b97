"""Prometheus metrics, in a registry per app (so tests can build many apps)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

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
        self.dispatch_failures = Counter(
            "corral_dispatch_failures_total",
            "Jobs committed but not dispatched at once (the reconciler sends them).",
            registry=self.registry,
        )
        self.recorder = Counter(
            "corral_recorder_events_total",
            "Node results by what the recorder did: stored, superseded (an older claim or a "
            "final row), retried (a write failed and is tried again), dead_lettered (its "
            "write failed record_tries times: kept in dead_letters, its invocation errored).",
            ["outcome"],
            registry=self.registry,
        )
        self.reconciler = Counter(
            "corral_reconciler_total",
            "Reconciler passes and what they did: reissued (handed out again), failed (lost).",
            ["action"],
            registry=self.registry,
        )
        self.throttled = Counter(
            "corral_throttled_total",
            "Requests a tenant's quota delayed (waited for a token or a concurrency slot) or "
            "refused (429), by tenant, quota and outcome (app/quotas/throttles.py).",
            ["tenant", "quota", "outcome"],
            registry=self.registry,
        )
        self.leader_runs = Counter(
            "corral_leader_job_runs_total",
            "Runs of the leader's jobs (app/leader.py) on this gateway, by job and outcome: "
            "ok, failed, cancelled (the lead was lost or the gateway stopped).",
            ["job", "outcome"],
            registry=self.registry,
        )
        self.leader_seconds = Histogram(
            "corral_leader_job_seconds",
            "How long each run of a leader's job took, by job.",
            ["job"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self._gauges = _Gauges()
        self.registry.register(self._gauges)
        self._others: list[CollectorRegistry] = []
        # labelled children by their labels: ``labels()`` takes a lock and builds its key
        # on every call, and the request path counts three series per call (bounded: the
        # routes are templates, the statuses and kinds few)
        self._children: dict[tuple[Any, ...], Any] = {}

    def _child(self, metric: Any, *values: str) -> Any:
        key = (id(metric), *values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None:
        self._child(self.requests, method, route, str(status)).inc()
        self._child(self.latency, method, route).observe(seconds)

    def count_invocation(self, kind: str, status: str) -> None:
        """An invocation answered, by kind and final status."""
        self._child(self.invocations, kind, status).inc()

    def gauge(self, name: str, doc: str, source: GaugeSource, label: str) -> None:
        """Register a gauge family read from ``source()`` at scrape time."""
        self._gauges.add(name, doc, source, label)

    def include(self, registry: CollectorRegistry) -> None:
        """Serve another registry's metrics too (an embedded node's)."""
        self._others.append(registry)

    def render(self) -> bytes:
        return b"".join(generate_latest(r) for r in (self.registry, *self._others))


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
