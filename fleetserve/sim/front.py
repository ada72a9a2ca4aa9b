"""The simulated gateway: worker processes, each with its own CPU queue and its own real balancer.

``fleetserve gateway --workers N`` runs N processes on one port (SO_REUSEPORT); each balances on its own
view of the fleet. Here each worker is a FIFO server costing a request the CPU its profile measured with as many
requests in flight as the worker has in hand when it arrives, itself included (``cpu_curve``; without one,
``gateway_busy_cpu_s`` for a request that finds it busy with others, ``gateway_cpu_s`` otherwise), then a wait of
``wait_s`` that takes no core (the gateway's wall time at low load beyond its CPU: loopback hops, wake-ups),
and a :class:`~fleetserve.sim.gateway.SimBalancer`; an arriving request goes to a worker chosen uniformly at random
(the kernel hashes connections across the sockets).

The forwarding rule restates :mod:`fleetserve.gateway.forward.proxy`'s: a connect failure (nothing listening) is
retried on another replica without the retry budget (no replica did any work); a reset before the response
or a 503 is retried within the budget; at most ``max_retries`` retries, each on a replica not tried yet.
When no replica can be picked the client gets a 503 at once.

With ``adaptive`` the worker runs the gateway's adaptive concurrency limit (:mod:`fleetserve.gateway.edge.adaptive`,
the product's controller on the simulated clock): a request beyond the limit is answered 503 at once, before any
gateway CPU (a refusal costs a small fraction of a forwarded request), unless ``unlimited()`` says the fleet is
still growing, as the gateway does with its autoscaler; an admitted request holds its slot until it is answered.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from fleetserve.gateway.edge.adaptive import GradientController
from fleetserve.gateway.edge.config import AdaptiveConcurrencyConfig
from fleetserve.sim.cpu_charge import CpuCharge
from fleetserve.sim.events import EventLoop
from fleetserve.sim.gateway import BalancerConfig, SimBalancer, load_report, reads_load_reports
from fleetserve.sim.host import Host, Server
from fleetserve.sim.replica import SimReplica
from fleetserve.sim.request import CONNECT_ERROR, LIMITED, NO_REPLICA, OK, OVERLOADED, RESET, Request

Done = Callable[[Request, int], None]


class FrontWorker:
    def __init__(self, loop: EventLoop, host: Host, config: BalancerConfig, *, cpu_s: float, max_retries: int,
                 rng: random.Random, done: Done, network_s: float = 0.0, wait_s: float = 0.0,
                 busy_cpu_s: float | None = None, cpu_curve: tuple[tuple[int, float], ...] = (),
                 name: str = "gateway",
                 adaptive: AdaptiveConcurrencyConfig | None = None,
                 unlimited: Callable[[], bool] | None = None) -> None:
        self.loop = loop
        self.controller = None if adaptive is None else GradientController(adaptive, clock=loop.clock,
                                                                           rng=random.Random(rng.random()))
        self._unlimited = unlimited
        self.balancer: SimBalancer[SimReplica] = SimBalancer(config, clock=loop.clock, rng=rng)
        self.server = Server(loop, host, wait_s=wait_s, name=name)
        self._cpu = CpuCharge(cpu_curve, cpu_s, cpu_s if busy_cpu_s is None else busy_cpu_s)
        self.in_hand = 0  # requests admitted and not yet finished
        self._max_retries = max_retries
        self._done = done
        self._network_s = network_s
        self._reports = reads_load_reports(config.policy)
        self.retries = 0
        # A replica's answer for a request (called by the replica), after the network delay if there is one.
        self.answer = self._delayed_answer if network_s else self._answer

    def receive(self, request: Request) -> None:
        if self.controller is not None:
            request.slot = self.controller.try_acquire(self._unlimited)
            if request.slot is None:
                self._done(request, LIMITED)
                return
        request.reply = self.answer
        self.in_hand += 1
        cpu = self._cpu(self.in_hand, self.server.busy)
        if cpu:
            self.server.submit(cpu, self._route, request)  # handed back after the wait
        elif self.server.wait_s:
            self.loop.after(self.server.wait_s, self._route, request)
        else:
            self._route(request)

    def _route(self, request: Request) -> None:
        routed = self.balancer.route(request.tickets or ())
        if routed is None:
            if request.budgeted:
                self.balancer.retry_budget.release()
                request.budgeted = False
            self._finish(request, NO_REPLICA)
            return
        replica, request.ticket = routed
        request.attempts += 1
        if not replica.accepts():
            self._answer(request, CONNECT_ERROR, replica)
        elif self._network_s:
            self.loop.after(self._network_s, replica.receive, request)
        else:
            replica.receive(request)

    def _finish(self, request: Request, status: int) -> None:
        self.in_hand -= 1
        slot = request.slot
        if slot is not None:
            assert self.controller is not None
            request.slot = None
            self.controller.release(slot, self.loop.now - slot.started_at, status == OK)
        self._done(request, status)

    def _delayed_answer(self, request: Request, status: int, replica: SimReplica) -> None:
        if status == CONNECT_ERROR:
            self._answer(request, status, replica)
        else:
            self.loop.after(self._network_s, self._answered, (request, status, replica))

    def _answered(self, args: tuple[Request, int, SimReplica]) -> None:
        self._answer(*args)

    def _answer(self, request: Request, status: int, replica: SimReplica) -> None:
        ticket = request.ticket
        if ticket is None:  # answered already (e.g. reset after a crash raced a reply)
            return
        request.ticket = None
        connect_error = status == CONNECT_ERROR
        report = load_report(replica.queue_depth, replica.inflight_rows) if self._reports and status == OK else None
        ticket.finish(status=None if connect_error else status, connect_error=connect_error, report=report)
        if request.budgeted:
            self.balancer.retry_budget.release()
            request.budgeted = False
        if status not in (CONNECT_ERROR, RESET, OVERLOADED) or request.attempts > self._max_retries:
            self._finish(request, status)
            return
        if not connect_error:
            if not self.balancer.retry_budget.try_acquire():
                self._finish(request, status)
                return
            request.budgeted = True
        if request.tickets is None:
            request.tickets = [ticket]
        else:
            request.tickets.append(ticket)
        self.retries += 1
        self._route(request)
