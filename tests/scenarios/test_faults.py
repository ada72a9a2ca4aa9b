"""Scenario tests (slow; `make test-all`): a real fleet of tiny replicas behind the real gateway under
open-loop load, with a crash, a rolling restart, or a throttled replica. Shorter versions of
benchmarks/gateway.py, with the issue's goals as assertions."""

from __future__ import annotations

import asyncio

import pytest

from fleetserve.bench.scenarios import ScenarioConfig, run_scenario
from fleetserve.gateway.config import SERVERS

pytestmark = pytest.mark.slow


def scenario(**kw: object):
    cfg = ScenarioConfig(base_port=23100, gateway_port=23080, **kw)  # type: ignore[arg-type]
    return asyncio.run(run_scenario(cfg))


@pytest.mark.parametrize("server", SERVERS)
def test_crash_costs_no_request_and_is_ejected_within_a_second(server: str) -> None:
    result = scenario(fault="crash", rate=150, duration_s=15, fault_at_s=3, gateway_args=("--server", server))
    assert result.report.errors == 0, result.report.errors_by_type
    assert result.events["out_after_s"] < 1.0
    assert result.events["restarts"] == 1
    assert "back_after_s" in result.events, "the restarted replica must rejoin the rotation"


@pytest.mark.parametrize("server", SERVERS)
def test_rolling_restart_costs_no_request(server: str) -> None:
    result = scenario(fault="rolling", rate=150, duration_s=40, fault_at_s=2, gateway_args=("--server", server))
    assert result.report.errors == 0, result.report.errors_by_type
    assert result.events["restarts"] == 4


@pytest.mark.parametrize("server", SERVERS)
def test_throttled_replica_does_not_set_the_tail(server: str) -> None:
    on = ("--server", server)
    rr = scenario(fault="throttle", policy="round-robin", rate=150, duration_s=12, gateway_args=on)
    ewma = scenario(fault="throttle", policy="p2c-peak-ewma", rate=150, duration_s=12, gateway_args=on)
    assert rr.report.errors == 0 and ewma.report.errors == 0
    # Round-robin sends a quarter of the traffic into 80 ms stalls; peak-EWMA steers around them.
    assert ewma.report.percentile(99) < 0.5 * rr.report.percentile(99)
