"""The simulator against queueing theory, and the product's balancing behaviour under faults.

Small scale, fixed seeds: every expectation is either an analytic result (Pollaczek–Khinchine for an M/G/1
queue) or a comparison between two runs that differ in one setting.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from fleetserve.batching.config import BatcherConfig
from fleetserve.gateway.edge.config import AdaptiveConcurrencyConfig
from fleetserve.sim.arrivals import ArrivalConfig
from fleetserve.sim.config import ReplicaGroup, SimConfig
from fleetserve.sim.faults import Fault
from fleetserve.sim.gateway import BalancerConfig
from fleetserve.sim.profile import LengthMix
from fleetserve.sim.scaling import FixedSize, FleetSnapshot, ScalingConfig
from fleetserve.sim.simulator import Simulation, simulate
from tests.sim.support import linear_profile

NO_BATCHING = BatcherConfig(max_batch=1, max_delay_s=0.0)


def _config(replicas: int = 4, rate: float = 2000.0, policy: str = "p2c-peak-ewma", **kw: object) -> SimConfig:
    defaults: dict[str, object] = dict(
        groups=(ReplicaGroup(linear_profile(base_s=0.001, cv=0.2), replicas),),
        arrivals=ArrivalConfig("poisson", rate=rate), requests=20_000, warmup_s=0.5,
        balancer=BalancerConfig(policy=policy), batcher=NO_BATCHING,
    )
    defaults.update(kw)
    return SimConfig(**defaults)  # type: ignore[arg-type]


@pytest.mark.parametrize("cv", [0.0, 0.5])
def test_one_replica_without_batching_is_an_mg1_queue(cv: float) -> None:
    service, rate = 0.001, 600.0
    rho = rate * service
    expected = service + rate * service**2 * (1 + cv * cv) / (2 * (1 - rho))  # Pollaczek–Khinchine
    result = simulate(_config(1, rate, groups=(ReplicaGroup(linear_profile(base_s=service, cv=cv), 1),),
                              requests=60_000, warmup_s=5.0, seed=3))
    assert result.latency_s["mean"] == pytest.approx(expected, rel=0.04)
    assert result.utilisation == pytest.approx(rho, rel=0.03)
    assert result.error_count == 0


def test_a_lone_request_waits_for_the_batchers_delay() -> None:
    result = simulate(_config(1, 20.0, batcher=BatcherConfig(max_batch=8, max_delay_s=0.002),
                              groups=(ReplicaGroup(linear_profile(base_s=0.001), 1),), requests=500))
    assert result.p("p50") == pytest.approx(0.003, abs=1e-6)


def test_a_lone_request_pays_every_measured_part_once() -> None:
    """Gateway CPU and wait, replica CPU and wait, the batcher's delay and its timer's lag, an idle engine call."""
    profile = linear_profile(base_s=0.004, idle_extra_s=0.001, gateway_cpu_s=0.001, gateway_wall_s=0.0025,
                             replica_cpu_s=0.0015, replica_wall_s=0.002, timer_lag_s=0.0003)
    result = simulate(_config(1, 5.0, batcher=BatcherConfig(max_batch=8, max_delay_s=0.002),
                              groups=(ReplicaGroup(profile, 1),), requests=200))
    expected = 0.0025 + 0.002 + 0.002 + 0.0003 + 0.005
    assert result.p("p50") == pytest.approx(expected, abs=1e-6)


def test_an_engine_straight_on_from_a_batch_runs_at_the_back_to_back_speed() -> None:
    """Requests arriving while the engine is busy queue up; the batches that go straight on cost the
    back-to-back timing, only the one after an idle spell the after-idle timing."""
    profile = linear_profile(base_s=0.004, idle_extra_s=0.003)
    lone = simulate(_config(1, 5.0, batcher=NO_BATCHING, groups=(ReplicaGroup(profile, 1),), requests=200))
    busy = simulate(_config(1, 200.0, batcher=NO_BATCHING, groups=(ReplicaGroup(profile, 1),), requests=4000))
    assert lone.p("p50") == pytest.approx(0.007, abs=1e-6)
    # Busy time per request: were every call an idle one (7 ms), 200 req/s would need 1.4 engines.
    assert busy.error_count == 0 and busy.utilisation / 200.0 < 0.0055


def test_a_wait_shorter_than_the_profiles_idle_threshold_keeps_the_back_to_back_speed() -> None:
    """At 5 req/s the engine waits ~200 ms between requests: an idle spell past a 10 ms threshold, not a 10 s one."""
    def lone_p50(idle_after_s: float) -> float:
        profile = linear_profile(base_s=0.004, idle_extra_s=0.003, idle_after_s=idle_after_s)
        return simulate(_config(1, 5.0, batcher=NO_BATCHING, groups=(ReplicaGroup(profile, 1),), requests=200)).p("p50")

    assert (lone_p50(0.01), lone_p50(10.0)) == pytest.approx((0.007, 0.004), abs=1e-6)


@pytest.mark.parametrize("part", ["replica", "gateway"])
def test_a_request_that_finds_its_process_busy_pays_the_busy_cpu(part: str) -> None:
    """A lone request costs the one-in-flight CPU; under load, requests that find the event loop (or gateway
    worker) busy cost the busy figure, so 400 req/s that would need 1.6 loops at 4 ms each are served."""
    costs = {f"{part}_cpu_s": 0.004, f"{part}_busy_cpu_s": 0.001}
    profile = linear_profile(base_s=0.0001, **costs)  # type: ignore[arg-type]
    lone = simulate(_config(1, 5.0, groups=(ReplicaGroup(profile, 1),), requests=200))
    assert lone.p("p50") == pytest.approx(0.0041, abs=1e-6)
    busy = simulate(_config(1, 400.0, groups=(ReplicaGroup(profile, 1),), requests=8000, seed=1))
    unmeasured = simulate(_config(1, 400.0, groups=(ReplicaGroup(replace(profile, **{f"{part}_busy_cpu_s": None}), 1),),
                                  requests=8000, seed=1))
    assert busy.error_count == 0 and busy.p("p99") < 0.05
    assert unmeasured.p("p99") > 10 * busy.p("p99")  # 1.6x its capacity: the queue only grows


@pytest.mark.parametrize("part", ["replica", "gateway"])
def test_a_request_pays_the_cpu_measured_with_as_many_in_flight_as_its_process_has_in_hand(part: str) -> None:
    """With a CPU curve, a lone request costs the one-in-flight figure and one that arrives with another in hand
    the two-in-flight figure, whether or not the loop is busy at that instant; every request is let go."""
    profile = replace(linear_profile(base_s=0.0001, **{f"{part}_cpu_s": 0.004}),  # type: ignore[arg-type]
                      **{f"{part}_cpu_curve": ((1, 0.004), (2, 0.001))})
    lone = simulate(_config(1, 5.0, groups=(ReplicaGroup(profile, 1),), requests=200))
    assert lone.p("p50") == pytest.approx(0.0041, abs=1e-6)
    sim = Simulation(_config(1, 400.0, groups=(ReplicaGroup(profile, 1),), requests=8000, seed=1))
    loaded = sim.run()
    assert loaded.error_count == 0 and loaded.p("p99") < 0.05
    assert sim.replicas[0].in_hand == 0 and all(w.in_hand == 0 for w in sim.workers)
    flat = replace(profile, **{f"{part}_cpu_curve": ((1, 0.004), (2, 0.004))})  # type: ignore[arg-type]
    assert simulate(_config(1, 400.0, groups=(ReplicaGroup(flat, 1),), requests=8000, seed=1)).p("p99") > 10 * loaded.p(
        "p99")  # 1.6x its capacity: the queue only grows


def test_batches_grow_with_load() -> None:
    batching = BatcherConfig(max_batch=32, max_delay_s=0.002)
    profile = linear_profile(base_s=0.001, per_row_s=0.0002)
    light = simulate(_config(1, 100.0, batcher=batching, groups=(ReplicaGroup(profile, 1),)))
    heavy = simulate(_config(1, 2500.0, batcher=batching, groups=(ReplicaGroup(profile, 1),)))
    assert light.mean_batch < 1.3 < 4 < heavy.mean_batch


def test_a_run_is_a_function_of_its_seed() -> None:
    def outcome(seed: int) -> dict[str, object]:
        data = simulate(_config(seed=seed, faults=(Fault.parse("throttle:0"),))).to_json()
        data.pop("wall_s")
        return data

    assert outcome(1) == outcome(1)
    assert outcome(1) != outcome(2)


def test_p2c_routes_around_a_throttled_replica_and_round_robin_does_not() -> None:
    faults = (Fault.parse("throttle:0"),)
    p2c = simulate(_config(faults=faults))
    rr = simulate(_config(policy="round-robin", faults=faults))
    healthy = simulate(_config())
    assert p2c.p("p99") < 3 * healthy.p("p99")
    assert rr.p("p99") > 20 * p2c.p("p99")


def test_a_crashed_replica_is_ejected_retried_around_and_back_after_its_cold_start() -> None:
    config = _config(faults=(Fault.parse("crash:0@2"),), requests=30_000)
    sim = Simulation(config)
    before: list[int] = []
    sim.loop.schedule(2.0, lambda _: before.append(sim.replicas[0].batches))
    result = sim.run()
    assert result.error_count == 0
    assert result.retries > 0
    # Cold start 1 s + restart 0.5 s + two passing probes: serving again well before the run ends (15 s).
    assert sim.replicas[0].batches > before[0] + 100


def test_p2c_sends_less_to_a_slow_replica() -> None:
    sim = Simulation(_config(faults=(Fault.parse("slow:0x4"),), rate=1500.0))
    sim.run()
    slow, *others = (r.batched_rows for r in sim.replicas)
    assert slow < 0.6 * min(others)


def test_weights_split_traffic_for_weighted_round_robin() -> None:
    heavy = ReplicaGroup(linear_profile(name="big"), 1, weight=3)
    light = ReplicaGroup(linear_profile(name="small"), 1, weight=1)
    sim = Simulation(_config(policy="weighted-round-robin", groups=(heavy, light), rate=800.0))
    sim.run()
    big, small = (r.batched_rows for r in sim.replicas)
    assert big / small == pytest.approx(3.0, rel=0.02)


def test_queue_aware_reads_the_replicas_load_reports() -> None:
    faults = (Fault.parse("slow:0x4"),)
    sim = Simulation(_config(policy="queue-aware", faults=faults, rate=1500.0))
    result = sim.run()
    slow, *others = (r.batched_rows for r in sim.replicas)
    assert result.error_count == 0 and slow < min(others)


def test_replicas_sharing_a_host_share_its_cores() -> None:
    profile = replace(linear_profile(base_s=0.002), device="cpu")
    group = (ReplicaGroup(profile, 2),)
    roomy = simulate(_config(2, 600.0, groups=group, shared_host_cores=2.0))
    cramped = simulate(_config(2, 600.0, groups=group, shared_host_cores=1.0))
    assert roomy.latency_s["mean"] < 0.8 * cramped.latency_s["mean"]


def test_a_full_queue_answers_503_and_the_gateway_retries_elsewhere() -> None:
    tight = BatcherConfig(max_batch=1, max_delay_s=0.0, max_queue=2)
    result = simulate(_config(2, 1900.0, policy="round-robin", batcher=tight, max_retries=1))
    assert result.retries > 0
    assert "overloaded_503" in result.errors


class _Grow:
    def __init__(self) -> None:
        self.seen: list[FleetSnapshot] = []

    def desired(self, snapshot: FleetSnapshot) -> int:
        self.seen.append(snapshot)
        return 4


def test_a_scaling_rule_adds_replicas_after_their_cold_start() -> None:
    rule = _Grow()
    config = _config(2, 1000.0, requests=10_000, scaling=ScalingConfig(rule, interval_s=1.0, cold_start_s=2.0))
    sim = Simulation(config)
    sim.run()
    assert len(sim.replicas) == 4
    first, later = rule.seen[0], rule.seen[-1]
    assert (first.ready, first.starting) == (2, 0)
    assert first.arrival_rate == pytest.approx(1000, rel=0.1)
    assert later.ready == 4
    assert sum(r.batches > 0 for r in sim.replicas) == 4


def test_fixed_size_keeps_the_fleet() -> None:
    sim = Simulation(_config(3, 1000.0, requests=5000, scaling=ScalingConfig(FixedSize(), interval_s=0.5)))
    sim.run()
    assert len(sim.replicas) == 3


class _Shrink:
    def desired(self, snapshot: FleetSnapshot) -> int:
        return 1


def test_scaling_down_drains_the_newest_replicas_and_loses_nothing() -> None:
    sim = Simulation(_config(3, 600.0, requests=8000, scaling=ScalingConfig(_Shrink(), interval_s=2.0)))
    result = sim.run()
    assert [r.name for r in sim.replicas] == ["replica-0"]
    assert result.error_count == 0 and result.ok > 0


class _UpThenDown:
    def __init__(self) -> None:
        self.ticks = 0

    def desired(self, snapshot: FleetSnapshot) -> int:
        self.ticks += 1
        return 3 if self.ticks == 1 else 2


def test_a_replica_retired_while_starting_never_joins() -> None:
    scaling = ScalingConfig(_UpThenDown(), interval_s=1.0, cold_start_s=5.0)
    sim = Simulation(_config(2, 600.0, requests=6000, scaling=scaling))
    sim.run()
    assert [r.name for r in sim.replicas] == ["replica-0", "replica-1"]
    assert all(worker.balancer.names() == ["replica-0", "replica-1"] for worker in sim.workers)


def test_the_gateways_adaptive_limit_refuses_an_overloads_excess_and_admitted_requests_keep_their_latency() -> None:
    overload = dict(rate=3000.0, requests=30_000, warmup_s=2.0, seed=5)  # 3x one replica's 1,000 requests/s
    unlimited = simulate(_config(1, **overload))  # type: ignore[arg-type]
    limited = simulate(_config(1, adaptive=AdaptiveConcurrencyConfig(), **overload))  # type: ignore[arg-type]
    assert "limited_503" not in unlimited.errors and unlimited.p("p99") > 0.5  # the queue grows until it is full
    assert limited.errors["limited_503"] > 0.5 * limited.requests  # the excess is refused at once
    assert limited.p("p99") < 0.1 * unlimited.p("p99")
    assert limited.goodput_rps > 0.9 * 1000


def test_the_limit_refuses_nothing_while_the_scaling_rule_may_still_add_replicas() -> None:
    overload = dict(rate=3000.0, requests=20_000, adaptive=AdaptiveConcurrencyConfig())
    growing = simulate(_config(1, scaling=ScalingConfig(_Grow(), interval_s=1.0, cold_start_s=2.0),  # type: ignore[arg-type]
                               **overload))
    at_max = simulate(_config(1, scaling=ScalingConfig(_Grow(), interval_s=1.0, cold_start_s=2.0,  # type: ignore[arg-type]
                                                       max_replicas=1), **overload))
    reaching = simulate(_config(1, scaling=ScalingConfig(_Grow(), interval_s=1.0, cold_start_s=2.0,  # type: ignore[arg-type]
                                                         max_replicas=4), **overload))
    assert "limited_503" not in growing.errors
    assert at_max.errors["limited_503"] > 0
    # Growing to its maximum of 4 (4,000 requests/s): the limit stands aside until they are ready, not started,
    # and then takes over from the in-flight they carried instead of refusing nearly everything.
    assert reaching.errors.get("limited_503", 0) < 0.01 * reaching.requests


def test_short_and_long_requests_are_reported_apart_with_their_engine_time() -> None:
    """Lone requests on an engine whose calls take 1 ms per 16 tokens: 16-token requests take 1 ms, 128-token ones
    8 ms, and a request's engine time averages 3 of the first to 1 of the second."""
    base = linear_profile()
    service = tuple(tuple(replace(row[0], mean_s=0.001 * s / 16, std_s=0.0) for s in base.seq_lengths)
                    for row in base.service)
    profile = replace(base, service=service, lengths=LengthMix((16, 128), (3.0, 1.0)))
    config = _config(1, 20.0, groups=(ReplicaGroup(profile, 1),), requests=2000, split_tokens=40)
    result = simulate(config)
    short, long = result.latency_by_length["short"], result.latency_by_length["long"]
    assert short["p50"] == pytest.approx(0.001, rel=0.02) and long["p50"] == pytest.approx(0.008, rel=0.02)
    assert result.engine_s_per_request == pytest.approx(0.25 * 0.008 + 0.75 * 0.001, rel=0.1)
    assert result.to_json()["latency_by_length_ms"]["long"]["p50"] == pytest.approx(8.0, rel=0.02)
    assert simulate(replace(config, split_tokens=None)).latency_by_length == {}
    with pytest.raises(ValueError, match="split_tokens"):
        replace(config, split_tokens=0)
