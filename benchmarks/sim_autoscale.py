"""Autoscaling rules at scale in the simulator (issue 10): ``hpa`` against ``predictive`` on a ramp and a step.

The product's own rules (:mod:`fleetserve.autoscale`, run through :class:`fleetserve.sim.scaling.ProductRule`)
size a simulated fleet of ``--replicas`` replicas at the start, ``--load`` of their best throughput, under
Poisson arrivals whose rate follows a trace:

- ``ramp``: flat for 30 s, then 10x over 60 s (issue 10's trace (a)), then flat for 20 s;
- ``step``: flat for 30 s, then 5x within 1 s (trace (b)), then flat for 50 s.

At 100 replicas the ramp ends needing about 1,000. Each tick (1 s) the rule sees the snapshot a gateway would
take; a new replica serves after ``--cold-start-s``, which the rules are told was measured (the predictive
rule's lead). Per trace and mode: **SLO-violation seconds** (1 s intervals whose p99 of the answers given in
them exceeds ``--slo-p99-ms``, or with no answer while requests were arriving), **replica-seconds** (replicas
ready or starting, integrated over the ticks: the cost), failed requests, the overall p99, the largest fleet
and the first scale-up after the load starts to rise. ``fixed-small`` (the starting fleet) and ``fixed-large``
(the fleet the peak needs at ``--load``) are the baselines, on request (``--modes``).

The hpa rule targets 16 queued rows per replica (half a CPU batch, as the Kubernetes assets do) and 70% engine
utilisation (the article's GPU-utilisation target, fed the simulated engines' busy share); the predictive rule
uses the same hpa settings beside it.

    PYTHONPATH=. flock /tmp/fleetserve-bench.lock .venv/bin/python benchmarks/sim_autoscale.py \\
        [--replicas 100] [--traces ramp,step] [--modes hpa,predictive]
"""

from __future__ import annotations

import argparse
import itertools
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from fleetserve.autoscale.config import AutoscaleConfig, HpaConfig
from fleetserve.batching.config import BatcherConfig
from fleetserve.sim.arrivals import ArrivalConfig, RampPoint
from fleetserve.sim.config import ReplicaGroup, SimConfig
from fleetserve.sim.gateway import BalancerConfig
from fleetserve.sim.planner import gateway_workers, replica_capacity
from fleetserve.sim.profile import Profile
from fleetserve.sim.results import SimResult
from fleetserve.sim.scaling import FixedSize, FleetSnapshot, ProductRule, ScalingConfig, ScalingRule
from fleetserve.sim.simulator import simulate

WARMUP_S = 5.0
TICK_S = 1.0
RISE_AT_S = 30.0
MODES = ("fixed-small", "fixed-large", "hpa", "predictive")


def trace(name: str, rate: float) -> tuple[RampPoint, ...]:
    if name == "ramp":
        return (RampPoint(0, rate), RampPoint(RISE_AT_S, rate), RampPoint(RISE_AT_S + 60, 10 * rate),
                RampPoint(RISE_AT_S + 80, 10 * rate))
    if name == "step":
        return (RampPoint(0, rate), RampPoint(RISE_AT_S, rate), RampPoint(RISE_AT_S + 1, 5 * rate),
                RampPoint(RISE_AT_S + 51, 5 * rate))
    raise SystemExit(f"unknown trace {name!r} (ramp, step)")


def arrivals_of(points: tuple[RampPoint, ...]) -> int:
    """Expected arrivals over the trace (the integral of its piecewise-linear rate)."""
    return round(sum((a.rate + b.rate) / 2 * (b.at_s - a.at_s) for a, b in itertools.pairwise(points)))


@dataclass
class Recording:
    """Wraps a rule and keeps what each tick saw: (at_s, ready, starting, arrival rate, p99)."""

    rule: ScalingRule
    ticks: list[tuple[float, int, int, float, float | None]] = field(default_factory=list)

    def desired(self, snapshot: FleetSnapshot) -> int:
        self.ticks.append((snapshot.at_s, snapshot.ready, snapshot.starting, snapshot.arrival_rate,
                           snapshot.p99_s))
        return self.rule.desired(snapshot)

    def violation_seconds(self, slo_s: float) -> int:
        return sum(1 for at, _, _, rate, p99 in self.ticks
                   if at > WARMUP_S and ((p99 is None and rate > 0) or (p99 is not None and p99 > slo_s)))

    def replica_seconds(self) -> float:
        return sum((ready + starting) * TICK_S for _, ready, starting, _, _ in self.ticks)

    def peak(self) -> int:
        return max(ready + starting for _, ready, starting, _, _ in self.ticks)

    def first_up_after(self, at_s: float) -> float | None:
        start = next((r + s for t, r, s, _, _ in self.ticks if t >= at_s), None)
        return next((t - at_s for t, r, s, _, _ in self.ticks if t >= at_s and start is not None and r + s > start),
                    None)


def run(args: argparse.Namespace, profile: Profile, trace_name: str, mode: str) -> tuple[Recording, SimResult, float]:
    batcher = BatcherConfig(max_batch=32, max_delay_s=0.002)
    per_replica = replica_capacity(profile, batcher, 1)
    rate = args.load * per_replica * args.replicas
    points = trace(trace_name, rate)
    peak_rate = max(p.rate for p in points)
    large = math.ceil(peak_rate / (args.load * per_replica))
    if mode in ("hpa", "predictive"):
        config = AutoscaleConfig(rule=mode, min_replicas=1, max_replicas=4 * large, slo_p99_ms=args.slo_p99_ms,
                                 interval_s=TICK_S, rate_window_s=TICK_S,
                                 hpa=HpaConfig(target_queue_depth=16.0, target_gpu_utilization=70.0))
        inner: ScalingRule = ProductRule.from_config(config, startup_s=args.cold_start_s, engine_as_gpu=True)
    else:
        inner = FixedSize()
    recording = Recording(inner)
    start = large if mode == "fixed-large" else args.replicas
    started = time.perf_counter()
    result = simulate(SimConfig(
        groups=(ReplicaGroup(profile, start),), arrivals=ArrivalConfig("ramp", rate, ramp=points),
        requests=arrivals_of(points), warmup_s=WARMUP_S, balancer=BalancerConfig(policy="p2c-peak-ewma"),
        batcher=batcher, gateway_workers=gateway_workers(profile, peak_rate), seed=args.seed,
        scaling=ScalingConfig(recording, interval_s=TICK_S, min_replicas=1, max_replicas=4 * large,
                              cold_start_s=args.cold_start_s)))
    return recording, result, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", type=Path, default=Path("benchmarks/profiles/minilm-int8-cpu.json"))
    parser.add_argument("--replicas", type=int, default=100, help="the fleet at the start")
    parser.add_argument("--load", type=float, default=0.6, help="share of the starting fleet's best throughput")
    parser.add_argument("--traces", default="ramp,step")
    parser.add_argument("--modes", default="hpa,predictive", help=f"comma list of {', '.join(MODES)}")
    parser.add_argument("--slo-p99-ms", type=float, default=500.0,
                        help="the measured minilm CPU profile answers at 150-300 ms p99 at 60%% load")
    parser.add_argument("--cold-start-s", type=float, default=10.0, help="replica start-up time (simulated)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    if unknown := set(modes) - set(MODES):
        raise SystemExit(f"unknown modes {sorted(unknown)} (known: {', '.join(MODES)})")
    profile = Profile.load(args.profile)
    print(f"\n### hpa vs predictive in the simulator: {args.replicas} replicas at {args.load:.0%} at the start, "
          f"{profile.name}, SLO p99 {args.slo_p99_ms:g} ms, cold start {args.cold_start_s:g} s, 1 s ticks\n")
    print("| trace | mode | SLO-violation s | replica-s | failed | p99 ms | peak replicas | first up after rise s "
          "| requests | wall s |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for trace_name in args.traces.split(","):
        for mode in modes:
            rec, result, wall = run(args, profile, trace_name, mode)
            first = rec.first_up_after(RISE_AT_S)
            print(f"| {trace_name} | {mode} | {rec.violation_seconds(args.slo_p99_ms / 1000)} | "
                  f"{rec.replica_seconds():,.0f} | {result.error_count} | {result.p('p99') * 1e3:.0f} | "
                  f"{rec.peak()} | {'-' if first is None else f'{first:g}'} | {result.requests:,} | {wall:.0f} |",
                  flush=True)


if __name__ == "__main__":
    main()
