"""Profiles: interpolation, sampling, the JSON format and its errors."""

from __future__ import annotations

import json
import random
import statistics
from dataclasses import replace
from pathlib import Path

import pytest

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


def test_length_mix_draws_in_proportion_to_weights() -> None:
    mix = LengthMix((10, 100), (3.0, 1.0))
    draw = mix.sampler(random.Random(3))
    draws = [draw() for _ in range(8000)]
    assert draws.count(10) / len(draws) == pytest.approx(0.75, abs=0.02)
    assert mix.mean() == pytest.approx(32.5)
    assert LengthMix.from_samples([5, 5, 7]) == LengthMix((5, 7), (2.0, 1.0))


def test_a_profile_survives_a_json_round_trip(tmp_path: Path) -> None:
    p = linear_profile(cv=0.1, name="gpu-a", cost_per_hour=2.5)
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
