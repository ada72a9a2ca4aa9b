"""The forwarding core with a scripted exchange: what is retried, with or without the retry budget, what the
gateway answers itself, and that every attempt's slot is given back, also when it is cancelled."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable
from typing import Any

import pytest

from fleetserve.gateway.balance import Balancer, BalancerConfig, Endpoint, Insert, RequestContext
from fleetserve.gateway.edge.metrics import REASONS
from fleetserve.gateway.forward.core import Forwarder, Outcome
from fleetserve.gateway.forward.hedge import HedgeConfig
from fleetserve.gateway.metrics import GatewayMetrics

CTX = RequestContext("POST", "/v2/models/m/infer", 2, {}, "rid")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Rejections:
    def __init__(self) -> None:
        self.seen: list[str] = []

    def rejected(self, reason: str) -> None:
        assert reason in REASONS
        self.seen.append(reason)


class Script:
    """An exchange whose replies are scripted per replica host: ``ok``, ``refused``, ``reset``, ``busy``,
    ``bad`` (a 400), ``hang`` (never answers) or ``silent`` (no answer within the attempt's timeout, which
    is recorded)."""

    def __init__(self, **by_host: str) -> None:
        self.by_host = by_host
        self.sent: list[str] = []
        self.timeouts: list[float] = []

    def send(self, ep: Endpoint, timeout_s: float, traceparent: str | None) -> Awaitable[str]:
        self.sent.append(ep.host)
        self.timeouts.append(timeout_s)
        return self._reply(self.by_host[ep.host])

    @staticmethod
    async def _reply(kind: str) -> str:
        if kind == "hang":
            await asyncio.Event().wait()
        if kind == "refused":
            raise ConnectionRefusedError("refused")
        if kind == "reset":
            raise ConnectionResetError("reset before any answer")
        if kind == "silent":
            raise TimeoutError("no answer")
        return kind

    def answered(self, ep: Endpoint, reply: str) -> Outcome[str]:
        status = {"ok": 200, "busy": 503, "bad": 400}[reply]
        return Outcome(status, reply, backend=ep.url, verdict=status, retryable=status == 503)

    def failed(self, ep: Endpoint, error: Exception) -> Outcome[str]:
        if isinstance(error, ConnectionRefusedError):
            return Outcome(502, failure=str(error), backend=ep.url, connect_error=True, retryable=True, sent=False)
        if isinstance(error, ConnectionResetError):
            return Outcome(502, failure=str(error), backend=ep.url, verdict=502, retryable=True)
        if isinstance(error, TimeoutError):
            return Outcome(504, failure=str(error), backend=ep.url, verdict=504)
        raise error


def make(*hosts: str, try_timeout_s: float = 0.0, max_retries: int = 1,
         **balancing: Any) -> tuple[Forwarder, Balancer, GatewayMetrics, Rejections, Clock]:
    clock = Clock()
    metrics = GatewayMetrics()
    config = BalancerConfig(policy="round-robin", **balancing)
    balancer = Balancer(config, clock=clock, rng=random.Random(1), observer=metrics)
    for host in hosts:
        balancer.apply(Insert(Endpoint.from_url(f"http://{host}:8000")))
    rejections = Rejections()
    forwarder = Forwarder(balancer, metrics, HedgeConfig(), rejections, max_retries=max_retries, retry_after="1",
                          overload_retry_after="7", try_timeout_s=try_timeout_s, clock=clock)
    return forwarder, balancer, metrics, rejections, clock


NO_BUDGET = {"retry_budget_percent": 0.0, "retry_min_concurrency": 0}


async def test_a_request_that_reached_no_replica_is_retried_without_the_budget() -> None:
    forwarder, balancer, metrics, _, clock = make("a", "b", **NO_BUDGET)
    script = Script(a="refused", b="refused")
    script.by_host[balancer.pick(CTX).host] = "ok"  # type: ignore[union-attr]  # round-robin: the 2nd goes here
    outcome = await forwarder.forward(CTX, script, clock.now + 1.0, 1.0)
    assert (outcome.status, outcome.answer, len(script.sent)) == (200, "ok", 2)
    assert metrics.retries._value.get() == 1 and metrics.retry_budget_exhausted._value.get() == 0


async def test_a_request_some_replica_received_needs_the_budget_to_be_retried() -> None:
    forwarder, _, metrics, _, clock = make("a", "b", **NO_BUDGET)
    outcome = await forwarder.forward(CTX, Script(a="reset", b="reset"), clock.now + 1.0, 1.0)
    assert (outcome.status, outcome.answer, outcome.retry_after) == (503, None, "1")
    assert outcome.failure == "no healthy replica could take the request: reset before any answer"
    assert metrics.retry_budget_exhausted._value.get() == 1
    busy = await forwarder.forward(CTX, Script(a="busy", b="busy"), clock.now + 1.0, 1.0)
    assert (busy.status, busy.answer) == (503, "busy")  # the replica's own 503 is passed on


async def test_retries_go_to_replicas_not_tried_and_stop_at_max_retries() -> None:
    forwarder, _, metrics, _, clock = make("a", "b", "c")
    script = Script(a="busy", b="busy", c="busy")
    outcome = await forwarder.forward(CTX, script, clock.now + 1.0, 1.0)
    assert outcome.answer == "busy" and len(script.sent) == 2 and len(set(script.sent)) == 2
    assert metrics.retries._value.get() == 1


async def test_client_errors_are_answers_never_retried() -> None:
    forwarder, _, _, _, clock = make("a", "b")
    script = Script(a="bad", b="bad")
    assert (await forwarder.forward(CTX, script, clock.now + 1.0, 1.0)).status == 400
    assert len(script.sent) == 1


async def test_every_replica_at_its_cap_is_an_overload_answer_at_once() -> None:
    forwarder, balancer, _, rejections, clock = make("a", "b", replica_max_inflight=1)
    tickets = [balancer.start(ep) for ep in balancer.endpoints()]
    outcome = await forwarder.forward(CTX, Script(), clock.now + 1.0, 1.0)
    assert (outcome.status, outcome.retry_after) == (503, "7")
    assert outcome.failure == "every replica is at its limit of 1 requests in flight"
    assert rejections.seen == ["overloaded"]
    for ticket in tickets:
        ticket.finish(status=200)
    assert (await forwarder.forward(CTX, Script(a="ok", b="ok"), clock.now + 1.0, 1.0)).status == 200


async def test_no_replica_and_a_passed_deadline_are_the_gateways_own_answers() -> None:
    forwarder, _, _, rejections, clock = make()
    outcome = await forwarder.forward(CTX, Script(), clock.now + 1.0, 1.0)
    assert (outcome.status, outcome.failure, outcome.retry_after) == (503, "no healthy replica is available", "1")
    assert rejections.seen == []
    forwarder, _, _, _, clock = make("a")
    outcome = await forwarder.forward(CTX, Script(a="ok"), clock.now - 0.001, 0.25)
    assert (outcome.status, outcome.failure) == (504, "deadline of 250 ms exceeded")


async def test_a_cancelled_attempt_gives_its_slot_back_and_says_nothing_about_the_replica() -> None:
    forwarder, balancer, metrics, _, clock = make("a", consecutive_errors=1)
    script = Script(a="hang")
    task = asyncio.ensure_future(forwarder.forward(CTX, script, clock.now + 1.0, 1.0))
    while not script.sent:
        await asyncio.sleep(0)
    assert balancer.active_requests == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    (row,) = balancer.snapshot()
    assert (balancer.active_requests, row["pending"], row["state"], row["consecutive_failures"]) == (
        0, 0, "healthy", 0)
    assert metrics.registry.get_sample_value("fleetserve_gateway_upstream_duration_seconds_count",
                                             {"backend": "http://a:8000"}) == 1


async def test_an_attempt_silent_past_its_share_of_the_deadline_is_retried_elsewhere() -> None:
    forwarder, balancer, metrics, _, clock = make("a", "b", consecutive_errors=1)
    script = Script(a="silent", b="silent")
    script.by_host[balancer.pick(CTX).host] = "ok"  # type: ignore[union-attr]  # round-robin: the 2nd goes here
    outcome = await forwarder.forward(CTX, script, clock.now + 1.0, 1.0)
    assert (outcome.status, outcome.answer) == (200, "ok")
    # Two attempts allowed: the first gets half the deadline, the last everything left.
    assert script.timeouts == pytest.approx([0.5, 1.0])
    assert metrics.retries._value.get() == 1
    silent = [row for row in balancer.snapshot() if row["consecutive_failures"]]
    assert len(silent) == 1  # the silent replica's timeout counts against it


async def test_a_configured_per_try_timeout_caps_every_attempt_but_the_last() -> None:
    forwarder, _, _, _, clock = make("a", "b", try_timeout_s=0.2)
    script = Script(a="silent", b="silent")
    outcome = await forwarder.forward(CTX, script, clock.now + 1.0, 1.0)
    assert script.timeouts == pytest.approx([0.2, 1.0])
    assert outcome.status == 504 and outcome.answer is None
    # With no retry left, a silent replica's timeout is the client's 504, not a retry.
    forwarder, _, _, _, clock = make("a", "b", max_retries=0)
    assert (await forwarder.forward(CTX, Script(a="silent", b="silent"), clock.now + 1.0, 1.0)).status == 504


async def test_with_no_other_replica_to_retry_on_an_attempt_keeps_the_whole_deadline() -> None:
    forwarder, _, _, _, clock = make("a")
    script = Script(a="silent")
    assert (await forwarder.forward(CTX, script, clock.now + 1.0, 1.0)).status == 504
    assert script.timeouts == pytest.approx([1.0])
