"""The event core: time order, ties in insertion order, and agreement with SimPy on the same queue."""

from __future__ import annotations

import random

import pytest
import simpy

from fleetserve.sim.events import EventLoop


def test_callbacks_run_in_time_order_and_ties_in_insertion_order() -> None:
    loop = EventLoop()
    seen: list[tuple[float, str]] = []
    for at, name in ((2.0, "c"), (1.0, "a"), (1.0, "b"), (0.5, "first")):
        loop.schedule(at, lambda n, at=at: seen.append((at, n)), name)
    loop.run()
    assert seen == [(0.5, "first"), (1.0, "a"), (1.0, "b"), (2.0, "c")]
    assert loop.now == 2.0


def test_run_until_leaves_later_callbacks_for_the_next_run() -> None:
    loop = EventLoop()
    seen: list[str] = []
    loop.schedule(1.0, seen.append, "early")
    loop.schedule(5.0, seen.append, "late")
    loop.run(until=3.0)
    assert seen == ["early"] and loop.now == 3.0 and loop.pending == 1
    loop.after(1.0, seen.append, "scheduled at 4")
    loop.run()
    assert seen == ["early", "scheduled at 4", "late"]


def _mm1_heap(arrivals: list[float], services: list[float]) -> list[float]:
    loop = EventLoop()
    departures: list[float] = []
    queue: list[float] = []
    busy = [False]

    def start(service: float) -> None:
        busy[0] = True
        loop.after(service, finish)

    def finish(_: object) -> None:
        departures.append(loop.now)
        busy[0] = False
        if queue:
            start(queue.pop(0))

    def arrive(service: float) -> None:
        if busy[0]:
            queue.append(service)
        else:
            start(service)

    for at, service in zip(arrivals, services, strict=True):
        loop.schedule(at, arrive, service)
    loop.run()
    return departures


def _mm1_simpy(arrivals: list[float], services: list[float]) -> list[float]:
    env = simpy.Environment()
    server = simpy.Resource(env, capacity=1)
    departures: list[float] = []

    def customer(at: float, service: float):  # type: ignore[no-untyped-def]
        yield env.timeout(at)
        with server.request() as req:
            yield req
            yield env.timeout(service)
        departures.append(env.now)

    for at, service in zip(arrivals, services, strict=True):
        env.process(customer(at, service))
    env.run()
    return departures


def test_the_heap_core_and_simpy_agree_on_an_mm1_queue() -> None:
    rng = random.Random(7)
    t, arrivals, services = 0.0, [], []
    for _ in range(2000):
        t += rng.expovariate(900.0)
        arrivals.append(t)
        services.append(rng.expovariate(1000.0))
    ours, theirs = _mm1_heap(arrivals, services), _mm1_simpy(arrivals, services)
    assert len(ours) == len(theirs) == 2000
    assert ours == pytest.approx(theirs, abs=1e-12)
