"""FIFO servers and processor sharing on hosts, on the simulated clock."""

from __future__ import annotations

import pytest

from fleetserve.sim.events import EventLoop
from fleetserve.sim.host import Host, Server


def _finishes(loop: EventLoop, server: Server, works: list[float], at: float = 0.0) -> list[float]:
    done: list[float] = []
    for w in works:
        loop.schedule(at, lambda work: server.submit(work, lambda _: done.append(loop.now)), w)
    return done


def test_a_server_runs_jobs_one_at_a_time_in_order() -> None:
    loop = EventLoop()
    server = Server(loop, Host(loop, 4.0))
    done = _finishes(loop, server, [1.0, 2.0, 0.5])
    loop.run()
    assert done == [1.0, 3.0, 3.5]
    assert server.busy_seconds() == pytest.approx(3.5)


PATHS = pytest.mark.parametrize("interruptible", [False, True], ids=["fast path", "general path"])


def _server(loop: EventLoop, interruptible: bool, wait_s: float = 0.0) -> Server:
    """A server on a one-core host, on the fast path or (marked interruptible) the general one."""
    server = Server(loop, Host(loop, 1.0), wait_s=wait_s)
    if interruptible:
        server.interruptible()
    return server


@PATHS
def test_the_fast_path_and_the_general_path_agree(interruptible: bool) -> None:
    loop = EventLoop()
    server = _server(loop, interruptible)
    first = _finishes(loop, server, [0.3, 0.2], at=0.0)
    later = _finishes(loop, server, [0.4], at=1.0)
    busy: list[float] = []
    loop.schedule(1.2, lambda _: busy.append(server.busy_seconds()))
    loop.run()
    assert first == [pytest.approx(0.3), pytest.approx(0.5)] and later == [pytest.approx(1.4)]
    assert busy == [pytest.approx(0.7)]


@PATHS
def test_a_job_is_handed_back_after_its_wait_without_holding_up_the_next(interruptible: bool) -> None:
    loop = EventLoop()
    server = _server(loop, interruptible, wait_s=0.25)
    done = _finishes(loop, server, [1.0, 2.0])
    loop.run()
    assert done == [pytest.approx(1.25), pytest.approx(3.25)]  # the second job started at 1.0, not 1.25
    assert server.busy_seconds() == pytest.approx(3.0)


@PATHS
def test_a_server_is_busy_while_a_job_runs_or_is_queued(interruptible: bool) -> None:
    loop = EventLoop()
    server = _server(loop, interruptible, wait_s=0.5)
    _finishes(loop, server, [1.0, 1.0])
    seen: list[bool] = []
    for at in (0.5, 1.5, 2.2):  # running the first, running the second, done (its wait takes no core)
        loop.schedule(at, lambda _: seen.append(server.busy))
    loop.run()
    assert seen == [True, True, False]


def test_a_fast_path_server_refuses_faults() -> None:
    loop = EventLoop()
    server = Server(loop, Host(loop, 1.0))
    server.submit(1.0, lambda _: None)
    with pytest.raises(RuntimeError, match="interruptible"):
        server.pause()
    with pytest.raises(RuntimeError):
        server.interruptible()


def test_two_servers_on_one_core_share_it_equally() -> None:
    loop = EventLoop()
    host = Host(loop, 1.0)
    a, b = Server(loop, host), Server(loop, host)
    done_a = _finishes(loop, a, [1.0])
    done_b = _finishes(loop, b, [1.0], at=0.5)
    loop.run()
    # a runs alone for 0.5 s, then both at half speed: a needs 1.0 s more, b finishes 0.5 s after that.
    assert done_a == [pytest.approx(1.5)]
    assert done_b == [pytest.approx(2.0)]


def test_background_load_and_demand_set_the_speed() -> None:
    loop = EventLoop()
    host = Host(loop, 2.0, background=1.0)
    server = Server(loop, host, demand=2.0)
    done = _finishes(loop, server, [1.0])
    loop.run()
    assert done == [pytest.approx(1.5)]  # 2 cores shared by a demand of 3: two thirds of full speed


def test_a_paused_server_makes_no_progress_and_frees_the_host() -> None:
    loop = EventLoop()
    host = Host(loop, 1.0)
    a, b = Server(loop, host), Server(loop, host)
    done_a = _finishes(loop, a, [1.0])
    done_b = _finishes(loop, b, [1.0])
    loop.schedule(0.2, lambda _: a.pause())
    loop.schedule(1.2, lambda _: a.resume())
    loop.run()
    # 0-0.2 both at half speed (0.1 each); b alone until 1.1; a alone from 1.2 with 0.9 left.
    assert done_b == [pytest.approx(1.1)]
    assert done_a == [pytest.approx(2.1)]


def test_abort_returns_everything_in_hand_and_nothing_completes() -> None:
    loop = EventLoop()
    server = Server(loop, Host(loop, 1.0))
    server.interruptible()
    done = _finishes(loop, server, [1.0, 1.0])
    loop.schedule(0.5, lambda _: lost.extend(server.abort()))
    lost: list[object] = []
    loop.run()
    assert done == [] and len(lost) == 2 and server.busy_seconds() == 0.0


def test_bad_capacity_and_demand_are_refused() -> None:
    loop = EventLoop()
    with pytest.raises(ValueError):
        Host(loop, 0.0)
    with pytest.raises(ValueError):
        Host(loop, 1.0, background=-1.0)
    with pytest.raises(ValueError):
        Server(loop, Host(loop, 1.0), demand=0.0)


def test_equal_finish_times_complete_in_start_order() -> None:
    # A speed change reschedules the running servers in the order they started, so ties between equal
    # finish times break the same way in every process (in a set's address order they did not). Many
    # fresh hosts, so that address order would differ from start order in some of them.
    for _ in range(32):
        loop = EventLoop()
        host = Host(loop, 1.0, shared=True)
        servers = [Server(loop, host, name=name) for name in "abc"]
        done: list[str] = []
        for server in servers:
            server.submit(1.0, done.append, server.name)
        loop.run()
        assert done == ["a", "b", "c"]
