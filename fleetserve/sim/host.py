"""Compute resources: FIFO servers (a replica's event loop, an engine instance, a gateway worker) on hosts
whose capacity they share.

A :class:`Server` runs one job at a time, first in first out; a job is an amount of *work* in seconds, the
time it takes on an otherwise idle host. A :class:`Host` has ``capacity`` units (CPU cores, or for a GPU how
many engine instances' worth of work it overlaps, measured by ``fleetserve profile``); each running server
demands ``demand`` units (an ONNX Runtime session with 2 intra-op threads demands 2 cores), and
``background`` is the demand of processes outside the simulation that compete for the same capacity (a load
generator, other tenants of a shared machine). When the running demand plus the background exceeds the
capacity, every running server slows down by the same factor, ``capacity / (demand + background)``:
egalitarian processor sharing, the standard model of a time-sliced CPU (Kleinrock, "Queueing Systems" vol. 2,
§4.4). Two replicas and a gateway on a 2-core box are one host; a GPU replica in a large fleet has its own
host, which is never oversubscribed, so its servers take the fast path (no rescheduling).

A server may hand each finished job back ``wait_s`` after it finishes: time the job's request spends waiting
after its CPU work (loopback hops, wake-ups of idle threads and processes) that takes no core and does not
hold up the server's next job. On the fast path that costs no extra event (the callback is scheduled for the
finish plus the wait).

A paused server (SIGSTOP of its process, see :mod:`fleetserve.sim.faults`) keeps its job but makes no
progress and demands nothing, which leaves more capacity to the others on its host.

Fast path: a server on a host that is never oversubscribed, and that no fault will pause or abort, knows each
job's finish time when the job is submitted (after the previous job's finish, FIFO), so it schedules the
caller's callback for then directly. Only servers marked :meth:`Server.interruptible` (fault targets) or on a
shared host keep a queue and reschedule.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

from fleetserve.sim.events import EventLoop

Done = Callable[[Any], None]


class Host:
    """Capacity shared by the servers placed on it; see the module docstring."""

    __slots__ = ("_attached", "_loop", "_roomy", "_running", "_shared", "_speed", "background", "capacity", "name")

    def __init__(self, loop: EventLoop, capacity: float, *, background: float = 0.0, shared: bool = False,
                 name: str = "") -> None:
        if capacity <= 0:
            raise ValueError(f"host capacity must be > 0, got {capacity}")
        if background < 0:
            raise ValueError(f"host background demand must be >= 0, got {background}")
        self._loop = loop
        self.capacity = capacity
        self.background = background
        self.name = name
        # Running servers in the order they started (a dict, not a set: a set iterates in address order, which
        # differs between processes, and the order of rescheduling breaks ties between equal finish times).
        self._running: dict[Server, None] = {}
        self._speed = 1.0
        self._attached = 0.0
        self._shared = shared  # servers may join later: never assume it stays roomy
        self._roomy = not shared

    def _attach(self, demand: float) -> None:
        self._attached += demand
        # Never oversubscribed: every server always runs at full speed and nothing is ever rescheduled.
        self._roomy = not self._shared and self._attached <= self.capacity - self.background

    @property
    def speed(self) -> float:
        return self._speed

    def _target_speed(self) -> float:
        demand = sum(s.demand for s in self._running) + self.background
        return 1.0 if demand <= self.capacity else self.capacity / demand

    def _changed(self, server: Server, running: bool) -> None:
        if running:
            self._running[server] = None
        else:
            self._running.pop(server, None)
        speed = self._target_speed()
        if speed == self._speed:
            return
        now = self._loop.now
        for other in self._running:
            if other is not server:
                other._respeed(now, self._speed, speed)
        self._speed = speed


class Server:
    """A FIFO single server on a host; ``submit`` a job, get ``done(arg)`` called when it finishes."""

    __slots__ = (
        "_done", "_fast", "_finish_at", "_free_at", "_host", "_job_arg", "_loop", "_paused", "_queue", "_remaining",
        "_token", "_worked", "busy_time", "demand", "name", "started_at", "wait_s",
    )

    def __init__(self, loop: EventLoop, host: Host, *, demand: float = 1.0, wait_s: float = 0.0,
                 name: str = "") -> None:
        if demand <= 0 or wait_s < 0:
            raise ValueError(f"server demand must be > 0 and wait_s >= 0, got {demand} and {wait_s}")
        self._loop = loop
        self.wait_s = wait_s
        self._host = host
        self.demand = demand
        self.name = name
        host._attach(demand)
        self._queue: collections.deque[tuple[float, Done, Any]] = collections.deque()
        self._done: Done | None = None
        self._job_arg: Any = None
        self._remaining = 0.0
        self._finish_at = 0.0
        self._token = 0
        self._paused = False
        self.started_at = 0.0
        self.busy_time = 0.0
        # Fast path (see the module docstring), decided at the first job: work submitted so far, and when the
        # last of it finishes.
        self._fast: bool | None = None
        self._free_at = 0.0
        self._worked = 0.0

    def interruptible(self) -> None:
        """Allow :meth:`pause` and :meth:`abort` (faults); call before the first job."""
        if self._fast:
            raise RuntimeError(f"server {self.name} already took jobs on its fast path")
        self._fast = False

    @property
    def busy(self) -> bool:
        """Whether a job is running or queued right now."""
        if self._fast:
            return self._free_at > self._loop.now
        return self._done is not None

    def busy_seconds(self) -> float:
        """Seconds spent on jobs up to now."""
        now = self._loop.now
        if self._fast:
            return self._worked - max(0.0, self._free_at - now)
        return self.busy_time + (now - self.started_at if self._done is not None else 0.0)

    def submit(self, work: float, done: Done, arg: Any = None) -> None:
        fast = self._fast
        if fast is None:
            fast = self._fast = self._host._roomy
        if fast:
            now = self._loop.now
            free_at = self._free_at
            self._free_at = finish = (free_at if free_at > now else now) + work
            self._worked += work
            self._loop.schedule(finish + self.wait_s, done, arg)
            return
        if self._done is not None:
            self._queue.append((work, done, arg))
            return
        self._done, self._job_arg = done, arg
        now = self._loop.now
        self.started_at = now
        self._remaining = work
        if self._paused:
            return
        host = self._host
        if not host._roomy:
            host._changed(self, True)
        self._finish_at = now + work / host._speed
        self._token += 1
        self._loop.schedule(self._finish_at, self._complete, self._token)

    def _run(self) -> None:
        host = self._host
        if not host._roomy:
            host._changed(self, True)
        self._finish_at = self._loop.now + self._remaining / host._speed
        self._token += 1
        self._loop.schedule(self._finish_at, self._complete, self._token)

    def _respeed(self, now: float, old: float, new: float) -> None:
        left = (self._finish_at - now) * old
        self._finish_at = now + left / new
        self._token += 1
        self._loop.schedule(self._finish_at, self._complete, self._token)

    def _complete(self, token: int) -> None:
        if token != self._token or self._paused:
            return
        now = self._loop.now
        self.busy_time += now - self.started_at
        done, arg = self._done, self._job_arg
        self._done = self._job_arg = None
        if self._queue:
            work, next_done, next_arg = self._queue.popleft()
            self._done, self._job_arg = next_done, next_arg
            self.started_at = now
            self._remaining = work
            self._finish_at = now + work / self._host._speed
            self._token += 1
            self._loop.schedule(self._finish_at, self._complete, self._token)
        elif not self._host._roomy:
            self._host._changed(self, False)
        assert done is not None
        if self.wait_s:
            self._loop.after(self.wait_s, done, arg)
        else:
            done(arg)

    def pause(self) -> None:
        """Stop making progress (the process got SIGSTOP); the job in hand waits."""
        if self._fast:
            raise RuntimeError(f"server {self.name} was not made interruptible before its first job")
        if self._paused:
            return
        self._paused = True
        if self._done is not None:
            now = self._loop.now
            self._remaining = max(0.0, (self._finish_at - now) * self._host._speed)
            self._token += 1
            if not self._host._roomy:
                self._host._changed(self, False)

    def resume(self) -> None:
        if not self._paused:
            return
        self._paused = False
        if self._done is not None:
            self._run()

    def abort(self) -> list[Any]:
        """Drop the job in hand and every queued one (the process died); returns their args."""
        if self._fast:
            raise RuntimeError(f"server {self.name} was not made interruptible before its first job")
        lost = [arg for _, _, arg in self._queue]
        self._queue.clear()
        if self._done is not None:
            lost.insert(0, self._job_arg)
            self._done = self._job_arg = None
            self._token += 1
            if not self._paused and not self._host._roomy:
                self._host._changed(self, False)
        self._paused = False
        return lost
