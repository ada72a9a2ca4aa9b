"""``benchmarks/sim_validate.py``: the capacity search (on a fleet whose median latency is a function of the rate) and
the prediction it prints; ``benchmarks/sim_breakdown.py --by-length``'s simulated fleet."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest


@pytest.mark.parametrize("edge", [110.0, 131.0, 160.0, 199.0])
def test_open_capacity_finds_the_highest_rate_that_holds_the_median(edge: float) -> None:
    import sim_validate

    tried: list[float] = []

    async def p50_ms_at(rate: float) -> float:
        tried.append(rate)
        return 40.0 if rate <= edge else 2_000.0

    found = asyncio.run(sim_validate.open_capacity(p50_ms_at, 200.0, 100.0, 5, "test"))
    assert len(tried) == 5
    assert found <= edge < found + 200.0 / 2**6
    assert all(100.0 <= rate <= 200.0 for rate in tried)


def test_open_capacity_says_so_when_nothing_holds(capsys: pytest.CaptureFixture[str]) -> None:
    import sim_validate

    async def overloaded(rate: float) -> float:
        return 5_000.0

    assert asyncio.run(sim_validate.open_capacity(overloaded, 200.0, 100.0, 3, "test")) == 100.0
    assert "no rate tried held" in capsys.readouterr().out


def test_a_prediction_gives_the_engine_time_per_request_beside_the_batch() -> None:
    import sim_validate

    from tests.sim.support import linear_profile

    model = sim_validate.predict(linear_profile(base_s=0.002, device="cpu"), 2, 40.0, 2.0, 0.0, False, range(2))
    assert len(model.p99s_ms) == 2 and model.rps == pytest.approx(40.0, rel=0.25)
    assert model.mean_batch == pytest.approx(1.0, abs=0.05)
    assert model.engine_ms == pytest.approx(2.0, rel=0.05)  # lone requests on idle engines: the profile's 2 ms
    row = sim_validate.Row(2, "30% load", 40.0, 40.0, model.rps, 5.0, model.p50_ms, 9.0, 9.0, 0, 0.0, 1.0, 1.0, 9.0,
                           (9.0, 9.0), (9.0, 9.0), {}, model.mean_batch, model.engine_ms)
    assert f"engine call {model.engine_ms:.1f} ms per request" in row.engine_line()


def test_by_length_simulates_the_fleet_with_short_and_long_texts_apart() -> None:
    import sim_breakdown

    from fleetserve.sim.profile import LengthMix
    from fleetserve.sim.simulator import simulate
    from tests.sim.support import linear_profile

    profile = replace(linear_profile(base_s=0.002, device="cpu"), lengths=LengthMix((20, 200), (9.0, 1.0)))
    config = sim_breakdown.by_length_config(profile, 2, 30.0, 3.0, 0.1, seed=1)
    assert config.split_tokens == sim_breakdown.SHORT_MAX_TOKENS and config.replicas == 2
    result = simulate(config)
    assert set(result.latency_by_length) == {"short", "long"}
    assert result.latency_by_length["short"]["p50"] > 0 and result.latency_by_length["long"]["p50"] > 0
    assert config.balancer.policy == "p2c-peak-ewma"
    assert sim_breakdown.by_length_config(profile, 2, 30.0, 3.0, 0.1, seed=1, policy="round-robin").balancer.policy \
        == "round-robin"


def test_the_summary_counts_rows_within_the_tolerance_and_rows_whose_own_repeats_spread_farther() -> None:
    import sim_validate

    def row(measured: float, predicted: float, spread: tuple[float, float]) -> sim_validate.Row:
        return sim_validate.Row(2, "30% load", 40.0, 40.0, 40.0, 5.0, 5.0, measured, predicted, 0, 0.0, 1.0, 1.0,
                                predicted, spread, (predicted, predicted))

    rows = [row(100.0, 110.0, (95.0, 105.0)), row(100.0, 80.0, (70.0, 101.0)), row(100.0, 114.0, (100.0, 120.0))]
    assert rows[1].repeat_spread() == pytest.approx(0.30) and rows[2].repeat_spread() == pytest.approx(0.20)
    assert len(rows[1].cells()) == len(sim_validate.HEAD) and rows[1].cells()[-1] == "30%"
    assert sim_validate.summary(rows) == ("p99 within 15% in 2 of 3 rows; the real fleet's own repeats spread "
                                          "farther than 15% from their median in 2 of 3")
