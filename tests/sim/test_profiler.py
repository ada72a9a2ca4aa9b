"""``fleetserve profile``'s timing loop (the engine itself is timed in test_commands)."""

from __future__ import annotations

import pytest

from fleetserve.sim.profiler import ProfileConfig, after_waits, idle_threshold, time_calls


def test_idle_calls_each_follow_a_sleep_and_back_to_back_calls_none() -> None:
    events: list[str] = []
    ticks = iter(float(i) for i in range(1000))
    config = ProfileConfig(repeats=3, min_repeats=3, warmup=1, budget_s=100.0)

    def call() -> None:
        events.append("call")

    timing = time_calls(call, config, lambda: next(ticks), gap_s=0.02, sleep=lambda s: events.append(f"sleep {s}"))
    # One untimed warm-up call, then every timed call right after its own sleep.
    assert events == ["call", "sleep 0.02", "call", "sleep 0.02", "call", "sleep 0.02", "call"]
    assert timing.n == 3 and timing.mean_s == 1.0  # the sleeps are outside the timed span
    events.clear()
    time_calls(call, config, lambda: next(ticks), sleep=lambda s: events.append(f"sleep {s}"))
    assert "sleep" not in " ".join(events)


@pytest.mark.parametrize(("cost_after", "expected"), [
    ({0.005: 0.2, 0.01: 0.3, 0.02: 0.3}, 0.005),  # half the 20 ms penalty from 5 ms on
    ({0.02: 0.3}, 0.02),  # only the full idle spell costs
    ({}, 0.0),  # no penalty: any wait may count as idle
])
def test_the_idle_threshold_is_the_shortest_wait_that_costs_half_the_idle_penalty(
    cost_after: dict[float, float], expected: float,
) -> None:
    now = [0.0]
    last_sleep = [0.0]
    config = ProfileConfig(warmup=1, gap_rounds=3, short_gaps_s=(0.001, 0.005, 0.01), idle_gap_s=0.02)

    def sleep(s: float) -> None:
        last_sleep[0] = s

    def call() -> None:
        now[0] += 1.0 + cost_after.get(last_sleep[0], 0.0)
        last_sleep[0] = 0.0

    medians = after_waits(call, config, lambda: now[0], sleep)
    assert medians == pytest.approx({0.0: 1.0, 0.001: 1.0} | {g: 1.0 + cost_after.get(g, 0.0)
                                                               for g in (0.005, 0.01, 0.02)})
    assert idle_threshold(medians) == expected


def test_short_gaps_must_lie_below_the_idle_gap() -> None:
    with pytest.raises(ValueError, match="short gaps"):
        ProfileConfig(short_gaps_s=(0.03,), idle_gap_s=0.02)
