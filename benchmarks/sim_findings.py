"""Simulator findings at scale (issue 15), printed as tables for BENCHMARKS.md.

1. ``fleet``: p99 against fleet size for round robin and p2c-peak-ewma when 1% of the replicas are throttled
   (SIGSTOP 80 of every 100 ms, from the end of the warm-up), each fleet at ``--load`` of its best throughput,
   ``--seconds`` of simulated traffic; the measured CPU profile (``--cpu-profile``).
2. ``mixed``: a fleet of two engine types of different speeds, half of each (``--mixed``: H200 bert-base fp16
   and fp8, derived profiles), ranking-sized requests (``--mixed-rows`` sequences of 128 tokens, max batch
   128: large enough that the engines, not the replicas' event loops, bound each replica) at 90% of the fleet's
   best throughput: weighted round robin and p2c-peak-ewma, each with equal and with the planner's derived
   weights.
3. ``plan``: the article's scenario — 5,000 requests/s of single texts at p99 ≤ 50 ms — per profile: the
   planner's smallest fleet, best policy, p50/p99 and replica-hours per million requests (cost per million
   requests = that × the price of one replica-hour).

Profiles marked derived carry numbers transcribed from BENCHMARKS.md, not measured by ``fleetserve profile``.

    .venv/bin/python benchmarks/sim_findings.py [--only fleet,mixed,plan] [--sizes 100,250,500,1000]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from fleetserve.batching.config import BatcherConfig
from fleetserve.sim.arrivals import ArrivalConfig
from fleetserve.sim.config import ReplicaGroup, SimConfig
from fleetserve.sim.faults import Fault
from fleetserve.sim.gateway import BalancerConfig
from fleetserve.sim.planner import PlanConfig, Planner, derived_weights, gateway_workers, replica_capacity
from fleetserve.sim.profile import LengthMix, Profile
from fleetserve.sim.results import SimResult
from fleetserve.sim.simulator import simulate

PROFILES = Path("benchmarks/profiles")
WARMUP_S = 2.0


def label(profile: Profile) -> str:
    return profile.name + (" (derived)" if profile.derived_from else "")


def ms(result: SimResult, p: str) -> str:
    return f"{result.p(p) * 1e3:.1f}"


def fleet_sizes(args: argparse.Namespace) -> None:
    profile = Profile.load(args.cpu_profile)
    batcher = BatcherConfig(max_batch=32, max_delay_s=0.002)
    per_replica = replica_capacity(profile, batcher, 1)
    print(f"\n### p99 vs fleet size, 1% of replicas throttled ({label(profile)}, {args.load:.0%} load, "
          f"{args.seconds:g} s simulated after {WARMUP_S:g} s warm-up)\n")
    print("| replicas | throttled | req/s | policy | p50 ms | p99 ms | p99.9 ms | errors |")
    print("|---:|---:|---:|---|---:|---:|---:|---:|")
    for n in args.sizes:
        rate = args.load * per_replica * n
        fault = Fault("throttle", share=0.01, at_s=WARMUP_S)
        for policy in ("round-robin", "p2c-peak-ewma"):
            result = simulate(SimConfig(
                groups=(ReplicaGroup(profile, n),), arrivals=ArrivalConfig("poisson", rate=rate),
                requests=round(rate * (WARMUP_S + args.seconds)), warmup_s=WARMUP_S,
                balancer=BalancerConfig(policy=policy), batcher=batcher,
                gateway_workers=gateway_workers(profile, rate), faults=(fault,), seed=args.seed,
            ))
            print(f"| {n} | {max(1, round(0.01 * n))} | {rate:,.0f} | {policy} | {ms(result, 'p50')} | "
                  f"{ms(result, 'p99')} | {ms(result, 'p99.9')} | {result.error_count} |",
                  flush=True)


def mixed(args: argparse.Namespace) -> None:
    profiles = [Profile.load(p) for p in args.mixed]
    batcher = BatcherConfig(max_batch=128, max_delay_s=0.002)
    rows, tokens = args.mixed_rows, 128
    weights = derived_weights(profiles, batcher, rows=rows, tokens=tokens)
    capacity = sum(replica_capacity(p, batcher, 1, rows=rows, tokens=tokens) * args.mixed_replicas for p in profiles)
    rate = 0.9 * capacity
    print(f"\n### Mixed fleet: {args.mixed_replicas} replicas each of " + " and ".join(label(p) for p in profiles)
          + f", {rows} x {tokens}-token sequences per request, {rate:,.0f} req/s (90% of best), "
          f"{args.seconds:g} s simulated\n")
    print("| policy | weights | p50 ms | p99 ms | p99.9 ms | errors | " + " | ".join(
        f"{p.name} util" for p in profiles) + " |")
    print("|---|---|---:|---:|---:|---:|" + "---:|" * len(profiles))
    cases = [("weighted-round-robin", {p.name: 1 for p in profiles}, "equal"),
             ("weighted-round-robin", weights, "derived"), ("p2c-peak-ewma", {p.name: 1 for p in profiles}, "equal"),
             ("p2c-peak-ewma", weights, "derived")]
    for policy, w, kind in cases:
        groups = tuple(ReplicaGroup(p, args.mixed_replicas, weight=w[p.name]) for p in profiles)
        result = simulate(SimConfig(
            groups=groups, arrivals=ArrivalConfig("poisson", rate=rate),
            requests=round(rate * (WARMUP_S + args.seconds)), warmup_s=WARMUP_S,
            balancer=BalancerConfig(policy=policy), batcher=batcher, rows=rows,
            lengths=LengthMix.fixed(tokens), gateway_workers=gateway_workers(profiles[0], rate), seed=args.seed,
        ))
        shown = ":".join(str(w[p.name]) for p in profiles)
        print(f"| {policy} | {kind} {shown} | {ms(result, 'p50')} | {ms(result, 'p99')} | {ms(result, 'p99.9')} | "
              f"{result.error_count} | " + " | ".join(f"{result.utilisation_by_group[p.name]:.2f}" for p in profiles)
              + " |", flush=True)


def plan(args: argparse.Namespace) -> None:
    print(f"\n### {args.qps:g} requests/s at p99 <= {args.slo_ms:g} ms, per profile (planner, "
          f"{args.plan_requests} requests per run)\n")
    print("| profile | replicas | policy | p50 ms | p99 ms | engine util | gateway workers | "
          "replica-hours per 1M requests |")
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    config = PlanConfig(qps=args.qps, slo_p99_s=args.slo_ms / 1e3, requests=args.plan_requests, seed=args.seed)
    for path in args.plan_profiles:
        profile = Profile.load(path)
        result = Planner(config).plan(profile)
        best = result.best
        if best is None:
            print(f"| {label(profile)} | none: {result.reason} | — | — | — | — | — | — |", flush=True)
            continue
        hours = best.replicas / (args.qps * 3600) * 1e6
        print(f"| {label(profile)} | {best.replicas} | {best.policy} | {ms(best.result, 'p50')} | "
              f"{ms(best.result, 'p99')} | {best.result.utilisation:.2f} | {result.gateway_workers} | {hours:.3f} |",
              flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="fleet,mixed,plan")
    ap.add_argument("--cpu-profile", type=Path, default=PROFILES / "minilm-int8-cpu.json")
    ap.add_argument("--sizes", type=lambda t: [int(x) for x in t.split(",")], default=[100, 250, 500, 1000])
    ap.add_argument("--load", type=float, default=0.6)
    ap.add_argument("--seconds", type=float, default=10.0, help="simulated seconds after the warm-up")
    ap.add_argument("--mixed", type=Path, nargs=2,
                    default=[PROFILES / "h200-bert-base-fp16.json", PROFILES / "h200-bert-base-fp8.json"])
    ap.add_argument("--mixed-replicas", type=int, default=8)
    ap.add_argument("--mixed-rows", type=int, default=64)
    ap.add_argument("--qps", type=float, default=5000.0)
    ap.add_argument("--slo-ms", type=float, default=50.0)
    ap.add_argument("--plan-requests", type=int, default=60_000)
    ap.add_argument("--plan-profiles", type=Path, nargs="+", default=[
        PROFILES / "minilm-int8-cpu.json", PROFILES / "cpu-bert-base-int8.json",
        PROFILES / "h200-bert-base-fp16.json", PROFILES / "h200-bert-base-fp8.json"])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(f"# simulator findings — {time.strftime('%Y-%m-%d %H:%M %Z')}, {os.cpu_count()} cores, load average "
          + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    only = args.only.split(",")
    if "fleet" in only:
        fleet_sizes(args)
    if "mixed" in only:
        mixed(args)
    if "plan" in only:
        plan(args)


if __name__ == "__main__":
    main()
