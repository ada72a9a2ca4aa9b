from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from fleetserve.bench.arrivals import arrival_offsets


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
