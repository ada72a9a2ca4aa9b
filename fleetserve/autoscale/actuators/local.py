"""The local actuator: the gateway's desired replica count, carried out with replica processes on this machine.

It long-polls ``GET /gateway/autoscale`` (the rules run in the gateway; the answer comes as soon as the desired
count changes, or after ``poll_s``) and reconciles the fleet (:func:`plan`):

- **More wanted**: replicas start in the lowest free slots (ports ``base_port + 2i``; forked from a server that
  imported the replica once, the engine from the cache, see :mod:`fleetserve.fleet.launch`). A replica is
  ``starting`` until its ``/v2/health/ready`` answers 200; only then is it PUT into the gateway's ``ready`` set,
  so no request meets a replica that cannot answer. The seconds from the poll that saw the decision to that PUT
  are the replica's start-up time; their recent median goes to the gateway as ``startup_s``, the lead the
  predictive rule forecasts by.
- **Fewer wanted**: starting replicas go first (they have no traffic), then the highest slots. A leaving
  replica is PUT as ``draining`` (the gateway stops routing to it), then gets SIGTERM: it keeps serving for its
  drain grace, finishes everything it accepted and exits, so no request fails.
- **A replica that exits unasked** leaves ``ready`` at once; the supervisor restarts it with backoff and it
  rejoins when its readiness answers 200 again.

The membership is PUT whole after every change, and again every ``refresh_s`` so that a restarted gateway
relearns it. Knative's activator and the Kubernetes endpoints controller play these parts in a cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import statistics
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import aiohttp

from fleetserve.fleet.supervisor import Member, Supervisor

log = logging.getLogger(__name__)

STATE_PATH = "/gateway/autoscale"
MEMBERS_PATH = "/gateway/autoscale/members"
# How many recent start-up times the reported one is the median of: a slow start on a busy box moves it,
# a single outlier does not.
STARTUP_SAMPLES = 5


class Phase(Enum):
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"


@dataclass
class Slot:
    """One autoscaled replica: its slot number (ports), process and phase."""

    index: int
    member: Member
    phase: Phase
    asked_at: float  # when the decision that started it was seen (or its crash noticed)
    scaled: bool = True  # started by a scale-up (its start-up time is reported), not restarted after a crash
    restarts_seen: int = 0
    poller: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return self.member.url


def plan(desired: int, slots: Sequence[Slot], max_replicas: int) -> tuple[list[int], list[Slot]]:
    """What to do to reach ``desired`` from ``slots``: slot numbers to start, and slots to retire.

    Draining slots count as gone (they take no new requests) but keep their ports until they exit. Retiring
    takes starting replicas first (newest first: they have no traffic and the least progress), then ready
    ones from the highest slot, so a fleet stays on its lowest ports.
    """
    desired = max(0, min(desired, max_replicas))
    active = [s for s in slots if s.phase is not Phase.DRAINING]
    if desired < len(active):
        order = sorted(active, key=lambda s: (s.phase is Phase.READY, -s.asked_at if s.phase is Phase.STARTING
                                              else -s.index))
        return [], order[:len(active) - desired]
    used = {s.index for s in slots}
    free = [i for i in range(max_replicas) if i not in used]
    return free[:desired - len(active)], []


class LocalActuator:
    """Keeps ``supervisor``'s replicas at the count the gateway at ``gateway_url`` asks for."""

    def __init__(self, supervisor: Supervisor, gateway_url: str, *, max_replicas: int, poll_s: float = 1.0,
                 ready_poll_s: float = 0.05, refresh_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.supervisor = supervisor
        self.gateway_url = gateway_url.rstrip("/")
        self.max_replicas = max_replicas
        self.poll_s, self.ready_poll_s, self.refresh_s = poll_s, ready_poll_s, refresh_s
        self.clock = clock
        self.slots: dict[int, Slot] = {}
        self.startup_s: deque[float] = deque(maxlen=STARTUP_SAMPLES)
        self.desired: int | None = None
        self._session: aiohttp.ClientSession | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._changed = asyncio.Event()
        # One PUT at a time, its body taken inside: an older membership can never arrive after a newer one.
        self._publishing = asyncio.Lock()
        self._last_put = -float("inf")

    def membership(self) -> dict[str, Any]:
        """The PUT body: every slot's URL by phase, and the measured start-up time (None before the first)."""
        body: dict[str, Any] = {p.value: sorted(s.url for s in self.slots.values() if s.phase is p) for p in Phase}
        body["startup_s"] = statistics.median(self.startup_s) if self.startup_s else None
        return body

    async def run(self, stop: asyncio.Event) -> None:
        timeout = aiohttp.ClientTimeout(total=self.poll_s + 5.0)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            self._session = session
            try:
                while not stop.is_set():
                    if not await self.step():
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(stop.wait(), timeout=self.poll_s)
            finally:
                for task in list(self._tasks):
                    task.cancel()
                await asyncio.gather(*self._tasks, return_exceptions=True)
                for slot in self.slots.values():
                    if slot.poller is not None:
                        slot.poller.cancel()
                self._session = None

    async def step(self) -> bool:
        """One poll: notice crashes, read the desired count, start and retire replicas, publish membership.
        False when the gateway gave no state (the caller waits before the next poll)."""
        self._notice_exits()
        state = await self._get_state()
        self._notice_exits()
        if state is not None and state.get("desired") is not None:  # None: the gateway has not ticked yet
            desired = int(state["desired"])
            if desired != self.desired:
                log.info("autoscale: desired %s -> %d replicas", self.desired, desired)
                self.desired = desired
            start, retire = plan(desired, list(self.slots.values()), self.max_replicas)
            for slot in retire:
                self._retire(slot)
            for index in start:
                await self._start(index)
        if self._changed.is_set() or self.clock() - self._last_put >= self.refresh_s:
            await self.publish()
        return state is not None

    def _notice_exits(self) -> None:
        """A ready or starting replica whose process exited (or was restarted) unasked: out of ready, starting
        again once the supervisor restarted it."""
        for slot in self.slots.values():
            m = slot.member
            exited = m.process is None or m.process.returncode is not None or m.restarts != slot.restarts_seen
            if slot.phase is Phase.DRAINING or not exited:
                continue
            if slot.phase is Phase.READY:
                log.warning("autoscale: %s exited unasked; out of the gateway until it is ready again", m.name)
                slot.phase, slot.asked_at, slot.scaled = Phase.STARTING, self.clock(), False
                self._changed.set()
            slot.restarts_seen = m.restarts
            if slot.poller is None or slot.poller.done():
                slot.poller = asyncio.create_task(self._await_ready(slot))

    async def _start(self, index: int) -> None:
        asked = self.clock()
        member = await self.supervisor.add_replica(index)
        slot = Slot(index, member, Phase.STARTING, asked, restarts_seen=member.restarts)
        self.slots[index] = slot
        slot.poller = asyncio.create_task(self._await_ready(slot))
        log.info("autoscale: starting %s (%s)", member.name, member.url)
        self._changed.set()

    async def _await_ready(self, slot: Slot) -> None:
        while slot.phase is Phase.STARTING:
            m = slot.member
            if m.process is not None and m.process.returncode is None and await self._ready(m.url + m.ready_path):
                if slot.phase is not Phase.STARTING:
                    return
                slot.phase = Phase.READY
                await self.publish()
                took = self.clock() - slot.asked_at
                if slot.scaled:
                    self.startup_s.append(took)
                log.info("autoscale: %s ready and receiving traffic %.2f s after the %s", m.name, took,
                         "decision" if slot.scaled else "crash was noticed")
                return
            await asyncio.sleep(self.ready_poll_s)

    def _retire(self, slot: Slot) -> None:
        was = slot.phase
        slot.phase = Phase.DRAINING
        if slot.poller is not None:
            slot.poller.cancel()
        self._changed.set()
        task = asyncio.create_task(self._drain(slot, publish_first=was is Phase.READY))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _drain(self, slot: Slot, publish_first: bool) -> None:
        """Stop routing to ``slot`` (PUT as draining), then let the replica drain itself (SIGTERM) and forget it."""
        if publish_first:
            await self.publish()
        code = await self.supervisor.retire(slot.member)
        log.info("autoscale: %s drained and stopped (exit %s)", slot.member.name, code)
        self.slots.pop(slot.index, None)
        self._changed.set()

    async def publish(self) -> bool:
        """PUT the membership; False when the gateway did not take it (retried on the next poll)."""
        async with self._publishing:
            return await self._put()

    async def _put(self) -> bool:
        assert self._session is not None
        self._changed.clear()
        body = self.membership()
        try:
            async with self._session.put(self.gateway_url + MEMBERS_PATH, json=body) as r:
                if r.status != 200:
                    log.warning("autoscale: the gateway refused the membership: %s %s", r.status,
                                (await r.text())[:200])
                    self._changed.set()
                    return False
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.debug("autoscale: membership not sent (%s); retrying", exc)
            self._changed.set()
            return False
        self._last_put = self.clock()
        return True

    async def _get_state(self) -> dict[str, Any] | None:
        assert self._session is not None
        try:
            wait = {"desired": "null" if self.desired is None else str(self.desired), "wait_s": str(self.poll_s)}
            async with self._session.get(self.gateway_url + STATE_PATH, params=wait) as r:
                if r.status != 200:
                    log.warning("autoscale: GET %s answered %s", STATE_PATH, r.status)
                    return None
                state: dict[str, Any] = await r.json()
                return state
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.debug("autoscale: no state from the gateway (%s)", exc)
            return None

    async def _ready(self, url: str) -> bool:
        assert self._session is not None
        try:
            async with self._session.get(url, timeout=aiohttp.ClientTimeout(total=1.0)) as r:
                return r.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False
