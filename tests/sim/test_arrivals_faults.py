"""Arrival processes and fault specs."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest

from fleetserve.sim.arrivals import ArrivalConfig, parse_ramp, ramp_rate, read_trace
from fleetserve.sim.faults import Fault


def test_poisson_arrivals_have_the_asked_rate() -> None:
    times = [t for t, _ in itertools.islice(ArrivalConfig("poisson", rate=500).source(random.Random(1)), 20000)]
    assert len(times) / times[-1] == pytest.approx(500, rel=0.03)


def test_a_ramp_follows_its_rate_by_thinning() -> None:
    points = parse_ramp("0=100,10=1000,20=1000")
    assert ramp_rate(points, 5.0) == pytest.approx(550)
    assert ramp_rate(points, 50.0) == 1000
    times = [t for t, _ in itertools.takewhile(lambda a: a[0] < 20, ArrivalConfig.parse("ramp:0=100,10=1000,20=1000",
                                                                                      0).source(random.Random(2)))]
    first, second = sum(t < 10 for t in times), sum(t >= 10 for t in times)
    assert first == pytest.approx(5500, rel=0.05) and second == pytest.approx(10000, rel=0.05)


@pytest.mark.parametrize("text", ["", "1=100", "0=100,0=200", "0=abc", "0=-1", "0=0"])
def test_bad_ramps_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_ramp(text)


def test_a_trace_gives_times_and_optional_lengths(tmp_path: Path) -> None:
    path = tmp_path / "trace.txt"
    path.write_text("# time tokens\n0.0 12\n0.5\n1.5 200  # a long one\n")
    assert read_trace(path) == [(0.0, 12), (0.5, None), (1.5, 200)]
    assert list(ArrivalConfig.parse(f"trace:{path}", 0).source(random.Random(0))) == read_trace(path)
    path.write_text("1.0\n0.5\n")
    with pytest.raises(ValueError, match="non-decreasing"):
        read_trace(path)
    path.write_text("x\n")
    with pytest.raises(ValueError, match=r"trace.txt:1"):
        read_trace(path)


def test_fault_specs_parse() -> None:
    assert Fault.parse("throttle:1%") == Fault("throttle", share=0.01)
    assert Fault.parse("crash:0,3@10") == Fault("crash", indices=(0, 3), at_s=10.0)
    assert Fault.parse("slow:2%x3@5") == Fault("slow", share=0.02, factor=3.0, at_s=5.0)
    assert Fault.parse("throttle:1%").targets(1000, random.Random(0)).__len__() == 10
    assert Fault.parse("throttle:1%").targets(10, random.Random(0)).__len__() == 1


@pytest.mark.parametrize("spec", ["melt:1%", "throttle", "throttle:", "slow:1%x0.5", "crash:200%"])
def test_bad_fault_specs_are_refused(spec: str) -> None:
    with pytest.raises(ValueError):
        Fault.parse(spec)


def test_a_fault_on_a_replica_outside_the_fleet_is_refused() -> None:
    with pytest.raises(ValueError, match="outside a fleet of 2"):
        Fault.parse("crash:5").targets(2, random.Random(0))
