"""The gradient concurrency controller on a fake clock: exact rules step by step, then a small discrete-event
fleet (latency flat up to a knee of concurrency, then growing with the queue) for growth, shrinking and
recovery."""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from fleetserve.gateway.edge.adaptive import MAX_SAMPLES, GradientController, Token, percentile
from fleetserve.gateway.edge.config import AdaptiveConcurrencyConfig


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def controller(clock: FakeClock, seed: int = 1, **overrides: object) -> GradientController:
    """Step-by-step tests update on a single sample, start with Envoy's minRTT window (forced windows on) and
    keep Envoy's 25% RTT buffer and no latency floor (Envoy has none); the fleet simulations below use the
    defaults."""
    settings: dict[str, object] = {"enabled": True, "min_rtt_interval_s": 60.0, "min_update_samples": 1,
                                   "rtt_buffer_percent": 25.0, "latency_floor_ms": 0.0, **overrides}
    return GradientController(AdaptiveConcurrencyConfig(**settings), clock, random.Random(seed))  # type: ignore[arg-type]


def finish_min_rtt_window(c: GradientController, clock: FakeClock, latency: float, samples: int = 50) -> None:
    """Complete the open minRTT window with ``samples`` requests of ``latency``, one at a time."""
    assert c.measuring_min_rtt
    for _ in range(samples):
        token = c.try_acquire()
        assert token is not None
        clock.now += latency
        c.release(token, latency, ok=True)
    assert not c.measuring_min_rtt


def test_percentile_is_nearest_rank() -> None:
    assert percentile([5.0, 1.0, 3.0, 2.0, 4.0], 50) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 100) == 4.0
    assert percentile([7.0], 1) == 7.0


def test_starts_measuring_min_rtt_at_the_floor() -> None:
    clock = FakeClock()
    c = controller(clock)
    assert c.measuring_min_rtt and c.limit == 3 and c.min_rtt is None
    tokens = [c.try_acquire() for _ in range(4)]
    assert tokens[3] is None and all(t is not None for t in tokens[:3])
    assert c.inflight == 3


def test_the_window_ends_after_enough_samples_and_takes_their_median() -> None:
    clock = FakeClock()
    c = controller(clock, min_rtt_samples=5)
    for latency in (0.010, 0.030, 0.020, 0.050, 0.040):
        token = c.try_acquire()
        assert token is not None
        c.release(token, latency, ok=True)
    assert not c.measuring_min_rtt
    assert c.min_rtt == pytest.approx(0.030)


def run_interval(c: GradientController, clock: FakeClock, latency: float, busy: int) -> None:
    """``busy`` requests at once (as many as the limit admits) of ``latency``, then the next update is due."""
    tokens = [t for t in (c.try_acquire() for _ in range(busy)) if t is not None]
    for token in tokens:
        c.release(token, latency, ok=True)
    clock.now += 0.1
    probe = c.try_acquire()  # the due update happens on this call
    if probe is not None:  # that probe request is not part of the workload
        c.release(probe, 0.0, ok=False)


def test_starts_at_the_initial_limit_and_takes_min_rtt_from_the_first_update() -> None:
    clock = FakeClock()
    c = GradientController(AdaptiveConcurrencyConfig(min_update_samples=1), clock, random.Random(1))
    assert not c.measuring_min_rtt and c.limit == 32 and c.min_rtt is None
    tokens = [c.try_acquire() for _ in range(33)]
    assert tokens[32] is None and all(t is not None for t in tokens[:32])  # no start-up window at the floor
    for token in tokens[:32]:
        assert token is not None
        c.release(token, 0.030, ok=True)
    clock.now += 0.1
    c.try_acquire()
    # Fewer than 50 low-load requests so far: the lowest latency seen, theirs (3 of them) or the update's.
    assert c.min_rtt == pytest.approx(0.030) and c.limit > 32


def test_initial_limit_is_kept_within_the_floor_and_ceiling() -> None:
    assert GradientController(AdaptiveConcurrencyConfig(max_concurrency=10)).limit == 10
    assert GradientController(AdaptiveConcurrencyConfig(min_concurrency=50)).limit == 50


def test_limit_grows_by_a_quarter_plus_headroom_while_latency_stays_at_min_rtt() -> None:
    clock = FakeClock()
    c = controller(clock, initial_concurrency=3)
    finish_min_rtt_window(c, clock, 0.010)
    limits = [c.limit]
    for _ in range(4):
        run_interval(c, clock, 0.010, busy=c.limit)
        limits.append(c.limit)
    # gradient = 1.25 (the RTT buffer): 3 -> 3.75 + sqrt(3.75) -> ...
    assert limits == [3, 5, 8, 13, 20]


def test_a_limit_grows_by_its_headroom_alone_until_demand_reaches_it() -> None:
    clock = FakeClock()
    c = controller(clock, min_concurrency=4, initial_concurrency=4)
    finish_min_rtt_window(c, clock, 0.010)
    for _ in range(10):
        run_interval(c, clock, 0.010, busy=1)  # demand keeps in-flight at 1, below half of the limit
    assert c.limit == 4
    run_interval(c, clock, 0.010, busy=2)  # half the limit used, none held back: the headroom, not the gradient
    assert c.limit == 4 + 2
    run_interval(c, clock, 0.010, busy=7)  # the limit held one back: gradient 1.25 (the RTT buffer)
    assert c.limit == int(7.5 + 7.5**0.5)


def fill_and_answer(c: GradientController, clock: FakeClock, answered: int) -> None:
    """One more request than the limit of 32 (refused), ``answered`` of the 32 admitted answered at 10 ms, the
    rest still in flight when the next update is due, 100 ms later."""
    tokens = [c.try_acquire() for _ in range(33)]
    assert tokens.pop() is None
    for token in tokens[:answered]:
        assert token is not None
        c.release(token, 0.010, ok=True)
    clock.now += 0.1
    c.try_acquire()  # the due update happens on this call


def test_a_limit_grows_by_the_headroom_alone_while_a_queue_builds_faster_than_answers_show() -> None:
    """Little's law: 4 answers in 100 ms at 10 ms explain 0.4 requests in flight, not the 28 still there, so the
    low latency is of requests that started before the queue did (the first update of an overload)."""
    limits = []
    for answered in (32, 4):
        clock = FakeClock()
        c = controller(clock, initial_concurrency=32)
        finish_min_rtt_window(c, clock, 0.010)
        fill_and_answer(c, clock, answered)
        limits.append(c.limit)
    assert limits == [int(40 + 40**0.5), int(32 + 32**0.5)]  # gradient 1.25 (the RTT buffer), then 1


def test_the_rate_for_littles_law_is_measured_from_the_end_of_a_min_rtt_window() -> None:
    """A window and its answers are not the rate of the interval after it. After a window of 10 s, 28 answers in
    100 ms at 10 ms explain 2.8 requests in flight, enough for the 4 still there: the gradient applies. After a
    window of 400 answers, 1 answer in 100 ms explains 0.1, not the 31 still there: the headroom alone."""
    clock = FakeClock()
    c = controller(clock, initial_concurrency=32)
    clock.now += 10.0
    finish_min_rtt_window(c, clock, 0.010)
    fill_and_answer(c, clock, 28)
    assert c.limit == int(40 + 40**0.5)  # gradient 1.25 (the RTT buffer)
    clock = FakeClock()
    c = controller(clock, initial_concurrency=32, min_rtt_samples=400)
    finish_min_rtt_window(c, clock, 0.010, samples=400)
    fill_and_answer(c, clock, 1)
    assert c.limit == int(32 + 32**0.5)  # gradient 1


def test_an_app_limited_limit_moves_to_twice_the_peak_but_not_below_the_initial_limit() -> None:
    clock = FakeClock()
    c = controller(clock, initial_concurrency=16)
    finish_min_rtt_window(c, clock, 0.010)
    c._limit = 400  # lifted by a past peak
    for _ in range(10):
        run_interval(c, clock, 0.010, busy=30)  # demand now peaks at 30, latency at minRTT
    assert c.limit == 61  # just over twice the peak: the peak stays below half, and the limit stays put
    for _ in range(3):
        run_interval(c, clock, 0.020, busy=30)  # twice minRTT, beyond the 25% buffer, at the same demand:
    assert c.limit == 61  # refusing what the limit does not hold back would not shorten any queue
    run_interval(c, clock, 0.020, busy=c.limit)  # demand at the limit: the gradient applies in full
    assert c.limit < 61
    c._limit = 4  # as after an overload
    for _ in range(10):
        run_interval(c, clock, 0.010, busy=1)
    assert c.limit == 16  # back to the initial limit at once, not by a quarter per update



def test_a_limit_used_but_never_reached_holds_while_latency_is_up_and_shrinks_once_reached() -> None:
    clock = FakeClock()
    c = controller(clock, initial_concurrency=32)
    finish_min_rtt_window(c, clock, 0.010)
    for _ in range(10):
        run_interval(c, clock, 0.030, busy=20)  # 3x minRTT, 20 of 32 in flight, nothing refused: a slower
    assert c.limit == 32  # fleet at a load it carries, so the limit holds
    run_interval(c, clock, 0.030, busy=40)  # demand reaches the limit: 8 refused, the gradient applies
    assert c.limit < 32

def test_limit_halves_at_most_when_latency_rises() -> None:
    clock = FakeClock()
    c = controller(clock)
    finish_min_rtt_window(c, clock, 0.010)
    c._limit = 100  # a grown limit, as after a calm period
    token = c.try_acquire()
    assert token is not None
    c.release(token, 0.100, ok=True)  # 10x the min RTT: gradient clamps at 0.5
    clock.now += 0.1
    c.try_acquire()
    assert c.limit == int(50 + 50**0.5)
    assert c.sample_rtt == pytest.approx(0.100)


def test_latency_within_the_floor_never_shrinks_the_limit() -> None:
    clock = FakeClock()
    floored = controller(clock, latency_floor_ms=50.0)
    bare = controller(clock)
    for c in (floored, bare):
        finish_min_rtt_window(c, clock, 0.010)
        c._limit = 100
        run_interval(c, clock, 0.040, busy=100)  # 4x minRTT, far past the 25% buffer, but within 50 ms
    assert floored.limit > 100  # gradient 50 / 40: grows
    assert bare.limit < 100  # gradient 12.5 / 40: shrinks
    run_interval(floored, clock, 0.200, busy=floored.limit)  # past the floor: the gradient applies in full
    assert floored.limit < 100


def test_while_unlimited_a_request_at_the_limit_takes_a_slot_all_the_same() -> None:
    clock = FakeClock()
    c = controller(clock, min_rtt_interval_s=0.0, initial_concurrency=4)
    growing = True
    tokens = [c.try_acquire(lambda: growing) for _ in range(6)]
    assert all(tokens) and c.inflight == 6 > c.limit  # counted, so the limit keeps following demand
    growing = False
    assert c.try_acquire(lambda: growing) is None  # at the fleet's maximum the limit applies
    assert list(c._refusals) == [1]  # only the real refusal counts


def test_while_the_fleet_grows_the_limit_follows_what_it_carries_and_never_shrinks() -> None:
    clock = FakeClock()
    c = controller(clock, initial_concurrency=4)
    finish_min_rtt_window(c, clock, 0.010)
    finishing = [c.try_acquire(lambda: True) for _ in range(30)]  # 30 in flight, the limit 4
    clock.now += 0.05
    for token in finishing:
        assert token is not None
        c.release(token, 0.5, ok=True)  # a long queue: far past any buffer
    clock.now += 0.1
    held = [c.try_acquire(lambda: True) for _ in range(2)]  # the update runs here
    assert c.limit >= 30  # takes over from what the fleet carried, then the gradient brings it down
    for token in held:
        assert token is not None
        c.release(token, 0.5, ok=True)
    clock.now += 0.2
    c.try_acquire()
    assert c.limit < 30


def test_failures_return_their_slot_without_a_latency_sample() -> None:
    clock = FakeClock()
    c = controller(clock, min_rtt_samples=2)
    for _ in range(5):
        token = c.try_acquire()
        assert token is not None
        c.release(token, 9.0, ok=False)
    assert c.inflight == 0 and c.measuring_min_rtt  # no sample counted toward the window


def test_a_request_started_before_the_window_gives_no_sample() -> None:
    clock = FakeClock()
    c = controller(clock, min_rtt_samples=2, min_rtt_interval_s=10.0, jitter_percent=0.0)
    finish_min_rtt_window(c, clock, 0.010, samples=2)
    old = c.try_acquire()
    assert old is not None
    clock.now += 10.0
    fresh = c.try_acquire()  # opens the next window, at the floor
    assert fresh is not None and c.measuring_min_rtt
    c.release(old, 5.0, ok=True)  # queued behind the old load: not a no-load latency
    c.release(fresh, 0.020, ok=True)
    assert c.measuring_min_rtt
    last = c.try_acquire()
    assert last is not None
    c.release(last, 0.020, ok=True)
    assert c.min_rtt == pytest.approx(0.020)


def test_release_twice_is_a_bug() -> None:
    clock = FakeClock()
    c = controller(clock)
    token = c.try_acquire()
    assert token is not None
    c.release(token, 0.01, ok=True)
    with pytest.raises(RuntimeError, match="twice"):
        c.release(token, 0.01, ok=True)


def test_min_rtt_follows_requests_admitted_at_low_load_only() -> None:
    clock = FakeClock()
    c = controller(clock, min_concurrency=2)
    finish_min_rtt_window(c, clock, 0.050)
    c._limit = 100
    for _ in range(3):  # requests admitted beside many others: queueing, not the no-load latency
        crowd = [c.try_acquire() for _ in range(10)]
        for token in crowd:
            assert token is not None
            c.release(token, 0.500, ok=True)
        clock.now += 0.1
    assert c.min_rtt == pytest.approx(0.050)
    for _ in range(3):  # slower alone while the limit is high: behind a batch, not a slower fleet
        for _ in range(50):
            token = c.try_acquire()
            assert token is not None and token.low_load
            c.release(token, 0.080, ok=True)
        clock.now += 0.1
        probe = c.try_acquire()
        assert probe is not None
        c.release(probe, 0.0, ok=False)
    assert c.min_rtt == pytest.approx(0.050) and c.limit > 2 * 2
    for _ in range(50):  # alone: the fleet now answers in 20 ms without queueing
        token = c.try_acquire()
        assert token is not None and token.low_load
        c.release(token, 0.020, ok=True)
    clock.now += 0.1
    c.try_acquire()
    assert c.min_rtt == pytest.approx(0.020)


def test_no_forced_window_by_default() -> None:
    clock = FakeClock()
    c = GradientController(AdaptiveConcurrencyConfig(enabled=True), clock, random.Random(1))
    for _ in range(2000):  # 200 s of steady traffic
        run_interval(c, clock, 0.010, busy=c.limit)
        assert not c.measuring_min_rtt


def test_the_limit_waits_for_enough_samples() -> None:
    clock = FakeClock()
    c = controller(clock, min_update_samples=5)
    finish_min_rtt_window(c, clock, 0.010)
    c._limit = 40
    limits = []
    for _ in range(5):  # one slow answer per interval: too few to judge until the fifth
        clock.now += 0.1
        token = c.try_acquire()
        assert token is not None
        c.release(token, 0.100, ok=True)
        limits.append(c.limit)
    assert limits[:4] == [40] * 4 and limits[4] < 40
    assert c.sample_rtt == pytest.approx(0.100)


def test_samples_per_interval_are_bounded() -> None:
    clock = FakeClock()
    c = controller(clock, min_rtt_samples=1)
    finish_min_rtt_window(c, clock, 0.010, samples=1)
    c._limit = 10
    for _ in range(MAX_SAMPLES + 100):
        token = c.try_acquire()
        assert token is not None
        c.release(token, 0.010, ok=True)
    assert len(c._samples) == MAX_SAMPLES


@pytest.mark.parametrize("jitter", [0.0, 15.0])
def test_min_rtt_windows_recur_with_jitter(jitter: float) -> None:
    opened = []
    for seed in (1, 2):
        clock = FakeClock()
        c = controller(clock, seed=seed, min_rtt_samples=2, min_rtt_interval_s=10.0, jitter_percent=jitter)
        finish_min_rtt_window(c, clock, 0.010, samples=2)
        start = clock.now
        while True:
            clock.now += 0.01
            token = c.try_acquire()
            assert token is not None
            if c.measuring_min_rtt:
                break
            c.release(token, 0.010, ok=True)
        opened.append(clock.now - start)
        assert c.limit == 3
    for delay in opened:
        assert 10.0 <= delay < 10.0 * (1 + jitter / 100) + 0.02
    if jitter:
        assert abs(opened[0] - opened[1]) > 0.02  # two gateways do not measure in lockstep
    else:
        assert opened[0] == pytest.approx(opened[1])


@dataclass
class Fleet:
    """Open-loop arrivals into the controller; admitted requests take ``latency(inflight)`` seconds."""

    c: GradientController
    clock: FakeClock
    latency: Callable[[int], float]
    done: list[tuple[float, int, Token, float]] = field(default_factory=list)
    admitted: list[tuple[float, float]] = field(default_factory=list)  # (finish time, latency)
    refused: list[float] = field(default_factory=list)
    _n: int = 0

    def run(self, rate: float, seconds: float) -> None:
        end = self.clock.now + seconds
        next_arrival = self.clock.now
        while next_arrival < end:
            while self.done and self.done[0][0] <= next_arrival:
                finish, _, token, latency = heapq.heappop(self.done)
                self.clock.now = finish
                self.c.release(token, latency, ok=True)
                self.admitted.append((finish, latency))
            self.clock.now = next_arrival
            token = self.c.try_acquire()
            if token is None:
                self.refused.append(self.clock.now)
            else:
                latency = self.latency(self.c.inflight)
                self._n += 1
                heapq.heappush(self.done, (self.clock.now + latency, self._n, token, latency))
            next_arrival += 1 / rate
        self.clock.now = end

    def refused_between(self, start: float, end: float) -> int:
        return sum(start <= t < end for t in self.refused)

    def latencies_between(self, start: float, end: float) -> list[float]:
        return [latency for finish, latency in self.admitted if start <= finish < end]


def knee(base: float, at: int) -> Callable[[int], float]:
    """Latency ``base`` up to ``at`` requests in flight, growing in proportion beyond (a queue forms)."""
    return lambda inflight: base * max(1.0, inflight / at)


def test_under_overload_the_limit_settles_near_the_knee_and_admitted_latency_stays_low() -> None:
    clock = FakeClock()
    c = controller(clock, min_rtt_interval_s=0.0, min_update_samples=20)
    fleet = Fleet(c, clock, knee(0.020, 10))  # capacity: 10 / 0.020 = 500 requests/s
    fleet.run(rate=1500, seconds=10)
    assert 5 <= c.limit <= 30
    assert percentile(fleet.latencies_between(5, 10), 99) <= 3 * 0.020
    # Goodput: what the controller admits is close to what the fleet can do.
    assert len(fleet.latencies_between(5, 10)) / 5 >= 0.8 * 500


def batching(base: float, per_request: float) -> Callable[[int], float]:
    """A batching replica: each request in flight adds ``per_request`` to everyone's latency, yet throughput
    (in-flight / latency) keeps growing with in-flight, as fuller batches use the GPU better."""
    return lambda inflight: base + per_request * inflight


@pytest.mark.parametrize(("floor_ms", "refuses"), [(50.0, False), (0.0, True)])
def test_a_batching_fleet_within_the_floor_is_not_refused(floor_ms: float, refuses: bool) -> None:
    clock = FakeClock()
    c = controller(clock, min_rtt_interval_s=0.0, min_update_samples=20, latency_floor_ms=floor_ms,
                   rtt_buffer_percent=100.0)
    fleet = Fleet(c, clock, batching(0.005, 0.0001))
    fleet.run(rate=200, seconds=2)  # minRTT about 5 ms
    fleet.run(rate=8000, seconds=3)  # settles near 200 in flight at 25 ms: 5x minRTT, half the floor
    assert (fleet.refused_between(3, 5) > 0) is refuses
    if not refuses:
        assert percentile(fleet.latencies_between(3, 5), 99) <= 0.050


def test_the_limit_grows_back_when_load_falls_and_nothing_is_refused() -> None:
    clock = FakeClock()
    c = controller(clock, min_rtt_interval_s=0.0, min_update_samples=20)
    fleet = Fleet(c, clock, knee(0.020, 10))
    fleet.run(rate=1500, seconds=5)
    fleet.run(rate=250, seconds=5)
    assert fleet.refused_between(6, 10) == 0
    assert percentile(fleet.latencies_between(6, 10), 99) <= 1.5 * 0.020


def test_the_limit_never_falls_below_its_floor_and_requests_at_the_floor_carry_the_new_min_rtt() -> None:
    clock = FakeClock()
    c = controller(clock, min_concurrency=4, min_rtt_interval_s=0.0, min_update_samples=20)
    fleet = Fleet(c, clock, knee(0.010, 50))
    fleet.run(rate=200, seconds=2)
    assert c.min_rtt == pytest.approx(0.010)
    fleet.latency = lambda inflight: 0.200  # the fleet got 20x slower
    limits = []
    for _ in range(80):
        fleet.run(rate=200, seconds=0.1)
        limits.append(c.limit)
    assert min(limits) == 4
    # At the floor every request is admitted at low load: their latency became the new normal, and the limit
    # grew back to serve the offered load (40 in flight at 200 requests/s of 200 ms).
    assert c.min_rtt == pytest.approx(0.200)
    assert limits[-1] >= 40


def test_a_steady_closed_loop_with_a_long_tail_is_not_refused_once_the_limit_has_grown() -> None:
    """256 clients that send again as soon as they are answered (5 ms after a refusal), latencies exponential
    around a 30 ms median: once the limit has grown past them, nothing is refused. A long tail in a steady state
    is not queueing: a latency sample that read it as such (twice the median age of the requests in flight, tried
    and reverted, BENCHMARKS.md §4.4) refused 280k requests here."""
    clock = FakeClock()
    c = GradientController(AdaptiveConcurrencyConfig(), clock, random.Random(5))
    rng = random.Random(5)
    events: list[tuple[float, int, Token | None]] = [(rng.random() / 100, n, None) for n in range(256)]
    heapq.heapify(events)
    refused_late = 0
    while events:
        clock.now, n, token = heapq.heappop(events)
        if token is not None:
            c.release(token, clock.now - token.started_at, ok=True)
            if clock.now < 8.0:
                heapq.heappush(events, (clock.now, n, None))
            continue
        token = c.try_acquire()
        if token is None:
            refused_late += clock.now >= 2.0
            heapq.heappush(events, (clock.now + 0.005, n, None))
        else:
            heapq.heappush(events, (clock.now + rng.expovariate(math.log(2) / 0.030), n, token))
    assert refused_late == 0
    assert c.limit > 256
