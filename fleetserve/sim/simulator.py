"""The fleet simulator: arrivals → gateway workers → replicas → answers, on a simulated clock.

:func:`simulate` builds the fleet of :mod:`fleetserve.sim.config`, runs it on the heap-based event loop
(:mod:`fleetserve.sim.events`) until every request was answered, and returns a :class:`SimResult`. All
decisions are the product's own code: balancing, health and ejection (:mod:`fleetserve.sim.gateway`) and
batching (:mod:`fleetserve.sim.replica`); this module only wires the pieces, injects faults, runs active
health checks every ``health_interval_s`` and consults the scaling rule. Every random choice comes from a
stream seeded by ``seed`` and the stream's purpose, so a run is reproducible and adding a replica does not
reshuffle the arrivals.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator

from fleetserve.sim.arrivals import Arrival
from fleetserve.sim.config import DEFAULT_COLD_START_S, ReplicaGroup, SimConfig
from fleetserve.sim.events import EventLoop
from fleetserve.sim.faults import Fault
from fleetserve.sim.front import FrontWorker
from fleetserve.sim.gateway import endpoint, quiet_gateway_logs
from fleetserve.sim.host import Host
from fleetserve.sim.replica import DOWN, READY, STARTING, SimReplica
from fleetserve.sim.request import Request
from fleetserve.sim.results import Recorder, SimResult, error_names, latency_stats
from fleetserve.sim.scaling import FixedSize, FleetSnapshot


class Simulation:
    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.loop = EventLoop()
        seed = config.seed
        self._rng = {name: random.Random(f"{seed}:{name}") for name in ("arrivals", "lengths", "front", "faults")}
        self._shared = (
            Host(self.loop, config.shared_host_cores, background=config.background_cores, shared=True, name="shared")
            if config.shared_host_cores is not None else None
        )
        gateway_host = self._shared or Host(self.loop, config.gateway_workers, name="gateway")
        scaling = config.scaling
        elastic = scaling is not None and not isinstance(scaling.rule, FixedSize)
        self.workers = [
            FrontWorker(self.loop, gateway_host, config.balancer, cpu_s=config.gateway_cpu(),
                        max_retries=config.max_retries, rng=random.Random(f"{seed}:balancer:{i}"),
                        done=self._done, network_s=config.network_s, wait_s=config.gateway_wait(),
                        busy_cpu_s=config.gateway_busy_cpu(), cpu_curve=config.gateway_cpu_curve(),
                        name=f"gateway/{i}", adaptive=config.adaptive,
                        unlimited=self._can_grow if elastic else None)
            for i in range(config.gateway_workers)
        ]
        self._front_draw = self._rng["front"].randrange  # which worker's socket takes a connection (_arrive)
        self.replicas: list[SimReplica] = []
        self._shapes: dict[int, dict[tuple[int, int], tuple[float, float, float]]] = {}
        self._group_of: dict[str, ReplicaGroup] = {}
        self._serial = 0
        for group in config.groups:
            for _ in range(group.replicas):
                self._add_replica(group, READY)
        self._ticked_ready = len(self.replicas)  # ready replicas the last scaling tick saw (the gateway's view)
        self._faults = self._targets()
        self._probe_streaks: dict[str, int] = {}
        self._recorder = Recorder(config.warmup_s, config.split_tokens)
        self._sampler = config.length_mix().sampler(self._rng["lengths"])
        self._arrivals: Iterator[Arrival] = config.arrivals.source(self._rng["arrivals"])
        self._arrived = 0
        self._outstanding = 0
        self._last_arrival = 0.0
        self._finished = False
        self._notes: list[str] = []
        self._tick_arrivals = 0
        self._tick_latencies = 0
        self._tick_busy = 0.0

    # fleet membership
    def _add_replica(self, group: ReplicaGroup, state: str) -> SimReplica:
        cfg, profile = self.config, group.profile
        name = f"replica-{self._serial}"
        self._serial += 1
        if self._shared is not None:
            cpu_host = self._shared
        else:
            own = cfg.replica_cores or (profile.threads * group.instances + 1 if profile.device == "cpu" else 2.0)
            cpu_host = Host(self.loop, own, name=f"{name}/cpu")
        device_host = (
            cpu_host if profile.device == "cpu"
            else Host(self.loop, profile.device_capacity, name=f"{name}/device")
        )
        replica = SimReplica(
            self.loop, name, profile, cfg.batcher, instances=group.instances, cpu_host=cpu_host,
            device_host=device_host, rng=random.Random(f"{cfg.seed}:service:{name}"),
            weight=group.weight, shapes=self._shapes.setdefault(id(profile), {}),
        )
        replica.state = state
        self.replicas.append(replica)
        self._group_of[name] = group
        if state == READY:
            self._announce(replica)
        return replica

    def _announce(self, replica: SimReplica) -> None:
        ep = endpoint(replica.name, replica.weight)
        for worker in self.workers:
            worker.balancer.add(ep, replica)

    def _cold_start(self, replica: SimReplica) -> float:
        profile = self._group_of[replica.name].profile
        if self.config.cold_start_s is None and profile.cold_start_s is None and (
            note := f"cold start of {profile.name} not measured: {DEFAULT_COLD_START_S:g} s assumed"
        ) not in self._notes:
            self._notes.append(note)
        return self.config.cold_start(profile)

    # arrivals and answers
    def _next_arrival(self) -> None:
        if self._arrived >= self.config.requests:
            return
        try:
            at, tokens = next(self._arrivals)
        except StopIteration:
            return
        self.loop.schedule(at, self._arrive, tokens)

    def _arrive(self, tokens: int | None) -> None:
        now = self.loop.now
        self._arrived += 1
        self._tick_arrivals += 1
        self._outstanding += 1
        self._last_arrival = now
        request = Request(now, tokens if tokens is not None else self._sampler(), self.config.rows)
        workers = self.workers
        worker = workers[0] if len(workers) == 1 else workers[self._front_draw(len(workers))]
        worker.receive(request)
        self._next_arrival()

    def _can_grow(self) -> bool:
        """Whether the scaling rule may still add capacity: its last tick saw fewer ready replicas than its maximum,
        as the gateway's autoscaler judges it (the gateway's limit then refuses nothing)."""
        assert self.config.scaling is not None
        return self._ticked_ready < self.config.scaling.max_replicas

    def _done(self, request: Request, status: int) -> None:
        self._recorder.record(request.arrived_at, self.loop.now, status, request.tokens)
        self._outstanding -= 1
        if self._outstanding == 0 and self._arrived >= self.config.requests:
            self._finished = True

    # periodic work: health checks, scaling
    def _health_round(self, _: object = None) -> None:
        """Every gateway worker probes every replica, as the health checker does each interval.

        Once a replica passed ``healthy_threshold`` probes in a row, more passing probes change nothing in any
        balancer (it is healthy, its failure count is zero), so they are not delivered until one fails: with
        a hundred workers and a thousand replicas that is most of a run's probe calls.
        """
        if self._finished:
            return
        threshold = self.config.balancer.healthy_threshold
        streaks = self._probe_streaks
        for replica in self.replicas:
            ok = replica.state == READY
            streak = streaks.get(replica.name, 0)
            if ok and streak >= threshold:
                continue
            streaks[replica.name] = streak + 1 if ok else 0
            for worker in self.workers:
                worker.balancer.probe(replica.name, ok)
        self.loop.after(self.config.balancer.health_interval_s, self._health_round)

    def _scale_tick(self, _: object = None) -> None:
        scaling = self.config.scaling
        if self._finished or scaling is None:
            return
        interval = scaling.interval_s
        ready = [r for r in self.replicas if r.state in (READY, DOWN)]
        self._ticked_ready = len(ready)
        starting = [r for r in self.replicas if r.state == STARTING]
        busy = sum(s.busy_seconds() for r in ready for s in r.instances)
        slots = sum(len(r.instances) for r in ready) or 1
        latencies = self._recorder.latencies[self._tick_latencies:]
        snapshot = FleetSnapshot(
            at_s=self.loop.now, ready=len(ready), starting=len(starting),
            arrival_rate=self._tick_arrivals / interval,
            p99_s=latency_stats(latencies)["p99"] if latencies else None,
            utilisation=min(1.0, max(0.0, (busy - self._tick_busy) / (interval * slots))),
            queue_depth=sum(r.queue_depth for r in ready), inflight=sum(r.inflight_rows for r in ready),
        )
        self._tick_arrivals, self._tick_latencies, self._tick_busy = 0, len(self._recorder.latencies), busy
        want = min(scaling.max_replicas, max(scaling.min_replicas, scaling.rule.desired(snapshot)))
        have = len(ready) + len(starting)
        for _ in range(want - have):
            replica = self._add_replica(self.config.groups[0], STARTING)
            self.loop.after(self._cold_start(replica), self._ready, replica)
        # Like a Kubernetes ReplicaSet scaling down: replicas not ready yet go first, then the newest.
        for replica in (starting[::-1] + ready[::-1])[: max(0, have - want)]:
            self._retire(replica)
        self.loop.after(interval, self._scale_tick)

    def _ready(self, replica: SimReplica) -> None:
        if replica.state == STARTING and replica in self.replicas:  # not retired while starting
            replica.state = READY
            self._announce(replica)

    def _retire(self, replica: SimReplica) -> None:
        """Scale-down: the gateway stops routing to it; work it holds finishes (a drain)."""
        for worker in self.workers:
            worker.balancer.remove(replica.name)
        self.replicas.remove(replica)

    # faults
    def _targets(self) -> list[tuple[Fault, list[SimReplica]]]:
        targets = []
        for fault in self.config.faults:
            hit = [self.replicas[i] for i in fault.targets(len(self.replicas), self._rng["faults"])]
            if fault.kind in ("throttle", "crash"):
                for replica in hit:
                    replica.interruptible()
            targets.append((fault, hit))
        return targets

    def _inject(self, fault: Fault, replicas: list[SimReplica]) -> None:
        action = {"throttle": self._stop, "crash": self._crash, "slow": self._slow}[fault.kind]
        for replica in replicas:
            self.loop.schedule(fault.at_s, action, (replica, fault))

    def _stop(self, args: tuple[SimReplica, Fault]) -> None:
        replica, fault = args
        if self._finished:
            return
        replica.pause()
        self.loop.after(fault.stop_ms / 1000, self._cont, args)

    def _cont(self, args: tuple[SimReplica, Fault]) -> None:
        replica, fault = args
        replica.resume()
        self.loop.after((fault.period_ms - fault.stop_ms) / 1000, self._stop, args)

    def _crash(self, args: tuple[SimReplica, Fault]) -> None:
        replica, fault = args
        replica.crash()
        self.loop.after(fault.restart_s + self._cold_start(replica), self._restarted, replica)

    def _restarted(self, replica: SimReplica) -> None:
        if replica.state == DOWN:
            replica.state = READY

    @staticmethod
    def _slow(args: tuple[SimReplica, Fault]) -> None:
        replica, fault = args
        replica.slow_factor = fault.factor

    # the run
    def run(self) -> SimResult:
        cfg = self.config
        started = time.perf_counter()
        if cfg.health_checks:
            for worker in self.workers:
                worker.balancer.enable_active_health()
            self._health_round()
        for fault, replicas in self._faults:
            self._inject(fault, replicas)
        if cfg.scaling is not None:
            self.loop.after(cfg.scaling.interval_s, self._scale_tick)
        self._next_arrival()
        self.loop.run(stop=lambda: self._finished)
        return self._result(time.perf_counter() - started)

    def _result(self, wall_s: float) -> SimResult:
        rec = self._recorder
        window = max(0.0, self._last_arrival - rec.window_start)
        elapsed = self.loop.now
        groups: dict[str, list[float]] = {}
        for replica in self.replicas:
            groups.setdefault(replica.profile.name, []).append(replica.utilisation(elapsed))
        utils = [u for values in groups.values() for u in values]
        batches = sum(r.batches for r in self.replicas)
        rows = sum(r.batched_rows for r in self.replicas)
        return SimResult(
            offered_rps=self._arrived / max(self._last_arrival, 1e-9), window_s=window, ok=len(rec.latencies),
            ok_in_window=rec.answered_by(self._last_arrival),
            errors=error_names(rec.errors), latency_s=latency_stats(rec.latencies),
            utilisation=sum(utils) / len(utils) if utils else 0.0,
            utilisation_by_group={k: sum(v) / len(v) for k, v in groups.items()},
            mean_batch=rows / batches if batches else 0.0,
            retries=sum(w.retries for w in self.workers), replicas=len(self.replicas), requests=self._arrived,
            wall_s=wall_s, events=self.loop.steps, notes=tuple(self._notes),
            engine_s_per_request=sum(r.engine_row_seconds for r in self.replicas) / rows if rows else float("nan"),
            latency_by_length=rec.by_length(),
        )


def simulate(config: SimConfig) -> SimResult:
    with quiet_gateway_logs():
        return Simulation(config).run()
