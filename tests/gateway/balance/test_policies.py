"""The policy contract, run against every registered policy, then each policy's own algorithm."""

import random
from collections import Counter

import pytest

from fleetserve.gateway.balance import Balancer, BalancerConfig
from fleetserve.gateway.balance.discovery import Insert
from fleetserve.gateway.balance.endpoint import Endpoint
from fleetserve.gateway.balance.load import (
    EndpointLoad,
    LoadConfig,
)
from fleetserve.gateway.balance.policies import POLICIES, RequestContext, create_policy, load_policy, policy_names
from fleetserve.gateway.balance.policies.base import Policy
from fleetserve.gateway.balance.slowstart import SlowStartConfig
from fleetserve.wire import encode_load_report
from tests.support.clock import FakeClock

CTX = RequestContext(path="/v2/models/minilm/infer", request_id="r1")


def fleet(n: int) -> list[Endpoint]:
    return [Endpoint.from_url(f"http://10.0.0.{i}:8000") for i in range(1, n + 1)]


def balancer_with(policy: str, n: int) -> tuple[Balancer, list[Endpoint], FakeClock]:
    clock = FakeClock(100.0)
    balancer = Balancer(BalancerConfig(policy=policy), clock=clock, rng=random.Random(7))
    endpoints = fleet(n)
    for ep in endpoints:
        balancer.apply(Insert(ep))
    return balancer, endpoints, clock


ALL = pytest.mark.parametrize("policy", sorted(POLICIES))


# -- contract ---------------------------------------------------------------------------------------


def test_registry_imports_every_policy_lazily() -> None:
    assert set(policy_names()) == set(POLICIES)
    for name in POLICIES:
        assert callable(load_policy(name))
    with pytest.raises(ValueError, match="unknown balancing policy 'nope'; choose one of"):
        load_policy("nope")


@ALL
def test_one_endpoint_is_always_chosen(policy: str) -> None:
    balancer, (only,), _ = balancer_with(policy, 1)
    assert all(balancer.pick(CTX) == only for _ in range(20))


@ALL
def test_no_endpoint_gives_none(policy: str) -> None:
    balancer, endpoints, _ = balancer_with(policy, 0)
    assert balancer.pick(CTX) is None
    balancer, endpoints, _ = balancer_with(policy, 2)
    assert balancer.pick(CTX, exclude=endpoints) is None


@ALL
def test_never_picks_excluded(policy: str) -> None:
    balancer, endpoints, _ = balancer_with(policy, 3)
    excluded = {endpoints[1]}
    picked = Counter(balancer.pick(CTX, exclude=excluded) for _ in range(300))
    assert endpoints[1] not in picked
    assert set(picked) == {endpoints[0], endpoints[2]}


@ALL
def test_never_picks_ejected_or_unhealthy_outside_panic(policy: str) -> None:
    balancer, endpoints, _ = balancer_with(policy, 4)
    sick, ejected = endpoints[0], endpoints[1]
    for _ in range(3):
        balancer.set_probe_result(sick, False)
    for _ in range(5):
        balancer.start(ejected).finish(status=503, latency_s=0.01)
    assert not balancer.panic
    picked = Counter(balancer.pick(CTX) for _ in range(300))
    assert set(picked) == {endpoints[2], endpoints[3]}


@ALL
def test_panic_routes_to_all(policy: str) -> None:
    balancer, endpoints, _ = balancer_with(policy, 4)
    for ep in endpoints[:3]:
        for _ in range(3):
            balancer.set_probe_result(ep, False)
    assert balancer.panic
    picked = Counter(balancer.pick(CTX) for _ in range(400))
    assert set(picked) == set(endpoints)


@ALL
def test_spreads_over_equal_endpoints_request_by_request(policy: str) -> None:
    balancer, endpoints, clock = balancer_with(policy, 4)
    for warm in endpoints:  # equal = the same measured latency, not just the same default
        balancer.start(warm).finish(status=200, latency_s=0.02)
    picked: Counter[Endpoint] = Counter()
    for _ in range(800):
        ep = balancer.pick(CTX)
        assert ep is not None
        picked[ep] += 1
        clock.now += 0.001
        balancer.start(ep).finish(status=200, latency_s=0.02)
    assert set(picked) == set(endpoints)
    assert min(picked.values()) >= 800 / 4 * 0.5


@ALL
def test_spreads_a_burst_of_concurrent_requests(policy: str) -> None:
    balancer, endpoints, _ = balancer_with(policy, 4)
    picked: Counter[Endpoint] = Counter()
    for _ in range(40):
        ep = balancer.pick(CTX)
        assert ep is not None
        picked[ep] += 1
        balancer.start(ep)
    assert set(picked) == set(endpoints)
    assert max(picked.values()) <= 40 / 4 * 2


# -- per-policy algorithms (policies driven directly, no balancer) ----------------------------------


class Signals:
    def __init__(self, endpoints: list[Endpoint], clock: FakeClock, slow_start_s: float = 0.0) -> None:
        cfg = LoadConfig(ewma_default_rtt_s=0.05, report_max_age_s=5.0)
        ss = SlowStartConfig(window_s=slow_start_s)
        self.loads = {ep: EndpointLoad(ep.weight, cfg, ss, clock.now) for ep in endpoints}

    def load(self, ep: Endpoint) -> EndpointLoad:
        return self.loads[ep]


def make(name: str, endpoints: list[Endpoint], seed: int = 1) -> tuple[Policy, Signals, FakeClock]:
    clock = FakeClock(100.0)
    signals = Signals(endpoints, clock)
    return create_policy(name, signals, clock=clock, rng=random.Random(seed)), signals, clock


def test_round_robin_cycles_in_order() -> None:
    eps = fleet(3)
    policy, _, _ = make("round-robin", eps)
    seq = [policy.choose(eps, CTX) for _ in range(9)]
    first = eps.index(seq[0])
    assert seq == [eps[(first + i) % 3] for i in range(9)]


def test_smooth_weighted_round_robin_matches_nginx_sequence() -> None:
    a = Endpoint.from_url("http://a:1", weight=5)
    b = Endpoint.from_url("http://b:1", weight=1)
    c = Endpoint.from_url("http://c:1", weight=1)
    policy, _, _ = make("weighted-round-robin", [a, b, c])
    names = "".join(policy.choose([a, b, c], CTX).host for _ in range(14))
    assert names == "aabacaa" * 2


def test_weighted_round_robin_forget_resets_state() -> None:
    a = Endpoint.from_url("http://a:1", weight=2)
    b = Endpoint.from_url("http://b:1", weight=1)
    policy, _, _ = make("weighted-round-robin", [a, b])
    assert policy.choose([a, b], CTX) == a
    policy.forget(a)
    policy.forget(b)
    assert "".join(policy.choose([a, b], CTX).host for _ in range(3)) == "aba"


def test_least_pending_avoids_the_busy_endpoint() -> None:
    eps = fleet(3)
    policy, signals, _ = make("least-pending", eps)
    signals.loads[eps[0]].pending = 4
    picked = Counter(policy.choose(eps, CTX) for _ in range(300))
    assert eps[0] not in picked
    assert picked[eps[1]] > 100 and picked[eps[2]] > 100


def test_least_pending_respects_weight() -> None:
    light = Endpoint.from_url("http://light:1", weight=1)
    heavy = Endpoint.from_url("http://heavy:1", weight=3)
    policy, signals, _ = make("least-pending", [light, heavy])
    signals.loads[light].pending = 1
    signals.loads[heavy].pending = 3
    # (1+1)/1 = 2 vs (3+1)/3 = 1.33: the heavy one still has room.
    assert policy.choose([light, heavy], CTX) == heavy


def observe(signals: Signals, ep: Endpoint, latency: float, now: float) -> None:
    signals.loads[ep].ewma.observe(latency, now)


def test_peak_ewma_prefers_the_fast_endpoint() -> None:
    fast, slow = fleet(2)
    policy, signals, clock = make("p2c-peak-ewma", [fast, slow])
    observe(signals, fast, 0.010, clock.now)
    observe(signals, slow, 0.060, clock.now)
    assert all(policy.choose([fast, slow], CTX) == fast for _ in range(50))
    # Pending work counts too: at 7 in flight the fast one costs more than the idle slow one.
    signals.loads[fast].pending = 7
    assert policy.choose([fast, slow], CTX) == slow


def test_peak_ewma_reacts_to_a_latency_spike_and_recovers() -> None:
    a, b = fleet(2)
    policy, signals, clock = make("p2c-peak-ewma", [a, b])
    for _ in range(20):
        clock.now += 0.5
        observe(signals, a, 0.010, clock.now)
        observe(signals, b, 0.020, clock.now)
    assert policy.choose([a, b], CTX) == a
    observe(signals, a, 0.300, clock.now)  # one slow response (GC pause, throttled GPU)
    assert policy.choose([a, b], CTX) == b
    for _ in range(60):  # a answers fast again; the peak fades over a few tau
        clock.now += 1.0
        observe(signals, a, 0.010, clock.now)
        observe(signals, b, 0.020, clock.now)
    assert policy.choose([a, b], CTX) == a


def test_peak_ewma_fast_failures_do_not_attract_traffic() -> None:
    failing, healthy = fleet(2)
    policy, signals, clock = make("p2c-peak-ewma", [failing, healthy])
    observe(signals, healthy, 0.030, clock.now)
    for _ in range(3):
        signals.loads[failing].ewma.observe_failure(0.0005, clock.now)
    assert policy.choose([failing, healthy], CTX) == healthy


def test_queue_aware_avoids_the_deep_queue() -> None:
    eps = fleet(3)
    policy, signals, clock = make("queue-aware", eps)
    for ep, depth in zip(eps, ("30", "2", "9"), strict=True):
        signals.loads[ep].report(f"TEXT named_metrics.queue_depth={depth}", clock.now)
    picked = Counter(policy.choose(eps, CTX) for _ in range(300))
    # Two random choices, the shallower queue wins: the deepest never, the shallowest whenever drawn.
    assert eps[0] not in picked
    assert picked[eps[1]] > 150 and picked[eps[2]] > 50


def test_queue_aware_avoids_a_throttled_or_saturated_gpu() -> None:
    a, b = fleet(2)
    policy, signals, clock = make("queue-aware", [a, b])
    signals.loads[a].report(encode_load_report(1, 0, gpu={"gpu_throttled": 1}), clock.now)
    signals.loads[b].report(encode_load_report(2, 0), clock.now)
    assert policy.choose([a, b], CTX) == b
    signals.loads[a].report(encode_load_report(1, 0, gpu={"gpu_throttled": 0, "gpu_utilization": 1.0}), clock.now)
    signals.loads[b].report(encode_load_report(1, 0, gpu={"gpu_utilization": 0.2}), clock.now)
    assert policy.choose([a, b], CTX) == b


def test_queue_aware_counts_requests_sent_since_the_report() -> None:
    a, b = fleet(2)
    policy, signals, clock = make("queue-aware", [a, b])
    signals.loads[a].report(encode_load_report(0, 0), clock.now)
    signals.loads[b].report(encode_load_report(3, 0), clock.now)
    assert policy.choose([a, b], CTX) == a
    signals.loads[a].pending = signals.loads[a].sent_since_report = 6  # sent after a's report was taken
    assert policy.choose([a, b], CTX) == b
    signals.loads[a].report(encode_load_report(0, 0), clock.now)  # the next report includes them
    assert policy.choose([a, b], CTX) == a


def test_queue_aware_falls_back_to_local_pending_when_reports_are_stale() -> None:
    a, b = fleet(2)
    policy, signals, clock = make("queue-aware", [a, b])
    signals.loads[a].report(encode_load_report(50, 0), clock.now)
    signals.loads[b].pending = 2
    assert policy.choose([a, b], CTX) == b
    clock.now += 10.0  # a's report is older than report_max_age_s
    assert policy.choose([a, b], CTX) == a


def test_p2c_peak_ewma_does_not_starve_a_new_endpoint() -> None:
    """A never-sampled endpoint competes on pending work, not on a default far above a warm fleet's latency."""





    clock = FakeClock()
    balancer = Balancer(BalancerConfig(policy="p2c-peak-ewma"), clock=clock, rng=random.Random(3))
    warm = [Endpoint.from_url(f"http://10.0.0.{i}:8000") for i in (1, 2)]
    for ep in warm:
        balancer.apply(Insert(ep))
    ctx = RequestContext("POST", "/inference", 0, {}, "r")
    for _ in range(50):  # sequential light load: the fleet's latency settles at 3 ms
        ep = balancer.pick(ctx)
        assert ep is not None
        balancer.start(ep).finish(status=200, latency_s=0.003)
        clock.advance(0.01)
    new = Endpoint.from_url("http://10.0.0.3:8000")
    balancer.apply(Insert(new))
    picks = []
    for _ in range(60):
        ep = balancer.pick(ctx)
        assert ep is not None
        picks.append(ep)
        balancer.start(ep).finish(status=200, latency_s=0.003)
        clock.advance(0.01)
    assert picks.count(new) >= 10
