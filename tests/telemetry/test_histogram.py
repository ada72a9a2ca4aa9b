"""LatencyHistogram exposes what prometheus_client's own Histogram would, for the same observations."""

from __future__ import annotations

import random

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from fleetserve.telemetry.histogram import LatencyHistogram

BOUNDS = (0.001, 0.002, 0.005, 0.01)


def _lines(registry: CollectorRegistry) -> list[str]:
    return [line for line in generate_latest(registry).decode().splitlines() if "_created" not in line]


def test_scrape_text_matches_prometheus_clients_histogram() -> None:
    ours_registry, theirs_registry = CollectorRegistry(), CollectorRegistry()
    ours = LatencyHistogram("x_seconds", "Time of x", BOUNDS, ["backend"], registry=ours_registry)
    theirs = Histogram("x_seconds", "Time of x", ["backend"], buckets=BOUNDS, registry=theirs_registry)
    rng = random.Random(3)
    values = [0.001, 0.002, 0.0, 0.01, 20.0] + [rng.uniform(0, 0.02) for _ in range(500)]
    for i, value in enumerate(values):
        backend = "a" if i % 3 else "b"
        ours.series(backend).observe(value)
        theirs.labels(backend).observe(value)
    assert _lines(ours_registry) == _lines(theirs_registry)
    ours.remove("a")
    assert 'backend="a"' not in generate_latest(ours_registry).decode()


def test_an_unlabelled_histogram_is_exposed_at_zero_and_readable_as_counts() -> None:
    registry = CollectorRegistry()
    histogram = LatencyHistogram("y_seconds", "Time of y", BOUNDS, registry=registry)
    assert registry.get_sample_value("y_seconds_count") == 0.0
    series = histogram.series()
    for value in (0.0015, 0.0015, 0.3):
        series.observe(value)
    assert series.counts == [0, 2, 0, 0, 1] and series.sum == pytest.approx(0.303)
    assert registry.get_sample_value("y_seconds_bucket", {"le": "0.002"}) == 2.0
    (family,) = registry.restricted_registry(["y_seconds_count"]).collect()
    assert [s.value for s in family.samples] == [3.0]


def test_bad_bounds_and_labels_are_refused() -> None:
    with pytest.raises(ValueError, match="increasing"):
        LatencyHistogram("z", "z", (0.2, 0.1), registry=CollectorRegistry())
    histogram = LatencyHistogram("w", "w", BOUNDS, ["backend"], registry=CollectorRegistry())
    with pytest.raises(ValueError, match="takes labels"):
        histogram.series()
