"""The local actuator's logic: which slots to start and which replicas to retire, and what a crash does."""

from __future__ import annotations

from typing import Any, cast

import pytest

from fleetserve.autoscale.actuators.local import LocalActuator, Phase, Slot, plan
from fleetserve.fleet.config import FleetConfig, gateway_config, replica_config
from fleetserve.fleet.launch import Child
from fleetserve.fleet.supervisor import Supervisor
from tests.support.waiting import until

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


class FakeProcess:
    def __init__(self) -> None:
        self.returncode: int | None = None


async def test_a_ready_replica_that_exits_unasked_leaves_ready_at_once_and_rejoins_once_restarted_and_ready(
        monkeypatch: pytest.MonkeyPatch) -> None:
    actuator = LocalActuator(SUPERVISOR, "http://127.0.0.1:1", max_replicas=2, ready_poll_s=0.001)
    published: list[dict[str, Any]] = []
    answering = False

    async def publish() -> bool:
        published.append(actuator.membership())
        return True

    async def ready(url: str) -> bool:
        return answering

    monkeypatch.setattr(actuator, "publish", publish)
    monkeypatch.setattr(actuator, "_ready", ready)
    member, crashed = SUPERVISOR.replica_member(0), FakeProcess()
    member.process = cast(Child, crashed)
    actuator.slots[0] = slot = Slot(0, member, Phase.READY, 0.0)
    actuator._notice_exits()
    assert slot.phase is Phase.READY
    crashed.returncode = -9
    actuator._notice_exits()
    assert slot.phase is Phase.STARTING
    assert actuator.membership()["ready"] == [] and actuator.membership()["starting"] == [member.url]
    member.process, member.restarts = cast(Child, FakeProcess()), 1  # the supervisor restarted it
    actuator._notice_exits()
    answering = True
    await until(lambda: slot.phase is Phase.READY, what="the restarted replica rejoined")
    assert published[-1]["ready"] == [member.url]
    assert list(actuator.startup_s) == []  # a restart after a crash is no scale-up's start-up time
