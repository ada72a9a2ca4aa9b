"""Replica Prometheus metrics, created once per process on their own registry and passed in.

Names follow DESIGN.md: ``fleetserve_request_duration_seconds{model,stage=queue|compute|total}``,
``fleetserve_batch_size``, ``fleetserve_queue_depth``, ``fleetserve_inflight_requests``,
``fleetserve_requests_total{model,code}`` (code 499: the client disconnected before its answer),
``fleetserve_requests_expired_total`` and ``fleetserve_requests_cancelled_total`` (queued requests dropped unrun
past their deadline or because their caller left). The object doubles as the batcher's ``BatchObserver``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.process_collector import ProcessCollector

# Inference latencies span ~100 µs (tiny model) to seconds (long documents on CPU).
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
# The *_created series double the exposition size and no dashboard here uses them.
disable_created_metrics()

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class ReplicaMetrics:
    def __init__(self, model: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.model = model
        ProcessCollector(registry=self.registry)
        r = self.registry
        self.requests = Counter("fleetserve_requests", "Requests answered, by HTTP/gRPC status code",
                                ["model", "code"], registry=r)
        self.duration = Histogram("fleetserve_request_duration_seconds", "Request time by stage",
                                  ["model", "stage"], buckets=LATENCY_BUCKETS, registry=r)
        self.batch_size = Histogram("fleetserve_batch_size", "Rows per engine call", ["model"],
                                    buckets=BATCH_BUCKETS, registry=r)
        self.batch_seq = Histogram("fleetserve_batch_sequence_length", "Padded sequence length per engine call",
                                   ["model"], buckets=(16, 32, 64, 128, 256, 512, 1024), registry=r)
        self.queue_depth = Gauge("fleetserve_queue_depth", "Rows waiting in the batcher queue", ["model"], registry=r)
        self.inflight = Gauge("fleetserve_inflight_requests", "Requests being handled", ["model"], registry=r)
        self.instances = Gauge("fleetserve_engine_instances", "Engine instances", ["model"], registry=r)
        self.expired = Counter("fleetserve_requests_expired", "Requests whose queue timeout passed before running",
                               ["model"], registry=r)
        self.rejected = Counter("fleetserve_requests_rejected", "Requests refused because the queue was full",
                                ["model"], registry=r)
        self.cancelled = Counter("fleetserve_requests_cancelled", "Queued requests dropped unrun because their "
                                 "client disconnected or cancelled", ["model"], registry=r)
        self.truncated = Counter("fleetserve_texts_truncated", "Texts truncated at the model's maximum length",
                                 ["model"], registry=r)
        self._queue_h = self.duration.labels(model, "queue")
        self._compute_h = self.duration.labels(model, "compute")
        self._total_h = self.duration.labels(model, "total")
        # Visible at 0 before the first one, so a rate() over them starts at the first scrape.
        self._expired = self.expired.labels(model)
        self._cancelled = self.cancelled.labels(model)
        self._batch_h = self.batch_size.labels(model)
        self._seq_h = self.batch_seq.labels(model)

    # BatchObserver
    def on_batch(self, size: int, seq: int, queue_wait_s: list[float], compute_s: float) -> None:
        self._batch_h.observe(size)
        if seq:
            self._seq_h.observe(seq)
        for wait in queue_wait_s:
            self._queue_h.observe(wait)
            self._compute_h.observe(compute_s)

    def on_expired(self, n: int) -> None:
        self._expired.inc(n)

    def on_rejected(self) -> None:
        self.rejected.labels(self.model).inc()

    def on_cancelled(self, n: int) -> None:
        self._cancelled.inc(n)

    def observe_request(self, code: int | str, seconds: float) -> None:
        self.requests.labels(self.model, str(code)).inc()
        self._total_h.observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class EngineMetrics:
    """The engine process's own metrics with ``serve --frontends N``: the engine calls it made from the front
    ends' batches (a front end's ``fleetserve_batch_size`` counts the batches it sent; these, what the engine ran)."""

    def __init__(self, model: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        ProcessCollector(registry=self.registry)
        r = self.registry
        self.batch_size = Histogram("fleetserve_engine_batch_size", "Rows per engine call of the engine process",
                                    ["model"], buckets=BATCH_BUCKETS, registry=r)
        self.merged = Histogram("fleetserve_engine_merged_batches", "Front ends' batches merged into one engine call",
                                ["model"], buckets=BATCH_BUCKETS, registry=r)
        self.compute = Histogram("fleetserve_engine_compute_seconds", "Time of one engine call", ["model"],
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.queue_wait = Histogram("fleetserve_engine_queue_seconds", "Time a front end's batch waited for the "
                                    "engine", ["model"], buckets=LATENCY_BUCKETS, registry=r)
        # The replica's family: its front ends report 0 in it, so a merged scrape says the engine's count.
        self.instances = Gauge("fleetserve_engine_instances", "Engine instances", ["model"], registry=r)
        self._batch_h = self.batch_size.labels(model)
        self._merged_h = self.merged.labels(model)
        self._compute_h = self.compute.labels(model)
        self._queue_h = self.queue_wait.labels(model)

    # BatchObserver
    def on_batch(self, size: int, seq: int, queue_wait_s: list[float], compute_s: float) -> None:
        self._batch_h.observe(size)
        self._merged_h.observe(len(queue_wait_s))
        self._compute_h.observe(compute_s)
        for wait in queue_wait_s:
            self._queue_h.observe(wait)

    def on_expired(self, n: int) -> None:
        pass  # front ends send no deadlines: their own batchers expired what was late

    def on_rejected(self) -> None:
        pass  # the queue is bounded by front ends x batches each, so nothing is refused while serving

    def on_cancelled(self, n: int) -> None:
        pass  # a front end's batch cannot be cancelled once sent

    def render(self) -> bytes:
        return generate_latest(self.registry)
