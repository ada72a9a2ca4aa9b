"""Simulator speed (issue 15): the event core against SimPy, and the whole simulator at the scale target.

1. core: the event pattern of the scale target without the fleet logic — ``--replicas`` FIFO servers,
   ``--requests`` Poisson arrivals routed uniformly at random, lognormal service times — once on
   :class:`fleetserve.sim.events.EventLoop` with plain callbacks and once on SimPy (a process per request,
   ``simpy.Resource`` per server), same random draws; prints both wall times and checks the two agree on the
   mean latency.
2. simulator: ``fleetserve.sim.simulate`` on ``--replicas`` replicas of ``--profile`` at ``--utilisation`` of
   their best throughput (p2c-peak-ewma, health checks, the real collator), ``--requests`` requests.

Both report wall time and process CPU time (on a shared machine the latter is the fairer figure; pin with
``taskset -c 1`` to keep one core).

    .venv/bin/python benchmarks/sim_core.py --profile benchmarks/profiles/minilm-int8-cpu.json
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from pathlib import Path

from fleetserve.batching.config import BatcherConfig
from fleetserve.sim.arrivals import ArrivalConfig
from fleetserve.sim.config import ReplicaGroup, SimConfig
from fleetserve.sim.events import EventLoop
from fleetserve.sim.gateway import BalancerConfig, quiet_gateway_logs
from fleetserve.sim.planner import gateway_workers, replica_capacity
from fleetserve.sim.profile import Profile
from fleetserve.sim.simulator import Simulation


def draws(replicas: int, requests: int, seed: int) -> tuple[list[float], list[int], list[float]]:
    rng = random.Random(seed)
    t, at, where, work = 0.0, [], [], []
    rate = replicas * 600.0
    for _ in range(requests):
        t += rng.expovariate(rate)
        at.append(t)
        where.append(rng.randrange(replicas))
        work.append(rng.lognormvariate(-7.5, 0.3))  # mean ≈ 0.58 ms: 35% busy at 600 req/s per server
    return at, where, work


def heap_core(replicas: int, at: list[float], where: list[int], work: list[float]) -> float:
    loop = EventLoop()
    queues: list[list[tuple[float, float]]] = [[] for _ in range(replicas)]
    busy = [False] * replicas
    latency: list[float] = []

    def start(server: int, arrived: float, w: float) -> None:
        busy[server] = True
        loop.after(w, finish, (server, arrived))

    def finish(job: tuple[int, float]) -> None:
        server, arrived = job
        latency.append(loop.now - arrived)
        busy[server] = False
        if queues[server]:
            start(server, *queues[server].pop(0))

    def arrive(i: int) -> None:
        server = where[i]
        if busy[server]:
            queues[server].append((at[i], work[i]))
        else:
            start(server, at[i], work[i])
        if i + 1 < len(at):
            loop.schedule(at[i + 1], arrive, i + 1)

    loop.schedule(at[0], arrive, 0)
    loop.run()
    return statistics.fmean(latency)


def simpy_core(replicas: int, at: list[float], where: list[int], work: list[float]) -> float:
    import simpy

    env = simpy.Environment()
    servers = [simpy.Resource(env, capacity=1) for _ in range(replicas)]
    latency: list[float] = []

    def request(i: int):  # type: ignore[no-untyped-def]
        arrived = env.now
        with servers[where[i]].request() as req:
            yield req
            yield env.timeout(work[i])
        latency.append(env.now - arrived)

    def source():  # type: ignore[no-untyped-def]
        for i, t in enumerate(at):
            yield env.timeout(t - env.now)
            env.process(request(i))

    env.process(source())
    env.run()
    return statistics.fmean(latency)


def timed(fn, *args):  # type: ignore[no-untyped-def]
    wall, cpu = time.perf_counter(), time.process_time()
    value = fn(*args)
    return value, time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replicas", type=int, default=1000)
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--profile", type=Path, default=Path("benchmarks/profiles/minilm-int8-cpu.json"))
    ap.add_argument("--utilisation", type=float, default=0.6)
    ap.add_argument("--only", choices=("core", "simulator"), help="run one part only")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(f"# {args.replicas} replicas x {args.requests:,} requests, {time.strftime('%Y-%m-%d %H:%M %Z')}, "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.only in (None, "core"):
        at, where, work = draws(args.replicas, args.requests, args.seed)
        ours, wall, cpu = timed(heap_core, args.replicas, at, where, work)
        print(f"heap event loop: {wall:.1f} s wall, {cpu:.1f} s CPU (mean latency {ours * 1e3:.4f} ms)", flush=True)
        theirs, wall_simpy, cpu_simpy = timed(simpy_core, args.replicas, at, where, work)
        print(f"SimPy {__import__('simpy').__version__}: {wall_simpy:.1f} s wall, {cpu_simpy:.1f} s CPU "
              f"(mean latency {theirs * 1e3:.4f} ms) = {cpu_simpy / cpu:.1f}x the heap loop's CPU", flush=True)
    if args.only in (None, "simulator"):
        profile = Profile.load(args.profile)
        batcher = BatcherConfig(max_batch=32, max_delay_s=0.002)
        rate = args.utilisation * args.replicas * replica_capacity(profile, batcher, 1)
        config = SimConfig(
            groups=(ReplicaGroup(profile, args.replicas),), arrivals=ArrivalConfig("poisson", rate=rate),
            requests=args.requests, warmup_s=0.0, balancer=BalancerConfig(), batcher=batcher,
            gateway_workers=gateway_workers(profile, rate), seed=args.seed,
        )
        with quiet_gateway_logs():
            sim, setup_wall, setup_cpu = timed(Simulation, config)
            result, wall, cpu = timed(sim.run)
        print(f"simulator ({profile.name}, p2c-peak-ewma, {rate:,.0f} req/s, {config.gateway_workers} gateway "
              f"workers): set-up {setup_wall:.1f} s wall / {setup_cpu:.1f} s CPU, run {wall:.1f} s wall / "
              f"{cpu:.1f} s CPU, total {setup_wall + wall:.1f} s wall / {setup_cpu + cpu:.1f} s CPU; "
              f"{result.events:,} events, p99 {result.p('p99') * 1e3:.2f} ms, mean batch {result.mean_batch:.2f}")


if __name__ == "__main__":
    main()
