"""Hedging's parts: which requests may be hedged, the latency window, the budget, the config, the race."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Coroutine
from typing import Any

import pytest

from fleetserve.gateway.forward.hedge import HedgeBudget, HedgeConfig, Hedger, LatencyWindow, hedgeable, race
from tests.support.waiting import until

INFER = "/v2/models/m/infer"


@pytest.mark.parametrize(("method", "path", "expected"), [
    ("POST", "/v2/models/m/infer", True),
    ("POST", "/v2/models/m/versions/3/infer", True),
    ("POST", "/inference", True),
    ("GET", "/v2/models/m/infer", False),
    ("GET", "/v2/models/m", False),
    ("POST", "/v2/repository/models/m/load", False),
    ("POST", "/inference/extra", False),
])
def test_only_inference_calls_are_hedged(method: str, path: str, expected: bool) -> None:
    assert hedgeable(method, path) is expected


def test_window_has_no_threshold_before_min_samples() -> None:
    window = LatencyWindow(size=100, percentile=95, min_samples=10)
    for _ in range(9):
        window.observe(0.01)
        assert window.threshold is None
    window.observe(0.01)
    assert window.threshold == 0.01


def test_window_threshold_is_the_percentile_of_recent_latencies() -> None:
    window = LatencyWindow(size=1000, percentile=95, min_samples=100)
    values = [i / 1000 for i in range(1, 1001)]  # 1..1000 ms
    random.Random(3).shuffle(values)
    for v in values:
        window.observe(v)
    assert window.threshold == pytest.approx(0.950, abs=0.005)


def test_window_forgets_old_latencies() -> None:
    window = LatencyWindow(size=80, percentile=90, min_samples=10)
    for _ in range(80):
        window.observe(1.0)  # a slow past
    for _ in range(80):
        window.observe(0.002)  # the window has moved on
    assert window.threshold == 0.002


def test_budget_allows_its_share_of_requests_and_no_more() -> None:
    budget = HedgeBudget(max_extra_percent=10, burst=5)
    hedges = 0
    for _ in range(1000):
        budget.deposit()
        if budget.available():
            budget.take()
            hedges += 1
    assert hedges == 100


def test_budget_saves_up_at_most_burst() -> None:
    budget = HedgeBudget(max_extra_percent=50, burst=3)
    for _ in range(100):
        budget.deposit()
    taken = 0
    while budget.available():
        budget.take()
        taken += 1
    assert taken == 3


def test_hedger_delay_follows_the_route_and_respects_the_floor() -> None:
    hedger = Hedger(HedgeConfig(percentile=95, min_samples=10, window=16, min_delay_ms=5))
    assert hedger.delay_s("POST", INFER) is None  # nothing known yet
    for _ in range(10):
        hedger.observe("POST", INFER, 0.001)
    assert hedger.delay_s("POST", INFER) == 0.005  # 1 ms p95, floored at 5 ms
    for _ in range(16):
        hedger.observe("POST", INFER, 0.040)
    assert hedger.delay_s("POST", INFER) == pytest.approx(0.040)
    assert hedger.delay_s("POST", "/v2/models/other/infer") is None  # its own window, still empty
    assert hedger.delay_s("GET", "/v2/models/m") is None


def test_hedger_bounds_the_number_of_windows() -> None:
    hedger = Hedger(HedgeConfig(percentile=99, min_samples=1, window=8))
    for i in range(500):
        hedger.observe("POST", f"/v2/models/m{i}/infer", 0.01)
    assert len(hedger._windows) <= 65


def test_hedging_is_on_by_default_at_p99_toward_idle_replicas_only() -> None:
    config = HedgeConfig()
    assert config.enabled and config.percentile == 99 and config.spare_only


def test_percentile_zero_turns_hedging_off() -> None:
    hedger = Hedger(HedgeConfig(percentile=0, min_samples=1, window=8))
    hedger.observe("POST", INFER, 0.01)
    assert hedger.delay_s("POST", INFER) is None


@pytest.mark.parametrize(("field", "value", "message"), [
    ("percentile", 20, "percentile"),
    ("percentile", 100, "percentile"),
    ("max_extra_percent", 0, "max_extra_percent"),
    ("burst", 0.5, "burst"),
    ("window", 4, "window"),
    ("min_samples", 2000, "min_samples"),
    ("min_delay_ms", -1, "min_delay_ms"),
])
def test_config_rejects_bad_values(field: str, value: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        HedgeConfig(**{field: value})  # type: ignore[arg-type]


async def _answer(value: str, after_s: float, log: list[str]) -> str:
    try:
        await asyncio.sleep(after_s)
    except asyncio.CancelledError:
        log.append(f"cancelled {value}")
        raise
    return value


def _final(value: str) -> bool:
    return not value.startswith("retry")


async def test_race_without_a_due_hedge_never_starts_one() -> None:
    started: list[str] = []

    def start() -> Coroutine[Any, Any, str]:
        started.append("hedge")
        return _answer("hedge", 0, [])

    assert await race(_answer("first", 0.001, []), 0.05, start, _final) == ("first", False)
    # A timer due after the hedge's would have been: timers fire in due order, so a live hedge timer runs first.
    past_due = asyncio.Event()
    asyncio.get_running_loop().call_later(0.06, past_due.set)
    await asyncio.wait_for(past_due.wait(), 10)
    assert started == []


async def test_race_a_faster_hedge_wins_and_the_first_is_cancelled() -> None:
    log: list[str] = []
    result = await race(_answer("first", 5, log), 0.01, lambda: _answer("hedge", 0.01, log), _final)
    assert result == ("hedge", True)
    assert log == ["cancelled first"]
    assert not asyncio.current_task().cancelling()  # type: ignore[union-attr]


async def test_race_a_slower_hedge_loses_and_is_cancelled() -> None:
    log: list[str] = []
    result = await race(_answer("first", 0.05, log), 0.01, lambda: _answer("hedge", 5, log), _final)
    assert result == ("first", False)
    await until(lambda: log == ["cancelled hedge"])


async def test_race_without_a_hedge_target_waits_for_the_first() -> None:
    assert await race(_answer("first", 0.05, []), 0.01, lambda: None, _final) == ("first", False)


async def test_race_a_failed_hedge_leaves_the_first_running() -> None:
    log: list[str] = []
    result = await race(_answer("first", 0.05, log), 0.01, lambda: _answer("retry-hedge", 0, log), _final)
    assert result == ("first", False)
    assert log == []


async def test_race_a_failed_first_waits_for_the_hedge() -> None:
    result = await race(_answer("retry-first", 0.03, []), 0.01, lambda: _answer("hedge", 0.05, []), _final)
    assert result == ("hedge", True)


async def test_race_cancelled_from_outside_cancels_both_attempts() -> None:
    log: list[str] = []
    hedged: list[str] = []

    async def hedge() -> str:
        hedged.append("running")
        return await _answer("hedge", 5, log)

    task = asyncio.create_task(race(_answer("first", 5, log), 0.01, hedge, _final))
    await until(lambda: hedged == ["running"], what="the hedge is running")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await until(lambda: sorted(log) == ["cancelled first", "cancelled hedge"])
