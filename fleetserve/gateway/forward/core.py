"""The forwarding core: pick → slot → attempt → classify → retry or hedge, written once for HTTP and gRPC.

A protocol adapter (:mod:`.http`, :mod:`.grpc`) hands the core an :class:`Exchange`: how to send one request
to one replica and how to classify what came back. The core does the rest, the same way for both:

- **Pick and slot.** The balancer picks a replica outside those tried and :meth:`Balancer.start` takes its
  slot at once (no await between them, so a per-replica cap holds exactly); every attempt ends in
  :meth:`Ticket.finish` with the status, whether the connection failed, the latency and the replica's load
  report, also when the attempt is cancelled (no verdict then).
- **Retry**, after Envoy's ``retry_on: connect-failure,reset,retriable-status-codes`` with a retry budget: an
  attempt the adapter calls retryable (no connection, a reset before any answer, an overloaded replica's 503
  or gRPC UNAVAILABLE) is retried on a replica not tried yet, at most ``max_retries`` times, while the
  deadline leaves time. A retry of a request some replica received also needs the balancer's retry budget,
  which keeps retries from multiplying an overload; one that reached no replica (connection refused, our
  pool to it full) did no work anywhere and is retried without it: that keeps a crashed replica from
  failing the requests routed to it before it is ejected. Never after an answer started to arrive, and
  never on a 4xx, which is the client's to see unchanged.
- **Per-try timeout**, after Envoy's ``per_try_timeout``: an attempt that has not answered by its own deadline
  is cancelled (its replica drops the work) and counts as that replica's failure; the request is retried
  on another replica while the retry budget and the request's deadline allow. The default splits what is
  left of the deadline evenly over the attempts still allowed, so a replica whose packets vanish (a network
  partition: no refusal, no reset) costs a request half its deadline, not all of it; the last attempt, and
  one with no other replica to retry on, gets everything that is left.
- **Hedge** (:mod:`.hedge`): an inference call whose first attempt is slower than the route's recent
  latency percentile gets a copy on another replica that has nothing outstanding, within the hedge budget;
  the first answer wins and the
  other attempt is cancelled, which closes its upstream connection (HTTP) or cancels its call (gRPC), so
  that replica stops working on it.
- **Hold** (scale from zero, :mod:`fleetserve.gateway.autoscale.hold`): with a hold queue, a request that
  finds no replica at all waits in it, within its deadline, until one is admitted, then picks as usual.
- **Answers the gateway gives itself**: 503 + ``Retry-After`` when no replica can take the request (every one
  at its in-flight cap, or none healthy, or none became ready while it was held), 504 past the deadline.
- **Signals** for the autoscaler (optional, a :class:`~fleetserve.autoscale.window.SignalWindow`): one
  ``arrival()`` per request, one ``observe()`` per attempt a replica answered (latency, failed, load report).

A client that goes away cancels the task running :meth:`Forwarder.forward`; the cancellation reaches the
attempt in flight, which closes its upstream connection or cancels its call the same way. Spans: :mod:`..tracing`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from fleetserve.autoscale.window import SignalWindow
from fleetserve.gateway.autoscale.hold import Held, HoldQueue
from fleetserve.gateway.balance import Balancer, Endpoint, RequestContext, Ticket
from fleetserve.gateway.balance.load import outstanding
from fleetserve.gateway.edge.metrics import RejectionObserver
from fleetserve.gateway.forward.hedge import HedgeConfig, Hedger, race
from fleetserve.gateway.metrics import NO_BACKEND, GatewayMetrics
from fleetserve.gateway.tracing import ForwardSpans, traced_pick
from fleetserve.wire import parse_load_report

A = TypeVar("A")
R = TypeVar("R")


@dataclass(slots=True)
class Outcome(Generic[A]):
    """What one attempt (or the gateway itself) has for the client.

    ``answer`` is the replica's answer to pass on; None means the gateway answers ``status`` with ``failure``
    (and ``retry_after``). ``verdict`` is what the balancer records about the replica (None: no verdict, as
    when the request never reached it). ``retryable``: nothing reached the client yet and another replica
    may do better; ``sent``: the request reached a replica (a retry then needs the retry budget).
    """

    status: int
    answer: A | None = None
    failure: str = ""
    backend: str = NO_BACKEND
    verdict: int | None = None
    connect_error: bool = False
    retryable: bool = False
    sent: bool = True
    report: str | None = None
    retry_after: str | None = None


class Exchange(Protocol[R, A]):
    """One client request as a protocol adapter carries it to replicas."""

    def send(self, ep: Endpoint, timeout_s: float, traceparent: str | None) -> Awaitable[R]:
        """Send the request to ``ep`` with ``traceparent`` (None: untraced); the awaitable gives the reply or raises."""
        ...

    def answered(self, ep: Endpoint, reply: R) -> Outcome[A]:
        """Classify a reply."""
        ...

    def failed(self, ep: Endpoint, error: Exception) -> Outcome[A]:
        """Classify a failure ``send`` raised; re-raise what is not a failure of the exchange."""
        ...


def _final(outcome: Outcome[Any]) -> bool:
    """An outcome to give the client (not a failure another replica might do better on)."""
    return not outcome.retryable


class Forwarder:
    """The core of one gateway process, shared by its HTTP and gRPC listeners."""

    def __init__(self, balancer: Balancer, metrics: GatewayMetrics, hedge: HedgeConfig, rejections: RejectionObserver,
                 *, max_retries: int, retry_after: str, overload_retry_after: str, try_timeout_s: float = 0.0,
                 clock: Callable[[], float] = time.monotonic, signals: SignalWindow | None = None,
                 holds: HoldQueue | None = None) -> None:
        self._balancer = balancer
        self._metrics = metrics
        self._hedger = Hedger(hedge)
        self._rejections = rejections
        self._attempts = max_retries + 1
        self._try_timeout_s = try_timeout_s  # 0: the deadline split over the attempts left
        self._retry_after = retry_after
        self._overload_retry_after = overload_retry_after
        self._clock = clock
        self._signals = signals
        self._holds = holds

    @property
    def clock(self) -> Callable[[], float]:
        return self._clock

    async def forward(self, ctx: RequestContext, exchange: Exchange[Any, A], deadline: float,
                      timeout_s: float, spans: ForwardSpans | None = None) -> Outcome[A]:
        """Forward one request until ``deadline`` (on :attr:`clock`); the outcome to give the client."""
        balancer = self._balancer
        tried: list[Endpoint] = []
        outcome: Outcome[A] | None = None
        hedge_delay = self._hedger.delay_s(ctx.method, ctx.path)
        if self._signals is not None:
            self._signals.arrival()
        for n, left in enumerate(range(self._attempts, 0, -1)):  # n: retries so far
            ep = traced_pick(spans, balancer, ctx, tried, self._clock)
            if ep is None and outcome is None and self._holds is not None and not balancer.capped():
                held = await self._hold(ctx, deadline)
                if isinstance(held, Outcome):
                    return held
                ep = held
            if ep is None:
                if outcome is None:
                    return self._saturated() if balancer.capped(tried) else self._no_replica("")
                break
            now = self._clock()
            if now >= deadline:
                return self._deadline_passed(timeout_s)
            # No other replica to retry on: this attempt may take all the time left.
            try_deadline = self._try_deadline(now, deadline, left if balancer.has_other((*tried, ep)) else 1)
            if outcome is None:
                outcome = await self._first(ctx, exchange, ep, try_deadline, deadline, tried, hedge_delay, spans)
            else:
                budgeted = outcome.sent
                if budgeted and not balancer.retry_budget.try_acquire():
                    self._metrics.retry_budget_exhausted.inc()
                    break
                self._metrics.retries.inc()
                try:
                    outcome = await self._attempt(ctx, exchange, balancer.start(ep), try_deadline, deadline, spans, n)
                finally:
                    if budgeted:
                        balancer.retry_budget.release()
            if outcome.status == 504 and self._clock() >= deadline:
                return self._deadline_passed(timeout_s)
            if not outcome.retryable:
                return outcome
            tried.append(ep)
        assert outcome is not None
        if outcome.answer is None:
            # Every replica tried failed before answering: for the client, none was available.
            return self._no_replica(outcome.failure)
        return outcome

    async def _hold(self, ctx: RequestContext, deadline: float) -> Endpoint | Outcome[Any] | None:
        """Wait in the hold queue while no replica exists; the replica picked once one does (None: every one
        is at its cap), or the gateway's refusal."""
        assert self._holds is not None
        while (held := await self._holds.hold(deadline)) is Held.RELEASED:
            ep = self._balancer.pick(ctx)
            if ep is not None or self._balancer.capped():
                return ep
        return Outcome(503, failure=self._holds.refusal(held), retry_after=self._retry_after)

    def _try_deadline(self, now: float, deadline: float, attempts_left: int) -> float:
        """When the attempt starting ``now`` is cut, ``attempts_left`` attempts (this one included) being allowed."""
        if attempts_left <= 1:
            return deadline
        if self._try_timeout_s > 0:
            return min(deadline, now + self._try_timeout_s)
        return now + (deadline - now) / attempts_left

    async def _first(self, ctx: RequestContext, exchange: Exchange[Any, A], ep: Endpoint, try_deadline: float,
                     deadline: float, tried: list[Endpoint], hedge_delay: float | None,
                     spans: ForwardSpans | None) -> Outcome[A]:
        """The first attempt, raced against a hedged copy on another replica if it is slower than
        ``hedge_delay``; the first answer that is not a retryable failure wins and the other attempt is
        cancelled. A hedge's replica joins ``tried``, so a retry after both failed goes elsewhere."""
        first = self._attempt(ctx, exchange, self._balancer.start(ep), try_deadline, deadline, spans, 0)
        if hedge_delay is None:
            return await first
        hedge: Ticket | None = None

        def start_hedge() -> Coroutine[Any, Any, Outcome[A]] | None:
            nonlocal hedge
            target = self._hedge_target(ctx, [*tried, ep], deadline, spans)
            if target is None:
                return None
            tried.append(target)
            hedge = self._balancer.start(target)
            return self._attempt(ctx, exchange, hedge, try_deadline, deadline, spans, 0, hedge=True)

        sent_at = self._clock()
        try:
            outcome, from_hedge = await race(first, hedge_delay, start_hedge, _final)
        finally:
            if hedge is not None:
                hedge.finish()  # a hedge cancelled before it ran never finished its ticket
        if hedge is not None:
            self._metrics.hedges.labels("won" if from_hedge else "lost").inc()
        if from_hedge:
            now = self._clock()
            with contextlib.suppress(KeyError):  # KeyError: removed by discovery meanwhile
                self._balancer.load(ep).outpaced(now - sent_at, now)
        return outcome

    def _hedge_target(self, ctx: RequestContext, exclude: list[Endpoint], deadline: float,
                      spans: ForwardSpans | None) -> Endpoint | None:
        """Another replica for a hedge; None when no replica or no hedge budget is left."""
        if self._clock() >= deadline:
            return None
        budget = self._hedger.budget
        if not budget.available():
            self._metrics.hedges_skipped.labels("budget").inc()
            return None
        ep = traced_pick(spans, self._balancer, ctx, exclude, self._clock)
        if ep is None:
            self._metrics.hedges_skipped.labels("no_backend").inc()
            return None
        if self._hedger.config.spare_only and outstanding(self._balancer.load(ep), self._clock()) >= 1.0:
            # A copy queued behind other work rarely beats the original and adds to the load that made it slow.
            self._metrics.hedges_skipped.labels("busy").inc()
            return None
        budget.take()
        return ep

    async def _attempt(self, ctx: RequestContext, exchange: Exchange[Any, A], ticket: Ticket, try_deadline: float,
                       deadline: float, spans: ForwardSpans | None, resends: int, hedge: bool = False) -> Outcome[A]:
        """One attempt, cut at ``try_deadline``; a 504 before the request's ``deadline`` is worth a retry."""
        ep = ticket.endpoint
        started = ticket.started_at
        outcome: Outcome[A] | None = None
        span, header = (None, None) if spans is None else spans.attempt(ep, resends, hedge)
        try:
            try:
                reply = await exchange.send(ep, try_deadline - started, header)
            except Exception as exc:
                outcome = exchange.failed(ep, exc)
            else:
                outcome = exchange.answered(ep, reply)
            if outcome.status == 504 and try_deadline < deadline:
                outcome.retryable = True
                outcome.failure = f"no answer within the per-try timeout of {(try_deadline - started) * 1000:.0f} ms"
            return outcome
        finally:
            # Also when the client went away or a hedge won (cancelled): no outcome says "no verdict".
            latency = self._clock() - started
            if outcome is None:
                ticket.finish(latency_s=latency)
            else:
                ticket.finish(status=outcome.verdict, connect_error=outcome.connect_error, latency_s=latency,
                              report=outcome.report)
                verdict = outcome.verdict
                if verdict is not None:
                    if verdict < 500:
                        self._hedger.observe(ctx.method, ctx.path, latency)
                    if self._signals is not None:
                        self._signals.observe(ep.url, latency, verdict < 500, parse_load_report(outcome.report))
            self._metrics.observe_attempt(ep.url, latency)
            if spans is not None and span is not None:
                spans.attempt_done(span, outcome)

    def _no_replica(self, failure: str) -> Outcome[Any]:
        message = "no healthy replica is available"
        if failure:
            message = f"no healthy replica could take the request: {failure}"
        return Outcome(503, failure=message, retry_after=self._retry_after)

    def _saturated(self) -> Outcome[Any]:
        self._rejections.rejected("overloaded")
        cap = self._balancer.config.replica_max_inflight
        return Outcome(503, failure=f"every replica is at its limit of {cap} requests in flight",
                       retry_after=self._overload_retry_after)

    @staticmethod
    def _deadline_passed(timeout_s: float) -> Outcome[Any]:
        return Outcome(504, failure=f"deadline of {timeout_s * 1000:.0f} ms exceeded")

