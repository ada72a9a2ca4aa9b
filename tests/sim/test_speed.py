"""The speed probe's factor and a profile slowed by it (pure logic: a fake engine call and clock)."""

from __future__ import annotations

import pytest

from fleetserve.sim.profile import Profile
from fleetserve.sim.speed import SpeedProbe
from tests.sim.support import linear_profile


def make_profile() -> Profile:
    return linear_profile(base_s=0.002, per_row_s=0.001, cv=0.1, idle_extra_s=0.0005, replica_cpu_s=0.001,
                          replica_wall_s=0.0015, gateway_cpu_s=0.0005, gateway_busy_cpu_s=0.0003, timer_lag_s=0.0002,
                          idle_after_s=0.01)


def test_the_factor_is_the_median_call_now_over_the_profile_s_median_of_the_same_shape() -> None:
    profile = make_profile()
    reference = profile.service[0][1].p50_s  # the second sequence length
    now = [0.0]
    durations = iter([9.0] + [reference * 1.1] * 5 + [reference * 50] + [reference * 1.1] * 100)

    def call() -> None:
        now[0] += next(durations)

    probe = SpeedProbe(profile, call, seconds=reference * 6.5, clock=lambda: now[0])
    assert probe.reference_s == reference and SpeedProbe.shape(profile) == (profile.batch_sizes[0],
                                                                             profile.seq_lengths[1])
    # The untimed first call (9 s) and one stalled call move neither the median nor the time budget's count much.
    assert probe.factor() == pytest.approx(1.1)


def test_a_slowed_profile_scales_what_runs_code_and_keeps_the_rest() -> None:
    profile = make_profile()
    slow = profile.slowed(1.25)
    assert slow.timing(3, 40) == pytest.approx((profile.timing(3, 40)[0] * 1.25, profile.timing(3, 40)[1]))
    assert slow.timing(3, 40, idle=True)[0] == pytest.approx(profile.timing(3, 40, idle=True)[0] * 1.25)
    assert slow.replica_cpu_s == pytest.approx(profile.replica_cpu_s * 1.25)
    assert slow.gateway_loaded_cpu_s == pytest.approx(profile.gateway_loaded_cpu_s * 1.25)
    assert slow.replica_wait_s == pytest.approx(profile.replica_wait_s * 1.25)
    assert (slow.timer_lag_s, slow.idle_after_s, slow.cold_start_s) == (
        profile.timer_lag_s, profile.idle_after_s, profile.cold_start_s)
    assert Profile.from_json(slow.to_json()) == slow
    with pytest.raises(ValueError, match="speed factor"):
        profile.slowed(0.0)
