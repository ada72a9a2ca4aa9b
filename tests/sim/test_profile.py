"""Profiles: interpolation, sampling, the JSON format and its errors."""

from __future__ import annotations

import json
import random
import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from fleetserve.sim.cpu_charge import cpu_by_in_hand
from fleetserve.sim.profile import LengthMix, Profile, ServiceSampler, ShapeTiming
from tests.sim.support import linear_profile


def test_service_time_is_interpolated_between_measured_shapes() -> None:
    p = linear_profile(base_s=0.001, per_row_s=0.0001)
    assert p.timing(8, 64)[0] == pytest.approx(0.0018)
    assert p.timing(6, 40)[0] == pytest.approx(0.0016)  # between batch 4 and 8
    assert p.timing(48, 64)[0] == pytest.approx(0.0058)  # past the last batch: the last interval extended


def test_sequence_length_is_interpolated_too() -> None:
    base = linear_profile()
    service = tuple(tuple(ShapeTiming(0.001 * s / 16, 0.0, 0.001, 0.001, 5) for s in base.seq_lengths)
                    for _ in base.batch_sizes)
    p = replace(base, service=service)
    assert p.timing(1, 48)[0] == pytest.approx(0.003)
    assert p.timing(1, 8)[0] == pytest.approx(0.001)  # below the first length: clamped


def test_samples_have_the_profiled_mean_and_spread() -> None:
    p = linear_profile(base_s=0.002, cv=0.3)
    sample = ServiceSampler(p, random.Random(1))
    draws = [sample(1, 32) for _ in range(20000)]
    assert statistics.fmean(draws) == pytest.approx(0.002, rel=0.02)
    assert statistics.stdev(draws) / statistics.fmean(draws) == pytest.approx(0.3, rel=0.05)
    assert ServiceSampler(linear_profile(base_s=0.002), random.Random(1))(4, 16) == 0.002


def test_a_call_after_idling_takes_the_idle_timing_when_measured() -> None:
    measured = linear_profile(base_s=0.002, idle_extra_s=0.0005)
    assert measured.timing(1, 32, idle=True)[0] == pytest.approx(0.0025)
    assert measured.timing(1, 32)[0] == pytest.approx(0.002)
    sample = ServiceSampler(measured, random.Random(1))
    assert (sample(1, 32), sample(1, 32, idle=True), sample(1, 32)) == pytest.approx((0.002, 0.0025, 0.002))
    # A profile recorded before idle calls were timed costs the same either way.
    assert linear_profile(base_s=0.002).timing(1, 32, idle=True)[0] == pytest.approx(0.002)


def test_a_serving_replica_runs_every_shape_served_factor_times_slower() -> None:
    p = replace(linear_profile(base_s=0.002, cv=0.1, idle_extra_s=0.0005), served_factor=1.2)
    assert p.timing(1, 32) == pytest.approx((0.0024, 0.1))  # the spread scales with the mean
    assert p.timing(1, 32, idle=True)[0] == pytest.approx(0.003)
    sample = ServiceSampler(p, random.Random(2))
    draws = [sample(4, 16) for _ in range(4000)]
    assert statistics.fmean(draws) == pytest.approx(0.0024, rel=0.02)
    assert p.slowed(2.0).served_factor == 1.2  # the machine's speed and the serving penalty are apart
    with pytest.raises(ValueError, match="served_factor"):
        replace(p, served_factor=0.0)


def test_waiting_beyond_the_cpu_is_the_wall_time_less_the_cpu_never_negative() -> None:
    p = linear_profile(replica_cpu_s=0.001, replica_wall_s=0.003, gateway_cpu_s=0.001, gateway_wall_s=0.0005)
    assert p.replica_wait_s == pytest.approx(0.002)
    assert p.gateway_wait_s == 0.0  # measured below its CPU (noise): no negative wait
    assert linear_profile(replica_cpu_s=0.001).replica_wait_s == 0.0  # not measured


def test_an_idle_timing_needs_both_its_mean_and_spread() -> None:
    with pytest.raises(ValueError, match="idle_mean_s"):
        ShapeTiming(0.001, 0.0, 0.001, 0.001, 3, idle_mean_s=0.002)
    with pytest.raises(ValueError, match="wall times"):
        linear_profile(replica_wall_s=-0.001)
    with pytest.raises(ValueError, match="CPU costs"):
        linear_profile(gateway_busy_cpu_s=-0.001)
    with pytest.raises(ValueError, match="idle_after_s"):
        linear_profile(idle_after_s=-0.001)


def test_a_profile_from_before_wall_times_and_idle_timings_still_loads() -> None:
    data = linear_profile(idle_extra_s=0.001, replica_wall_s=0.002, timer_lag_s=0.0003, replica_cpu_s=0.001,
                          replica_busy_cpu_s=0.0005).to_json()
    for key in ("replica_wall_s", "gateway_wall_s", "timer_lag_s", "replica_busy_cpu_s", "gateway_busy_cpu_s",
                "idle_after_s"):
        del data[key]
    del data["served_factor"]
    for row in data["service"]:
        for timing in row:
            del timing["idle_mean_s"], timing["idle_std_s"]
    old = Profile.from_json(json.loads(json.dumps(data)))
    assert (old.replica_wall_s, old.gateway_wall_s, old.timer_lag_s, old.idle_after_s) == (0.0, 0.0, 0.0, 0.0)
    assert old.served_factor == 1.0
    assert old.service[0][0].idle_mean_s is None and old.timing(1, 16, idle=True) == old.timing(1, 16)
    assert old.replica_busy_cpu_s is None and old.replica_loaded_cpu_s == old.replica_cpu_s == 0.001


def test_length_mix_draws_in_proportion_to_weights() -> None:
    mix = LengthMix((10, 100), (3.0, 1.0))
    draw = mix.sampler(random.Random(3))
    draws = [draw() for _ in range(8000)]
    assert draws.count(10) / len(draws) == pytest.approx(0.75, abs=0.02)
    assert mix.mean() == pytest.approx(32.5)
    assert LengthMix.from_samples([5, 5, 7]) == LengthMix((5, 7), (2.0, 1.0))


def test_a_profile_survives_a_json_round_trip(tmp_path: Path) -> None:
    p = linear_profile(cv=0.1, name="gpu-a", cost_per_hour=2.5, idle_extra_s=0.0002, replica_cpu_s=0.001,
                       replica_wall_s=0.002, gateway_wall_s=0.001, timer_lag_s=0.0003, replica_busy_cpu_s=0.0004,
                       gateway_busy_cpu_s=0.0002, idle_after_s=0.005)
    p = replace(p, served_factor=1.15)
    path = tmp_path / "p.json"
    p.save(path)
    assert Profile.load(path) == p


@pytest.mark.parametrize(("content", "message"), [
    ("not json", "not JSON"),
    ("[1, 2]", "JSON object"),
    ('{"format": "other/1"}', "not a fleetserve profile"),
    ('{"format": "fleetserve-profile/1", "model": "m"}', "malformed profile"),
])
def test_a_bad_profile_file_is_refused_with_its_name(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message) as err:
        Profile.load(path)
    assert "bad.json" in str(err.value)


def test_a_profile_with_a_ragged_table_is_refused() -> None:
    data = linear_profile().to_json()
    data["service"] = data["service"][:-1]
    with pytest.raises(ValueError, match="one row per batch size"):
        Profile.from_json(json.loads(json.dumps(data)))


def test_a_missing_profile_file_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot read profile"):
        Profile.load(tmp_path / "nope.json")


def test_a_cpu_curve_becomes_a_table_by_requests_in_hand_linear_between_measured_counts() -> None:
    assert cpu_by_in_hand(((1, 0.9), (2, 0.8), (4, 0.6))) == pytest.approx((0.9, 0.8, 0.7, 0.6))
    assert cpu_by_in_hand(()) == ()
    with pytest.raises(ValueError, match="CPU curve"):
        replace(linear_profile(), replica_cpu_curve=((2, 0.001), (4, 0.0005)))  # must start at one in flight
    curved = replace(linear_profile(), gateway_cpu_curve=((1, 0.001), (16, 0.0004)))
    assert Profile.from_json(curved.to_json()) == curved
