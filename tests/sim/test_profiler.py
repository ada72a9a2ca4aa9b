"""``fleetserve profile``'s timing loop (the engine itself is timed in test_commands)."""

from __future__ import annotations

import numpy as np
import pytest

from fleetserve.sim.profiler import ProfileConfig, after_waits, idle_threshold, measure_grid


def test_the_grid_s_shapes_take_turns_each_spreading_its_calls_over_the_rounds() -> None:
    now = [0.0]
    cost = {(1, 16): 1.0, (1, 32): 1.5, (2, 16): 2.0, (2, 32): 4.0}
    events: list[str] = []
    config = ProfileConfig(repeats=4, min_repeats=2, warmup=1, budget_s=3.0, rounds=2, idle_gap_s=0.02)

    def infer(feed: dict[str, np.ndarray]) -> None:
        shape = feed["input_ids"].shape
        events.append(f"{shape[0]}x{shape[1]}")
        now[0] += cost[shape]

    grid = measure_grid(infer, {"input_ids": ("int64", 1000)}, (1, 2), (16, 32), config, clock=lambda: now[0],
                        sleep=lambda s: events.append(f"sleep {s}"))
    # Runs per shape: as many as fit in 3 s by the sizing call, within [2, 4]: 3, 2, 2, 2.
    assert [[t.n for t in row] for row in grid] == [[3, 2], [2, 2]]
    assert [[t.mean_s for t in row] for row in grid] == [[1.0, 1.5], [2.0, 4.0]]
    assert [[t.idle_mean_s for t in row] for row in grid] == [[1.0, 1.5], [2.0, 4.0]]  # sleeps are not timed
    timed = events[8:]  # after each shape's warm-up and sizing calls
    # Round one: every shape's first share, back to back then each after its sleep, before any shape's second.
    assert timed[:12] == ["1x16", "sleep 0.02", "1x16", "1x32", "sleep 0.02", "1x32",
                          "2x16", "sleep 0.02", "2x16", "2x32", "sleep 0.02", "2x32"]
    assert timed[12:16] == ["1x16", "1x16", "sleep 0.02", "1x16"]


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
