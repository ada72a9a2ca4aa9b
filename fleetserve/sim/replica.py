"""A simulated replica: its event loop, the product's own batch collator, and engine instances.

A request first costs the replica's event loop CPU (HTTP, JSON, tokenizer) on a FIFO server: what the profile
measured with as many requests in flight as the replica has in hand when it arrives, itself included
(``replica_cpu_curve``; others in hand share wake-ups and system calls with it, see
:class:`~fleetserve.sim.profile.Profile`), or for profiles without that curve ``replica_busy_cpu_s`` when it finds
the loop busy with other requests and ``replica_cpu_s`` otherwise; then
waits ``replica_wait_s`` taking no core (its server hands it back that late; the profile's wall time at low load
beyond that CPU: loopback, thread wake-ups and hand-offs; a constant on the path, so where it sits changes no
queue), then joins the real :class:`~fleetserve.batching.collator.Collator`, which decides exactly as in the replica
process which requests form the next batch and when (sequence buckets, ``max_delay_s``, preferred sizes, queue
bound). The collator's timer fires ``timer_lag_s`` late, as the event loop's does. A batch runs on a free engine
instance for a service time drawn from the profile for its rows and padded length (the longest request, or the
bucket for engines that run fixed shapes): the back-to-back timing when the instance goes straight from one batch to
the next or waited for work less than the profile's ``idle_after_s``, the after-idle timing when it waited longer;
scaled by a slow-GPU factor when one is injected. A full queue answers 503 at once, like ``Batcher.submit``.

Lifecycle: ``ready`` → (crash) ``down`` → (restart + cold start) ``ready``; new replicas start in
``starting``. A crash drops everything in hand (the gateway sees resets) and refuses connections until the
restarted process is ready again.
"""

from __future__ import annotations

import bisect
import random

from fleetserve.batching.collator import Batch, Collator, Pending
from fleetserve.batching.config import BatcherConfig
from fleetserve.errors import Overloaded
from fleetserve.sim.cpu_charge import CpuCharge
from fleetserve.sim.events import EventLoop
from fleetserve.sim.host import Host, Server
from fleetserve.sim.profile import Profile, ServiceSampler
from fleetserve.sim.request import EXPIRED, OK, OVERLOADED, RESET, Request

STARTING, READY, DOWN = "starting", "ready", "down"


class SimReplica:
    def __init__(
        self, loop: EventLoop, name: str, profile: Profile, batcher: BatcherConfig, *, instances: int,
        cpu_host: Host, device_host: Host, rng: random.Random, weight: int = 1,
        shapes: dict[tuple[int, int], tuple[float, float, float]] | None = None,
    ) -> None:
        self.loop = loop
        self.name = name
        self.profile = profile
        self.weight = weight
        self._batcher = batcher
        self._max_seq = profile.max_seq
        self._buckets = tuple(b for b in profile.seq_buckets if b <= profile.max_seq) or (profile.max_seq,)
        self._bucket_of: dict[int, int] = {}  # token count -> sequence bucket, filled as lengths come
        self._pad_to_bucket = profile.pad_to_bucket
        self._sample = ServiceSampler(profile, rng, cache=shapes)
        self.event_loop = Server(loop, cpu_host, wait_s=profile.replica_wait_s, name=f"{name}/loop")
        self.instances = [
            Server(loop, device_host, demand=profile.threads, name=f"{name}/engine{i}") for i in range(instances)
        ]
        self._idle = list(self.instances)
        self._collator: Collator[Request] = Collator(batcher)
        self._cpu = CpuCharge(profile.replica_cpu_curve, profile.replica_cpu_s, profile.replica_loaded_cpu_s)
        self.in_hand = 0  # requests received and not yet answered
        self._timer_lag_s = profile.timer_lag_s
        self._idle_after_s = profile.idle_after_s
        self._freed_at: dict[Server, float] = {}  # when each instance last finished a batch
        self._timeout_s = batcher.default_timeout_s
        self._wake_token = 0
        self._wake_at: float | None = None
        self.state = READY
        self.slow_factor = 1.0
        self.inflight_rows = 0
        self.batches = 0
        self.batched_rows = 0
        self.engine_row_seconds = 0.0  # each finished batch's time on its instance, times its rows

    @property
    def servers(self) -> list[Server]:
        return [self.event_loop, *self.instances]

    @property
    def queue_depth(self) -> int:
        return self._collator.queued_rows

    def accepts(self) -> bool:
        """Whether a connection would be accepted (a process is listening)."""
        return self.state == READY

    def receive(self, request: Request) -> None:
        """A request arrived over an accepted connection."""
        self.in_hand += 1
        cpu = self._cpu(self.in_hand, self.event_loop.busy)
        if cpu:
            self.event_loop.submit(cpu, self._decoded, request)  # handed back after the wait
        elif self.event_loop.wait_s:
            self.loop.after(self.event_loop.wait_s, self._decoded, request)
        else:
            self._decoded(request)

    def _decoded(self, request: Request) -> None:
        if self.state != READY:  # crashed while the request was on its way in: the connection was reset
            self._answer(request, RESET)
            return
        bucket = self._bucket_of.get(request.tokens)
        if bucket is None:
            bucket = self._bucket_of[request.tokens] = self._bucket(request.tokens)
        try:
            now = self.loop.now
            deadline = None if self._timeout_s is None else now + self._timeout_s
            self._collator.push(request, rows=request.rows, bucket=bucket, priority=0, now=now, deadline=deadline)
        except Overloaded:
            self._answer(request, OVERLOADED)
            return
        self._poll()

    def _bucket(self, tokens: int) -> int:
        """The sequence bucket of a request of ``tokens`` tokens (truncated to the profile's longest)."""
        tokens = min(tokens, self._max_seq)
        return self._buckets[min(bisect.bisect_left(self._buckets, tokens), len(self._buckets) - 1)]

    def _poll(self, _: object = None) -> None:
        """Ask the collator for work, as the batcher's scheduler does when something changed.

        Without queue deadlines a poll can only start a batch, so none is made while the queue is empty
        or no instance is free (a freed instance polls again): the decisions are those of polling always.
        """
        now = self.loop.now
        collator = self._collator
        while True:
            if self._timeout_s is None and (not self._idle or not collator.queued_requests):
                return
            decision = collator.poll(now, can_dispatch=bool(self._idle))
            for entry in decision.expired:
                self._answer(entry.payload, EXPIRED)
            if decision.batch is None:
                break
            self._dispatch(decision.batch)
        wake = decision.wake_at
        if wake is not None and self._timer_lag_s:
            wake += self._timer_lag_s
        if wake is not None and wake > now and (self._wake_at is None or wake < self._wake_at or self._wake_at <= now):
            self._wake_at = wake
            self._wake_token += 1
            self.loop.schedule(wake, self._on_wake, self._wake_token)

    def _on_wake(self, token: int) -> None:
        if token == self._wake_token and self.state == READY:
            self._wake_at = None
            self._poll()

    def _dispatch(self, batch: Batch[Request]) -> None:
        instance = self._idle.pop()
        entries = batch.entries
        longest = 0
        for entry in entries:
            tokens = entry.payload.tokens
            if tokens > longest:
                longest = tokens
        rows = batch.rows
        seq = batch.seq if self._pad_to_bucket or longest > batch.seq else longest
        self.inflight_rows += rows
        self.batches += 1
        self.batched_rows += rows
        freed = self._freed_at.get(instance)
        idle = freed is None or 0.0 < self.loop.now - freed >= self._idle_after_s
        instance.submit(self._sample(rows, seq, idle) * self.slow_factor, self._ran,
                        (instance, entries, rows, self.loop.now))

    def _ran(self, job: tuple[Server, tuple[Pending[Request], ...], int, float]) -> None:
        instance, entries, rows, started = job
        self.inflight_rows -= rows
        self.engine_row_seconds += (self.loop.now - started) * rows
        self._freed_at[instance] = self.loop.now
        self._idle.append(instance)
        for entry in entries:
            self._answer(entry.payload, OK)
        self._poll()

    def _answer(self, request: Request, status: int) -> None:
        self.in_hand -= 1
        request.reply(request, status, self)

    def crash(self) -> list[Request]:
        """The process dies: every request in hand is lost (returned, to be answered with resets)."""
        self.state = DOWN
        lost: list[Request] = []
        for server in self.servers:
            for item in server.abort():
                if isinstance(item, tuple):  # an engine's batch: (instance, queued entries, rows, started)
                    lost.extend(entry.payload for entry in item[1])
                else:  # a request still on the event loop
                    lost.append(item)
        lost.extend(e.payload for e in self._collator.clear())
        self._idle = list(self.instances)
        self.inflight_rows = 0
        self._wake_at = None
        self._wake_token += 1
        self._collator = Collator(self._batcher)
        for request in lost:
            self._answer(request, RESET)
        return lost

    def interruptible(self) -> None:
        """Let faults pause or crash this replica's servers (see :meth:`fleetserve.sim.host.Server.interruptible`)."""
        for server in self.servers:
            server.interruptible()

    def pause(self) -> None:
        for server in self.servers:
            server.pause()

    def resume(self) -> None:
        for server in self.servers:
            server.resume()

    def utilisation(self, elapsed_s: float) -> float:
        """Mean busy share of the engine instances over ``elapsed_s``."""
        if elapsed_s <= 0:
            return 0.0
        return sum(s.busy_seconds() for s in self.instances) / (elapsed_s * len(self.instances))
