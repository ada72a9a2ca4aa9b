"""The hold queue (scale from zero): bounded, released oldest first, given up at the deadline or timeout."""

from __future__ import annotations

import asyncio

import pytest

from fleetserve.gateway.autoscale.hold import Held, HoldQueue, ReleaseOnReady
from fleetserve.gateway.balance import Balancer, BalancerConfig, Endpoint, Insert, Remove
from fleetserve.gateway.balance.observer import Observers
from tests.support.clock import FakeClock
from tests.support.waiting import until

FAR = 1e9  # a deadline that never passes


async def test_release_wakes_the_waiting_requests_oldest_first() -> None:
    queue = HoldQueue(8, 60.0)
    order: list[int] = []

    async def request(i: int) -> None:
        assert await queue.hold(FAR) is Held.RELEASED
        order.append(i)

    tasks = []
    for i in range(5):
        tasks.append(asyncio.create_task(request(i)))
        await until(lambda n=i + 1: queue.held == n)
    assert queue.release() == 5
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2, 3, 4]
    assert queue.held == 0


async def test_a_full_queue_refuses_at_once_and_counts_each_ending() -> None:
    ends: list[Held] = []
    queue = HoldQueue(2, 60.0, on_end=ends.append)
    waiting = [asyncio.create_task(queue.hold(FAR)) for _ in range(2)]
    await until(lambda: queue.held == 2)
    assert await queue.hold(FAR) is Held.FULL
    assert queue.held == 2
    queue.release()
    assert await asyncio.gather(*waiting) == [Held.RELEASED, Held.RELEASED]
    assert sorted(ends) == sorted([Held.FULL, Held.RELEASED, Held.RELEASED])


async def test_the_hold_timeout_ends_a_wait_and_frees_its_place() -> None:
    queue = HoldQueue(1, 0.05)
    assert await queue.hold(FAR) is Held.TIMEOUT
    assert queue.held == 0
    waiter = asyncio.create_task(queue.hold(FAR))
    await until(lambda: queue.held == 1)
    queue.release()
    assert await waiter is Held.RELEASED


async def test_the_requests_deadline_ends_the_wait_sooner() -> None:
    clock = FakeClock(100.0)
    queue = HoldQueue(4, 60.0, clock=clock)
    assert await queue.hold(100.0) is Held.TIMEOUT  # no time left: no wait at all
    assert await asyncio.wait_for(queue.hold(100.05), 5.0) is Held.TIMEOUT  # 50 ms left, not the 60 s timeout


async def test_a_client_that_goes_away_leaves_the_queue() -> None:
    queue = HoldQueue(1, 60.0)
    waiter = asyncio.create_task(queue.hold(FAR))
    await until(lambda: queue.held == 1)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert queue.held == 0
    assert queue.release() == 0


async def test_the_first_request_held_wakes_the_autoscaler_once() -> None:
    woken: list[int] = []
    queue = HoldQueue(4, 60.0, on_hold=lambda: woken.append(queue.held))
    tasks = [asyncio.create_task(queue.hold(FAR)) for _ in range(3)]
    await until(lambda: queue.held == 3)
    assert woken == [1]
    queue.release()
    await asyncio.gather(*tasks)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="capacity"):
        HoldQueue(0, 1.0)
    with pytest.raises(ValueError, match="timeout"):
        HoldQueue(1, 0.0)


async def test_a_replica_turning_routable_releases_the_queue() -> None:
    """Wired as the balancer's observer: an insert without health checks (healthy at once), a probe that
    admits a replica, and a re-admission each release; a removal does not."""
    queue = HoldQueue(4, 60.0)
    observers = Observers()
    balancer = Balancer(BalancerConfig(), observer=observers)
    observers.add(ReleaseOnReady(queue))
    ep = Endpoint.from_url("http://127.0.0.1:9")
    waiter = asyncio.create_task(queue.hold(FAR))
    await until(lambda: queue.held == 1)
    balancer.apply(Insert(ep))
    assert await waiter is Held.RELEASED

    balancer.apply(Remove(ep))
    balancer.enable_active_health()
    waiter = asyncio.create_task(queue.hold(FAR))
    await until(lambda: queue.held == 1)
    balancer.apply(Insert(ep))  # unknown until probed
    assert queue.held == 1  # a release pops the queue at once
    balancer.set_probe_result(ep, True)
    assert await waiter is Held.RELEASED
