"""The packet delayer's schedule on a fake clock with fake packets (the kernel side is in test_netns)."""

from __future__ import annotations

from fleetserve.bench.nfdelay import Delayer


class Packet:
    def __init__(self, log: list[str], name: str) -> None:
        self.log, self.name = log, name

    def accept(self) -> None:
        self.log.append(self.name)


def test_packets_pass_in_order_once_their_delay_is_over() -> None:
    now = [100.0]
    delayer = Delayer(2.0, clock=lambda: now[0])
    accepted: list[str] = []
    delayer.hold(Packet(accepted, "a"))
    now[0] += 0.5
    delayer.hold(Packet(accepted, "b"))
    assert delayer.due() == 1.5
    now[0] += 1.4
    assert delayer.release_due() == 0 and accepted == []
    now[0] += 0.1
    assert delayer.release_due() == 1 and accepted == ["a"]
    now[0] += 0.5
    assert delayer.release_due() == 1 and accepted == ["a", "b"]
    assert delayer.due() is None


def test_flush_lets_everything_through_at_once() -> None:
    delayer = Delayer(60.0, clock=lambda: 0.0)
    accepted: list[str] = []
    for name in "xyz":
        delayer.hold(Packet(accepted, name))
    assert delayer.flush() == 3 and accepted == ["x", "y", "z"]


def test_release_loop_flushes_and_calls_back_on_stop() -> None:
    delayer = Delayer(60.0)
    accepted: list[str] = []
    stopped: list[bool] = []
    delayer.hold(Packet(accepted, "held"))
    delayer.stopping.set()
    delayer.run_releases(lambda: stopped.append(True))
    assert accepted == ["held"] and stopped == [True]
