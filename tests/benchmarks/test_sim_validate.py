"""``benchmarks/sim_validate.py``'s capacity search, on a fleet whose median latency is a function of the rate."""

from __future__ import annotations

import asyncio

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
