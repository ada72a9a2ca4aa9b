from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest

from fleetserve.bench.recorder import Recorder
from fleetserve.bench.report import LoadReport
from tests.support.reports import report, synthetic


def test_totals_and_percentiles_match_the_samples() -> None:
    raw = synthetic()
    r = report(raw)
    assert r.requests == r.sent == 3000
    assert r.ok == len(raw.latency_s) == r.samples_kept == 1980
    assert r.errors_by_type == {"http_503": 30, "timeout": 990} and r.errors == 1020
    assert r.ok + r.errors == r.requests
    assert r.achieved_rps == pytest.approx(1980 / 3.0)
    for name, q in (("p50", 50), ("p90", 90), ("p99", 99), ("p99.9", 99.9)):
        assert r.latency_s[name] == pytest.approx(np.percentile(raw.latency_s, q))
        assert r.percentile(q) == r.latency_s[name]
    assert r.latency_s["max"] == raw.latency_s.max()
    assert r.percentile(75) == pytest.approx(np.percentile(raw.latency_s, 75))
    assert r.service_latency_s["p99"] == pytest.approx(r.latency_s["p99"] / 2)


def test_timeseries_has_every_second_including_empty_ones() -> None:
    rows = report().timeseries
    assert [row.t for row in rows] == [0, 1, 2, 3, 4]
    assert [row.sent for row in rows] == [1000, 1000, 1000, 0, 0]
    assert [row.ok for row in rows] == [990, 0, 990, 0, 0]
    assert [row.errors for row in rows] == [10, 10, 10, 0, 990]
    assert math.isnan(rows[1].p99_s) and math.isnan(rows[3].p50_s)
    assert 0.001 <= rows[0].p50_s <= rows[0].p99_s <= 0.01


def test_json_round_trip() -> None:
    original = report()
    text = json.dumps(original.to_json(), allow_nan=False)
    loaded = LoadReport.from_json(json.loads(text))
    assert loaded.samples is None
    assert loaded.to_json() == json.loads(text)
    assert loaded.timeseries[0] == original.timeseries[0]
    assert loaded.percentile(99.9) == original.percentile(99.9)
    with pytest.raises(ValueError, match="no samples"):
        loaded.percentile(75)


def test_no_successes_gives_nan_latency_not_zero() -> None:
    rec = Recorder(10, random.Random(0))
    rec.record_sent(0.0)
    rec.record_error("connect", 0.0)
    r = report(rec.result(1.0, 0.0))
    assert math.isnan(r.percentile(99)) and math.isnan(r.latency_s["p50"])
    assert json.loads(json.dumps(r.to_json(), allow_nan=False))["latency_s"]["p99"] is None
    assert "connect 1" in r.summary_table()


def test_percentile_takes_percent() -> None:
    with pytest.raises(ValueError, match="percent"):
        report().percentile(101)


def test_summary_table_shows_the_numbers() -> None:
    r = report()
    table = r.summary_table(per_second=True)
    assert "requests 3000" in table and "http_503 30" in table and "timeout 990" in table
    assert f"{r.latency_s['p99'] * 1e3:.2f}" in table
    assert len(table.splitlines()) == 8 + 1 + len(r.timeseries)


def test_saturation_warning() -> None:
    busy = LoadReport.from_json({**report().to_json(), "generator_cpu_s": 4.9})
    assert busy.generator_saturated and "WARNING" in busy.summary_table()
    assert not report().generator_saturated
