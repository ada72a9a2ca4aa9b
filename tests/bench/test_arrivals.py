from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterator

import numpy as np
import pytest

from fleetserve.bench.arrivals import RateProfile, arrival_offsets


def take(kind: str, rate: float, n: int, seed: int = 0) -> np.ndarray:
    return np.fromiter(itertools.islice(arrival_offsets(kind, rate, random.Random(seed)), n), float)


def test_constant_spacing_is_exact_and_does_not_drift() -> None:
    offsets = take("constant", 3.0, 300_001)
    assert offsets[0] == 0.0
    assert offsets[300_000] == pytest.approx(100_000.0, abs=1e-9)
    assert np.allclose(np.diff(offsets), 1 / 3)


def test_poisson_gaps_are_exponential_with_the_right_mean() -> None:
    gaps = np.diff(take("poisson", 500.0, 50_001))
    assert gaps.mean() == pytest.approx(1 / 500, rel=0.03)
    # An exponential distribution has standard deviation equal to its mean.
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.05)
    assert (gaps >= 0).all()


def test_poisson_is_seeded() -> None:
    assert np.array_equal(take("poisson", 100.0, 100, seed=7), take("poisson", 100.0, 100, seed=7))
    assert not np.array_equal(take("poisson", 100.0, 100, seed=7), take("poisson", 100.0, 100, seed=8))


@pytest.mark.parametrize(("kind", "rate", "message"), [("bursty", 1.0, "unknown arrival"), ("poisson", 0.0, "rate")])
def test_bad_arguments_are_named(kind: str, rate: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        arrival_offsets(kind, rate, random.Random(0))


def _until(offsets: Iterator[float], end: float) -> list[float]:
    return list(itertools.takewhile(lambda t: t < end, offsets))


def test_a_profiled_constant_schedule_follows_the_cumulative_rate_exactly() -> None:
    """A rate rising linearly from 0 to 2/s over 10 s has Λ(t) = t²/10: the k-th send is at sqrt(10 k)."""
    ramp = RateProfile(((0, 0), (10, 2)))
    sends = _until(ramp.offsets("constant", 1.0, random.Random(0)), 10)
    assert sends == pytest.approx([math.sqrt(10 * k) for k in range(10)])


def test_a_profiled_poisson_schedule_sends_what_the_rate_integrates_to_in_each_stretch() -> None:
    """A 10x ramp: per 10 s stretch, the count is the rate's integral within Poisson noise (5 sigma)."""
    ramp = RateProfile(((0, 1), (10, 1), (70, 10), (90, 10)))
    sends = _until(ramp.offsets("poisson", 20.0, random.Random(7)), 90)
    for start in range(0, 90, 10):
        expected = 20 * (ramp.multiplier(start) + ramp.multiplier(start + 10)) / 2 * 10
        got = sum(start <= t < start + 10 for t in sends)
        assert abs(got - expected) < 5 * math.sqrt(expected), (start, got, expected)


def test_a_profile_is_flat_after_its_last_point_and_ends_where_the_rate_drops_to_zero() -> None:
    assert _until(RateProfile(((0, 1), (2, 1))).offsets("constant", 2.0, random.Random(0)), 4) == \
        pytest.approx([k / 2 for k in range(8)])
    assert list(RateProfile(((0, 1), (2, 0))).offsets("constant", 2.0, random.Random(0))) == \
        pytest.approx([0.0, 2 - math.sqrt(2), 2.0])  # rate 2 - t: Λ(t) = 2t - t²/2 reaches 0, 1, 2


@pytest.mark.parametrize(("points", "message"), [
    ((), "starts at 0"), (((1, 1),), "starts at 0"), (((0, 1), (0, 2)), "increase"), (((0, -1), (1, 1)), ">= 0"),
])
def test_bad_profiles_are_named(points: tuple[tuple[float, float], ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RateProfile(points)
