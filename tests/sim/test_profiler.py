"""``fleetserve profile``'s timing loop (the engine itself is timed in test_commands)."""

from __future__ import annotations

from fleetserve.sim.profiler import ProfileConfig, time_calls


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
