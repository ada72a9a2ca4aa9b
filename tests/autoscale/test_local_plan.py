"""The local actuator's plan: which slots to start and which replicas to retire for a desired count."""

from __future__ import annotations

from fleetserve.autoscale.actuators.local import Phase, Slot, plan
from fleetserve.fleet.config import FleetConfig, gateway_config, replica_config
from fleetserve.fleet.supervisor import Supervisor

SUPERVISOR = Supervisor(FleetConfig(replicas=1, base_port=9000, cores=2), replica_config("tiny"), gateway_config(),
                        initial=0)


def slot(index: int, phase: Phase, asked_at: float = 0.0) -> Slot:
    return Slot(index, SUPERVISOR.replica_member(index), phase, asked_at)


def test_growing_takes_the_lowest_free_slots_and_a_draining_replica_keeps_its_ports() -> None:
    slots = [slot(0, Phase.READY), slot(2, Phase.DRAINING)]
    assert plan(4, slots, max_replicas=8) == ([1, 3, 4], [])
    assert [s.url for s in slots] == ["http://127.0.0.1:9000", "http://127.0.0.1:9004"]


def test_growing_stops_at_max_replicas() -> None:
    assert plan(12, [slot(0, Phase.READY)], max_replicas=3) == ([1, 2], [])


def test_shrinking_retires_the_newest_starting_replicas_first_then_the_highest_ready_ones() -> None:
    slots = [slot(0, Phase.READY), slot(1, Phase.READY), slot(2, Phase.READY), slot(3, Phase.STARTING, 5.0),
             slot(4, Phase.STARTING, 6.0), slot(5, Phase.DRAINING)]
    start, retire = plan(2, slots, max_replicas=8)
    assert start == []
    assert [s.index for s in retire] == [4, 3, 2]


def test_draining_replicas_do_not_count_toward_the_desired_count() -> None:
    slots = [slot(0, Phase.READY), slot(1, Phase.DRAINING)]
    assert plan(1, slots, max_replicas=4) == ([], [])
    assert plan(2, slots, max_replicas=4) == ([2], [])


def test_zero_retires_everything() -> None:
    slots = [slot(0, Phase.READY), slot(1, Phase.STARTING)]
    assert {s.index for s in plan(0, slots, max_replicas=4)[1]} == {0, 1}
