"""Gateway scenario benchmarks (issue 4): overhead, throttled replica, crash, rolling restart.

Every run is a real local fleet of ``tiny`` replicas (``fleetserve up`` machinery) behind a front — our
gateway (each policy), NGINX or HAProxy from Debian packages, or nothing (direct) — driven open loop by
``fleetserve bench`` machinery, with one fault injected into replica 0:

1. overhead: one replica; direct vs fleetserve gateway vs NGINX vs HAProxy; added p50/p99 and front CPU
   per request (all routing, health checking, retry and metrics features on in our gateway).
2. throttled: four replicas, replica 0 SIGSTOPped 80 ms of every 100 ms while still passing health checks
   (the seed's overheating GPU), load at ~60% of fleet capacity: every policy, the default policy with
   hedging on (p99), NGINX round-robin and least_conn, HAProxy leastconn, against the all-healthy p99.
3. crash: SIGKILL replica 0 under load; errors, time until the gateway stops routing to it, time until the
   restarted replica is back in rotation.
4. rolling: SIGTERM every replica in turn under load; errors.
5. hedging (only when asked for, ``--only hedging``): the throttled scenario with the default policy and
   hedging at p95, at p99 and off, interleaved ``--repeat`` times, against one all-healthy run.

    .venv/bin/python benchmarks/gateway.py [--only overhead,throttled,crash,rolling,hedging] [--duration 30]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import time
from pathlib import Path

from fleetserve.bench.scenarios import ScenarioConfig, ScenarioResult, run_scenario
from fleetserve.deploy.local import ProxyUnavailable, find_binary
from fleetserve.gateway.policies import policy_names

ALL = ("overhead", "throttled", "crash", "rolling")
EXTRA = ("hedging",)


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def installed(front: str) -> bool:
    """Whether a front's proxy binary is here (the NGINX/HAProxy rows are skipped, with a note, if not)."""
    name = front.split("-", 1)[0]
    if name not in ("nginx", "haproxy"):
        return True
    try:
        find_binary(name)
    except ProxyUnavailable:
        print(f"-- skipping {front}: {name} is not installed", flush=True)
        return False
    return True


def table(results: list[ScenarioResult], extra: tuple[str, ...] = ()) -> str:
    head = ["fault", "front", "policy", "ok req/s", "errors", "p50 ms", "p99 ms", "p99.9 ms", *extra]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        row = r.row()
        cells = [str(row["fault"]), str(row["front"]), str(row["policy"]) or "—", f"{row['ok_rps']:.0f}",
                 str(row["errors"]), f"{row['p50_ms']:.2f}", f"{row['p99_ms']:.2f}", f"{row['p999_ms']:.2f}"]
        for key in extra:
            value = row.get(key)
            cells.append(f"{value:.2f}" if isinstance(value, float) else "—")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


async def main(args: argparse.Namespace) -> list[ScenarioResult]:
    only = args.only.split(",") if args.only else ALL
    results: list[ScenarioResult] = []
    d = args.duration

    async def run(**kw: object) -> ScenarioResult:
        kw.setdefault("duration_s", d)
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
                for f in ("direct", "fleetserve", "nginx-round-robin", "haproxy-leastconn") if installed(f)]
        direct = over[0].row()
        print("\n### overhead\n" + table(over, ("front_cpu_us_per_req",)))
        for r in over[1:]:
            row = r.row()
            print(f"{row['front']}: added p50 {row['p50_ms'] - direct['p50_ms']:+.2f} ms, "
                  f"added p99 {row['p99_ms'] - direct['p99_ms']:+.2f} ms")
        cpu = {r.config.front: r.events.get("front_cpu_us_per_req") for r in over}
        if cpu.get("nginx-round-robin") and cpu.get("fleetserve"):
            print(f"gateway CPU per request = {cpu['fleetserve'] / cpu['nginx-round-robin']:.1f}× NGINX's")

    rate = args.rate
    if rate is None and ({"throttled", "crash", "rolling", "hedging"} & set(only)):
        probe = await run_scenario(ScenarioConfig(concurrency=32, rate=None, duration_s=8))
        rate = round(0.6 * probe.report.achieved_rps)
        print(f"fleet capacity (closed loop, 32 in flight, via gateway): {probe.report.achieved_rps:.0f} req/s "
              f"-> scenario load {rate} req/s (60%)", flush=True)

    if "throttled" in only:
        healthy = await run(fault="none", rate=rate)
        throttled = [await run(fault="throttle", policy=p, rate=rate) for p in policy_names()]
        throttled.append(await run(fault="throttle", rate=rate, gateway_args=("--hedge-percentile", "99")))
        throttled += [await run(fault="throttle", front=f, rate=rate)
                      for f in ("nginx-round-robin", "nginx-least-conn", "haproxy-leastconn") if installed(f)]
        print("\n### throttled replica (80 ms of every 100 ms stopped)\n" + table([healthy, *throttled]))
        base = healthy.row()["p99_ms"]
        default = next(r for r in throttled if r.row()["policy"] == "p2c-peak-ewma")
        dp99 = float(default.row()["p99_ms"])  # type: ignore[arg-type]
        print(f"default policy p99 = {dp99 / float(base):.2f}× all-healthy p99 (goal <= 1.5)")  # type: ignore[arg-type]
        for r in throttled:
            if r.config.front == "nginx-round-robin":
                print(f"= {dp99 / float(r.row()['p99_ms']):.3f}× NGINX round-robin p99 (goal <= 0.33)")  # type: ignore[arg-type]

    if "hedging" in only:
        runs = [await run(fault="none", rate=rate)]
        for _ in range(args.repeat):
            runs += [await run(fault="throttle", rate=rate, gateway_args=("--hedge-percentile", p))
                     for p in ("95", "99", "0")]
        print("\n### hedging on the throttled replica\n" + table(runs))

    if "crash" in only:
        crash = await run(fault="crash", rate=rate)
        print("\n### crash (SIGKILL replica 0)\n" + table([crash], ("out_after_s", "back_after_s", "restarts")))
    if "rolling" in only:
        rolling = await run(fault="rolling", rate=rate)
        print("\n### rolling restart (SIGTERM each replica in turn)\n" + table([rolling], ("restarts",)))
    return results


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", help=f"comma list of {','.join(ALL + EXTRA)} (default: {','.join(ALL)})")
    ap.add_argument("--repeat", type=int, default=2, help="rounds of the hedging comparison")
    ap.add_argument("--duration", type=float, default=30.0, help="measured seconds per run")
    ap.add_argument("--rate", type=float, help="scenario load (default: 60%% of measured fleet capacity)")
    ap.add_argument("--overhead-rate", type=float, default=500.0)
    ap.add_argument("--out", type=Path, default=Path("out/gateway.json"))
    args = ap.parse_args()
    print(f"# gateway scenarios — {cpu_model()}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d %H:%M')}")
    res = asyncio.run(main(args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps([r.row() for r in res], indent=2))
