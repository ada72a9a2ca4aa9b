import json
import random
from typing import Any

import pytest

from fleetserve.gateway.balance import REMOVED, Balancer, BalancerConfig, run_discovery
from fleetserve.gateway.balance.discovery import Insert, Remove, StaticDiscovery
from fleetserve.gateway.balance.endpoint import Endpoint
from fleetserve.gateway.balance.health import HealthState
from fleetserve.gateway.balance.policies import RequestContext
from fleetserve.wire import encode_load_report
from tests.support.clock import FakeClock

CTX = RequestContext()


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []

    def on_eject(self, ep: Endpoint) -> None:
        self.events.append(("eject", ep.url, ""))

    def on_readmit(self, ep: Endpoint) -> None:
        self.events.append(("readmit", ep.url, ""))

    def on_state_change(self, ep: Endpoint, state: str) -> None:
        self.events.append(("state", ep.url, str(state)))


def make(n: int = 3, **config: Any) -> tuple[Balancer, list[Endpoint], FakeClock, Recorder]:
    clock = FakeClock(1000.0)
    recorder = Recorder()
    balancer = Balancer(
        BalancerConfig(policy="round-robin", **config), clock=clock, rng=random.Random(3), observer=recorder
    )
    endpoints = [Endpoint.from_url(f"http://r{i}:8000") for i in range(n)]
    for ep in endpoints:
        balancer.apply(Insert(ep))
    return balancer, endpoints, clock, recorder


def fail(balancer: Balancer, ep: Endpoint, times: int) -> None:
    for _ in range(times):
        balancer.start(ep).finish(status=500, latency_s=0.01)


def test_config_validation_names_the_field() -> None:
    with pytest.raises(ValueError, match="unknown balancing policy 'fastest'"):
        BalancerConfig(policy="fastest")
    with pytest.raises(ValueError, match="panic_threshold_percent"):
        BalancerConfig(panic_threshold_percent=120)
    with pytest.raises(ValueError, match="unhealthy_threshold"):
        BalancerConfig(unhealthy_threshold=0)
    with pytest.raises(ValueError, match="max_ejection_s"):
        BalancerConfig(base_ejection_s=10, max_ejection_s=5)
    with pytest.raises(ValueError, match="slow_start_s"):
        BalancerConfig(slow_start_s=-1)
    with pytest.raises(ValueError, match="retry_budget_percent"):
        BalancerConfig(retry_budget_percent=101)
    with pytest.raises(ValueError, match="ewma_tau_s"):
        BalancerConfig(ewma_tau_s=0)
    assert BalancerConfig().policy == "p2c-peak-ewma"


def test_insert_remove_and_endpoints() -> None:
    balancer, eps, _, recorder = make(2)
    assert balancer.endpoints() == eps
    balancer.apply(Remove(Endpoint.from_url("http://r0:8000")))
    assert balancer.endpoints() == [eps[1]]
    assert ("state", eps[0].url, REMOVED) in recorder.events
    balancer.apply(Remove(eps[0]))  # unknown: ignored
    assert {balancer.pick(CTX) for _ in range(5)} == {eps[1]}


def test_insert_of_a_known_url_updates_weight_and_keeps_load() -> None:
    balancer, eps, _, _ = make(1)
    ticket = balancer.start(eps[0])
    balancer.apply(Insert(Endpoint.from_url(eps[0].url, weight=4)))
    assert balancer.endpoints()[0].weight == 4
    assert balancer.load(eps[0]).weight == 4
    assert balancer.load(eps[0]).pending == 1
    ticket.finish(status=200)
    assert balancer.load(eps[0]).pending == 0


def test_ticket_tracks_pending_and_active_requests_once() -> None:
    balancer, eps, clock, _ = make(2)
    t1, t2 = balancer.start(eps[0]), balancer.start(eps[0])
    assert balancer.load(eps[0]).pending == 2
    assert balancer.active_requests == 2
    clock.now += 0.25
    t1.finish(status=200)
    t1.finish(status=200)  # idempotent
    assert balancer.load(eps[0]).pending == 1
    assert balancer.active_requests == 1
    assert balancer.load(eps[0]).ewma.estimate(clock.now) == pytest.approx(0.25)  # measured by the ticket
    t2.finish(status=None)
    assert balancer.active_requests == 0


def test_finish_reads_replica_reported_load() -> None:
    balancer, eps, _, _ = make(1)
    in_flight = balancer.start(eps[0])
    balancer.start(eps[0]).finish(status=200, latency_s=0.01, report=encode_load_report(12, 4))
    row = balancer.snapshot()[0]
    assert row["reported_queue_depth"] == 12
    assert row["reported_inflight"] == 4
    assert row["report_age_s"] == 0.0
    load = balancer.load(eps[0])
    assert load.unreported_pending() == 0  # in_flight was already on the replica when it reported
    balancer.start(eps[0])
    assert load.unreported_pending() == 1
    in_flight.finish(status=200, latency_s=0.01)
    assert load.unreported_pending() == 1


def test_4xx_is_success_and_client_abort_is_no_verdict() -> None:
    balancer, eps, _, _ = make(2)
    for _ in range(4):
        balancer.start(eps[0]).finish(status=500, latency_s=0.01)
    balancer.start(eps[0]).finish(status=404, latency_s=0.01)
    assert balancer.snapshot()[0]["consecutive_failures"] == 0
    for _ in range(4):
        balancer.start(eps[0]).finish(status=503, latency_s=0.001)
    balancer.start(eps[0]).finish(status=None, latency_s=0.001)
    assert balancer.snapshot()[0]["consecutive_failures"] == 4
    assert balancer.snapshot()[0]["state"] == "healthy"


def test_aborted_request_can_raise_but_not_lower_the_estimate() -> None:
    balancer, eps, clock, _ = make(1, ewma_default_rtt_s=0.05)
    balancer.start(eps[0]).finish(status=None, latency_s=0.001)
    assert balancer.load(eps[0]).ewma.estimate(clock.now) == pytest.approx(0.05)
    balancer.start(eps[0]).finish(status=None, latency_s=2.0)
    assert balancer.load(eps[0]).ewma.estimate(clock.now) == pytest.approx(2.0)


def test_ejection_and_lazy_readmission_notify_the_observer() -> None:
    balancer, eps, clock, recorder = make(3, consecutive_errors=5, base_ejection_s=5.0)
    fail(balancer, eps[0], 5)
    assert ("eject", eps[0].url, "") in recorder.events
    assert eps[0] not in {balancer.pick(CTX) for _ in range(10)}
    row = balancer.snapshot()[0]
    assert row["state"] == "ejected"
    assert row["ejected_remaining_s"] == 5.0
    assert row["ejections"] == 1
    clock.now += 4.9
    assert eps[0] not in {balancer.pick(CTX) for _ in range(10)}
    clock.now += 0.1
    assert eps[0] in {balancer.pick(CTX) for _ in range(10)}
    assert recorder.events[-1] == ("readmit", eps[0].url, "")
    assert balancer.snapshot()[0]["state"] == "healthy"


def test_readmission_forgets_the_latency_estimate_that_decayed_while_out() -> None:
    balancer, eps, clock, _ = make(3, ewma_default_rtt_s=0.05)
    balancer.start(eps[0]).finish(status=200, latency_s=0.02)
    fail(balancer, eps[0], 5)
    clock.now += 300.0
    assert balancer.load(eps[0]).ewma.estimate(clock.now) < 0.001
    balancer.pick(CTX)
    assert balancer.load(eps[0]).ewma.estimate(clock.now) == pytest.approx(0.05)


def test_never_ejects_more_than_half_the_fleet() -> None:
    balancer, eps, _, recorder = make(5, max_ejection_percent=50)
    for ep in eps:
        fail(balancer, ep, 5)
    assert sum(1 for e in recorder.events if e[0] == "eject") == 2
    assert [row["state"] for row in balancer.snapshot()].count("ejected") == 2


def test_a_single_replica_is_never_ejected() -> None:
    balancer, eps, _, _ = make(1)
    fail(balancer, eps[0], 20)
    assert balancer.snapshot()[0]["state"] == "healthy"
    assert balancer.pick(CTX) == eps[0]


def test_removing_an_ejected_endpoint_frees_its_ejection_slot() -> None:
    balancer, eps, _, _ = make(4)
    fail(balancer, eps[0], 5)
    fail(balancer, eps[1], 5)
    fail(balancer, eps[2], 5)
    assert [r["state"] for r in balancer.snapshot()].count("ejected") == 2
    balancer.apply(Remove(eps[0]))
    balancer.apply(Insert(Endpoint.from_url("http://r9:8000")))
    fail(balancer, eps[2], 1)
    assert [r["state"] for r in balancer.snapshot()].count("ejected") == 2


def test_panic_threshold() -> None:
    balancer, eps, _, _ = make(4, panic_threshold_percent=50)
    for _ in range(3):
        balancer.set_probe_result(eps[0], False)
        balancer.set_probe_result(eps[1], False)
    assert not balancer.panic  # 2 of 4 routable is exactly the threshold
    assert {balancer.pick(CTX) for _ in range(20)} == {eps[2], eps[3]}
    for _ in range(3):
        balancer.set_probe_result(eps[2], False)
    assert balancer.panic
    assert {balancer.pick(CTX) for _ in range(20)} == set(eps)
    assert {balancer.pick(CTX, exclude=eps[:3]) for _ in range(5)} == {eps[3]}
    for _ in range(2):
        balancer.set_probe_result(eps[2], True)
    assert not balancer.panic


def test_panic_can_be_disabled() -> None:
    balancer, eps, _, _ = make(2, panic_threshold_percent=0)
    for ep in eps:
        for _ in range(3):
            balancer.set_probe_result(ep, False)
    assert not balancer.panic
    assert balancer.pick(CTX) is None


def test_active_health_holds_new_endpoints_until_a_probe_passes() -> None:
    balancer, eps, _, recorder = make(2)
    balancer.enable_active_health()
    assert [r["state"] for r in balancer.snapshot()] == ["unknown", "unknown"]
    newcomer = Endpoint.from_url("http://r7:8000")
    balancer.apply(Insert(newcomer))
    assert ("state", newcomer.url, "unknown") in recorder.events
    for ep in eps:
        balancer.set_probe_result(ep, True)
    assert not balancer.panic  # 2 of 3
    assert newcomer not in {balancer.pick(CTX) for _ in range(20)}
    balancer.set_probe_result(newcomer, True)
    assert newcomer in {balancer.pick(CTX) for _ in range(20)}
    assert ("state", newcomer.url, HealthState.HEALTHY) in recorder.events


def test_probe_result_for_unknown_endpoint_is_ignored() -> None:
    balancer, eps, _, recorder = make(1)
    before, events = balancer.snapshot(), list(recorder.events)
    for _ in range(5):
        balancer.set_probe_result(Endpoint.from_url("http://gone:1"), False)
    assert balancer.snapshot() == before
    assert balancer.endpoints() == eps and recorder.events == events
    assert balancer.pick(CTX) == eps[0]


def test_start_on_removed_endpoint_is_harmless() -> None:
    balancer, eps, _, _ = make(2)
    balancer.apply(Remove(eps[0]))
    ticket = balancer.start(eps[0])
    assert balancer.active_requests == 1
    for _ in range(10):
        ticket = balancer.start(eps[0])
        ticket.finish(status=500)
    assert balancer.endpoints() == [eps[1]]
    assert balancer.snapshot()[0]["state"] == "healthy"


def test_in_flight_request_finishing_after_removal_does_not_touch_a_reinserted_endpoint() -> None:
    balancer, eps, _, _ = make(3)
    tickets = [balancer.start(eps[0]) for _ in range(5)]
    balancer.apply(Remove(eps[0]))
    balancer.apply(Insert(eps[0]))
    for t in tickets:
        t.finish(status=500)
    row = next(r for r in balancer.snapshot() if r["url"] == eps[0].url)
    assert row["consecutive_failures"] == 0
    assert row["pending"] == 0


def test_retry_budget_follows_active_requests() -> None:
    balancer, eps, _, _ = make(1, retry_budget_percent=20, retry_min_concurrency=1)
    budget = balancer.retry_budget
    assert budget.try_acquire()
    assert not budget.try_acquire()
    budget.release()
    for _ in range(10):
        balancer.start(eps[0])
    assert budget.try_acquire() and budget.try_acquire()
    assert not budget.try_acquire()


def test_snapshot_is_json_serialisable_and_complete() -> None:
    balancer, eps, _, _ = make(2, slow_start_s=10.0)
    balancer.start(eps[0])
    rows = balancer.snapshot()
    json.dumps(rows)
    expected = {
        "url", "state", "health", "weight", "effective_weight", "slow_start", "labels", "pending", "ewma_ms",
        "reported_queue_depth", "reported_inflight", "reported_utilization", "reported_gpu_utilization",
        "reported_gpu_throttled", "report_age_s", "consecutive_failures", "ejections", "ejected_until",
        "ejected_remaining_s",
    }  # fmt: skip
    assert set(rows[0]) == expected
    assert rows[0]["pending"] == 1
    assert rows[0]["slow_start"] is True
    assert rows[0]["effective_weight"] == pytest.approx(0.1)


async def test_run_discovery_applies_every_batch() -> None:
    balancer = Balancer(BalancerConfig(), rng=random.Random(1))
    eps = [Endpoint.parse("http://a:1=2"), Endpoint.parse("http://b:1")]
    await run_discovery(balancer, StaticDiscovery(eps))
    assert balancer.endpoints() == eps
    assert balancer.endpoints()[0].weight == 2


def test_apply_rejects_unknown_events() -> None:
    balancer, _, _, _ = make(1)
    with pytest.raises(TypeError, match="unknown discovery event"):
        balancer.apply("insert http://x:1")  # type: ignore[arg-type]


def test_an_endpoint_at_its_cap_is_no_candidate_until_an_attempt_ends() -> None:
    balancer, (a, b), _, _ = make(2, replica_max_inflight=2)
    tickets = [balancer.start(a), balancer.start(a)]
    assert {balancer.pick(CTX) for _ in range(50)} == {b}
    assert balancer.capped() and not balancer.capped(exclude=[a])
    tickets.append(balancer.start(b))
    tickets.append(balancer.start(b))
    assert balancer.pick(CTX) is None and balancer.capped()
    assert balancer.pick(CTX, exclude=[a]) is None and balancer.capped([a])
    tickets[0].finish(status=200, latency_s=0.01)
    assert balancer.pick(CTX) == a
    assert balancer.pick(CTX, exclude=[a]) is None and balancer.capped([a])
    for ticket in tickets[1:]:
        ticket.finish(status=200, latency_s=0.01)
    assert {balancer.pick(CTX) for _ in range(50)} == {a, b} and not balancer.capped()


def test_cap_counts_survive_removal_and_reinsertion() -> None:
    balancer, (a, b), _, _ = make(2, replica_max_inflight=1)
    old = balancer.start(a)
    balancer.apply(Remove(a))
    balancer.apply(Insert(a))  # a fresh entry: nothing in flight on it yet
    assert {balancer.pick(CTX) for _ in range(50)} == {a, b}
    old.finish(status=200, latency_s=0.01)  # the removed entry's attempt ends: no effect on the new one
    balancer.start(a)
    balancer.start(b)
    assert balancer.pick(CTX) is None and balancer.capped()


def test_an_unhealthy_endpoint_at_its_cap_does_not_make_the_fleet_saturated() -> None:
    balancer, (a, b), _, _ = make(2, replica_max_inflight=1, panic_threshold_percent=0)
    balancer.start(a)
    for _ in range(3):
        balancer.set_probe_result(a, False)
        balancer.set_probe_result(b, False)
    assert balancer.pick(CTX) is None and not balancer.capped()


def test_a_replica_still_starting_is_no_warning_one_that_went_bad_is(caplog: pytest.LogCaptureFixture) -> None:
    balancer, eps, _, _ = make(1)
    balancer.enable_active_health()
    with caplog.at_level("INFO", logger="fleetserve.gateway.balance.fleet"):
        caplog.clear()  # "added" above is captured too when an earlier test left the logger at INFO
        for ok in (False, False, False, True, True, False, False, False):
            balancer.set_probe_result(eps[0], ok)
    levels = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert levels == [("INFO", "backend http://r0:8000 not ready yet (3 probes failed)"),
                      ("INFO", "backend http://r0:8000 is healthy"),
                      ("WARNING", "backend http://r0:8000 failed 3 probes in a row")]
