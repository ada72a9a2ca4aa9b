"""``fleetserve plan --profile P.json [--profile Q.json …] --qps N --slo-p99-ms MS``: size a fleet by simulation.

Prints, per profile (GPU type), the smallest fleet that holds the SLO with its p50/p99, engine utilisation,
gateway workers, cost per hour and per million requests and the best policy; then every policy at that size
and, for several profiles, the weights a weighted front end should give each type. ``--out`` writes the same
as JSON; ``--plot DIR`` draws latency against load for fleet sizes around each answer.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetserve.batching.config import BatcherConfig
from fleetserve.options import option
from fleetserve.sim.faults import Fault
from fleetserve.sim.gateway import policy_names
from fleetserve.sim.planner import DEFAULT_POLICIES, PlanConfig, Planner, ProfilePlan, derived_weights
from fleetserve.sim.profile import Profile


def policies(text: str) -> tuple[str, ...]:
    """A comma list of balancing policy names."""
    names = tuple(p.strip() for p in text.split(",") if p.strip())
    unknown = [n for n in names if n not in policy_names()]
    if unknown or not names:
        raise ValueError(f"unknown policy {unknown[0] if unknown else text!r}; choose from {', '.join(policy_names())}")
    return names


@dataclass(frozen=True)
class PlanOptions:
    profile: tuple[Path, ...] = option((), "a profile from `fleetserve profile` (repeat for several GPU types)",
                                       metavar="P.json", required=True)
    qps: float = option(0.0, "load to serve, requests/s", required=True)
    slo_p99_ms: float = option(0.0, "p99 latency the fleet must hold, ms", metavar="MS", required=True)
    cost_per_hour: tuple[float, ...] = option((), "price of one replica per hour, one per --profile in order",
                                              metavar="PRICE", default_text="the profile's")
    policies: tuple[str, ...] = option(DEFAULT_POLICIES, "comma list of policies to compare", parse=policies,
                                       repeat=False, metavar="NAME,NAME,...")
    requests: int = option(60_000, "simulated requests per run")
    instances: int = option(1, "engine instances per replica")
    rows: int = option(1, "sequences per request (e.g. 32 for a ranking call)")
    tokens: int | None = option(None, "tokens per sequence", default_text="the profile's measured text mix")
    max_batch: int = option(32, "the replicas' --max-batch")
    max_delay_ms: float = option(2.0, "the replicas' --max-delay-ms")
    gateway_workers: int | None = option(None, "gateway worker processes",
                                         default_text="enough to keep each at half its CPU")
    fault: tuple[Fault, ...] = option((), "inject a fault in every run (repeatable): throttle:1%, crash:0@5, "
                                          "slow:2%x3", parse=Fault.parse, metavar="KIND:TARGETS[xF][@S]")
    max_replicas: int = option(5000, "give up above this fleet size")
    seed: int = option(0, "seed of every random choice in the simulation")
    out: Path | None = option(None, "write the plan as JSON", metavar="FILE.json")
    plot: Path | None = option(None, "write latency-vs-load PNGs into this directory", metavar="DIR")
    quiet: bool = option(False, "no progress lines on stderr")


OPTIONS = PlanOptions


def _ms(value: float) -> str:
    return f"{value * 1e3:.2f}"


def _money(value: float | None) -> str:
    return "—" if value is None else f"{value:,.4f}" if value < 10 else f"{value:,.2f}"


def table(plans: list[ProfilePlan], qps: float) -> str:
    head = ["profile", "replicas", "policy", "p50 ms", "p99 ms", "util", "gw workers", "$/hour", "$/1M req"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for plan in plans:
        p, best = plan.profile, plan.best
        name = p.name + (" (derived)" if p.derived_from else "")
        if best is None:
            lines.append(f"| {name} | none | — | — | — | — | {plan.gateway_workers} | — | — |")
            continue
        hourly = None if p.cost_per_hour is None else best.replicas * p.cost_per_hour
        r = best.result
        lines.append(f"| {name} | {best.replicas} | {best.policy} | {_ms(r.p('p50'))} | {_ms(r.p('p99'))} | "
                     f"{r.utilisation:.2f} | {plan.gateway_workers} | {_money(hourly)} | "
                     f"{_money(plan.cost_per_million(qps))} |")
    return "\n".join(lines)


def policy_table(plan: ProfilePlan) -> str:
    lines = ["| policy | replicas | p50 ms | p99 ms | p99.9 ms | errors | holds |", "|---|---|---|---|---|---|---|"]
    for t in plan.policies:
        r = t.result
        lines.append(f"| {t.policy} | {t.replicas} | {_ms(r.p('p50'))} | {_ms(r.p('p99'))} | {_ms(r.p('p99.9'))} | "
                     f"{r.error_count} | {'yes' if t.holds else 'no'} |")
    return "\n".join(lines)


def plan_json(plans: list[ProfilePlan], config: PlanConfig, weights: dict[str, int]) -> dict[str, Any]:
    def trial(t: Any) -> dict[str, Any]:
        return {"replicas": t.replicas, "policy": t.policy, "holds": t.holds, **t.result.to_json()}

    return {
        "qps": config.qps, "slo_p99_ms": config.slo_p99_s * 1e3, "policies": list(config.policies),
        "requests_per_run": config.requests, "rows": config.rows, "tokens": config.tokens, "seed": config.seed,
        "faults": [str(f) for f in config.faults],
        "weights": weights,
        "profiles": [{
            "name": p.profile.name, "derived_from": p.profile.derived_from, "measured_at": p.profile.measured_at,
            "cost_per_hour": p.profile.cost_per_hour, "gateway_workers": p.gateway_workers,
            "best": trial(p.best) if p.best else None, "reason": p.reason or None,
            "cost_per_million_requests": p.cost_per_million(config.qps),
            "policies_at_best_size": [trial(t) for t in p.policies],
            "trials": [trial(t) for t in p.trials],
        } for p in plans],
    }


def run(args: PlanOptions) -> int:
    if args.cost_per_hour and len(args.cost_per_hour) != len(args.profile):
        raise ValueError(f"give one --cost-per-hour per --profile ({len(args.profile)}), got {len(args.cost_per_hour)}")
    costs: list[float | None] = list(args.cost_per_hour) or [None] * len(args.profile)
    profiles = [Profile.load(path).with_cost(cost) for path, cost in zip(args.profile, costs, strict=True)]
    config = PlanConfig(
        qps=args.qps, slo_p99_s=args.slo_p99_ms / 1000, policies=args.policies, requests=args.requests,
        instances=args.instances, rows=args.rows, tokens=args.tokens, gateway_workers=args.gateway_workers,
        faults=tuple(args.fault),
        batcher=BatcherConfig(max_batch=args.max_batch, max_delay_s=args.max_delay_ms / 1000),
        max_replicas=args.max_replicas, seed=args.seed,
    )

    def say(line: str) -> None:
        if not args.quiet:
            print(line, file=sys.stderr, flush=True)

    planner = Planner(config, progress=say)
    plans = [planner.plan(p) for p in profiles]
    weights = (derived_weights(profiles, config.batcher, instances=config.instances, rows=config.rows,
                               tokens=config.tokens) if len(profiles) > 1 else {})
    shape = f"{config.rows} sequence(s) of {config.tokens or 'the profile mix of'} tokens per request"
    print(f"Smallest fleet for {config.qps:g} req/s at p99 <= {args.slo_p99_ms:g} ms ({shape}; "
          f"{config.requests} simulated requests per run, seed {config.seed}):\n")
    print(table(plans, config.qps))
    for plan in plans:
        if plan.best is not None:
            print(f"\n{plan.profile.name}: every policy at {plan.best.replicas} replicas\n")
            print(policy_table(plan))
        else:
            print(f"\n{plan.profile.name}: no fleet holds the SLO: {plan.reason}")
        if plan.profile.derived_from:
            print(f"\n{plan.profile.name} is derived, not measured: {plan.profile.derived_from}")
    if weights:
        print("\nweights for a weighted front end (per replica): "
              + ", ".join(f"{name}={w}" for name, w in weights.items()))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(plan_json(plans, config, weights), indent=1) + "\n")
        print(f"\nplan written to {args.out}")
    if args.plot:
        from fleetserve.sim.plot import latency_curves, plot_curves

        for plan in plans:
            if plan.best is not None:
                curves = latency_curves(planner, plan, max(1000, config.requests // 3), progress=say)
                print(f"plot written to {plot_curves(plan, curves, config.slo_p99_s, args.plot)}")
    return 0
