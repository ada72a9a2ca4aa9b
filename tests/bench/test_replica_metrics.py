"""A replica's engine counters as the scenario harness reads them: real exposition text, served over HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler

import pytest

from fleetserve.bench.replica_metrics import batch_events, engine_counters, fetch
from fleetserve.telemetry.metrics import ReplicaMetrics
from tests.support.httpthread import serving


@pytest.fixture
def served() -> Iterator[tuple[str, ReplicaMetrics]]:
    metrics = ReplicaMetrics("minilm")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = metrics.render()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    with serving(Handler) as url:
        yield url, metrics


def test_counters_are_read_from_the_replicas_metrics(served: tuple[str, ReplicaMetrics]) -> None:
    url, metrics = served
    metrics.on_batch(3, 32, [0.001, 0.002, 0.003], 0.010)
    metrics.on_batch(1, 256, [0.004], 0.050)
    got = engine_counters(fetch(url))
    assert got["rows"] == 4 and got["batches"] == 2 and got["padded"] == 288 and got["requests"] == 4
    assert got["queue_s"] == pytest.approx(0.010) and got["compute_s"] == pytest.approx(0.080)


def test_batch_events_are_the_differences_between_two_snapshots() -> None:
    before = [{"rows": 10, "batches": 5, "padded": 100, "compute_s": 1.0, "queue_s": 0.5, "requests": 10},
              {"rows": 0, "batches": 0, "padded": 0, "compute_s": 0.0, "queue_s": 0.0, "requests": 0}]
    after = [{"rows": 16, "batches": 7, "padded": 164, "compute_s": 1.06, "queue_s": 0.512, "requests": 16},
             {"rows": 18, "batches": 6, "padded": 192, "compute_s": 0.18, "queue_s": 0.036, "requests": 18}]
    got = batch_events(before, after)
    assert got["replica_mean_batch"] == pytest.approx(24 / 8)
    assert got["replica_mean_padded_len"] == pytest.approx(256 / 8)
    assert got["replica_compute_ms"] == pytest.approx(240 / 24)
    assert got["replica_queue_ms"] == pytest.approx(48 / 24)
    assert got["replica0_row_share"] == pytest.approx(6 / 24)
    assert batch_events(before, before) == {}  # no engine call in between: nothing to say
