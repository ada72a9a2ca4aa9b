"""Where a request's time goes in a real replica (and gateway) at low load, next to what the simulator models.

One real ``minilm`` int8 replica (``fleetserve serve --threads 1``, as ``fleetserve up`` runs it on this
machine), then the same replica behind ``fleetserve gateway``; each under the ``texts`` workload with short
texts only (``--long-fraction 0``: 5-30 words, so every batch is one sequence bucket) at one request in flight
(closed loop) and open loop at ``--rate``. For each run it reads, from the product's own Prometheus metrics
(scraped before and after), the mean of each stage:

- the load generator's latency (what the client sees, from the schedule in open loop) and its schedule lag;
- the gateway's request time (head read to response written) and its upstream attempt time;
- the replica's request time (``stage=total``: the HTTP handler, body read to answer written), the batcher's
  queue wait (``stage=queue``, max-delay included) and the engine call (``stage=compute``);

and the differences between nested stages: client ↔ gateway (the client's own send/receive, the kernel, the
gateway's HTTP parsing before its timer starts), gateway ↔ upstream (the gateway's routing and proxy work),
upstream ↔ replica handler (the replica's HTTP parsing and the loopback), handler − queue − compute
(JSON, tokenisation on its thread, thread hand-offs, splitting, encoding). Per-thread CPU of the replica
(``/proc``) says which of those are CPU and which are waiting.

The simulator runs the same case (one replica, same length mix, the measured profile) and prints its
latency, so the missing part shows as one line.

``--by-length`` asks which texts the model gets wrong: the gateway and ``--replicas`` replicas under the full mix
at ``--rate``, sent by two load generators at once (the short texts at ``1 - --long-fraction`` of the rate, the
long ones at the rest: together the same Poisson stream), so each class has its own latencies; the simulator
runs the same fleet and mix and reports the same classes (``SimConfig.split_tokens``), seeds ``--seeds``, and
beside them the engine call per request, measured (the replicas' ``stage=compute``) and simulated.

    PYTHONPATH=. .venv/bin/python benchmarks/sim_breakdown.py --profile benchmarks/profiles/minilm-int8-cpu.json
    PYTHONPATH=. .venv/bin/python benchmarks/sim_breakdown.py --profile P.json --by-length --replicas 2 --rate 60
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from fleetserve.bench.cpu import thread_cpu_seconds, tree_cpu_seconds
from fleetserve.bench.loadgen import LoadConfig, run_load
from fleetserve.bench.report import LoadReport
from fleetserve.deploy.local import free_port
from fleetserve.fleet.supervisor import http_ok
from fleetserve.sim.config import SimConfig
from fleetserve.sim.costs import UNMODELLED_GATEWAY_ARGS
from fleetserve.sim.gateway import DEFAULT_POLICY, policy_names
from fleetserve.sim.profile import LengthMix, Profile
from fleetserve.sim.simulator import simulate

from _common import histogram_means, histogram_sums, metrics_text
from _sim_twin import local_fleet

CLI = [sys.executable, "-m", "fleetserve.cli"]
SHORT_MAX_TOKENS = 40  # the texts workload's short texts tokenize to 7-34 tokens
LONG = [0.0]


@asynccontextmanager
async def process(argv: list[str], ready_url: str) -> AsyncIterator[int]:
    proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.DEVNULL,
                                                stderr=asyncio.subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while not await asyncio.to_thread(http_ok, ready_url):
            if proc.returncode is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{argv[3:5]} did not become ready")
            await asyncio.sleep(0.1)
        yield proc.pid
    finally:
        proc.terminate()
        await proc.wait()


@dataclass
class Run:
    name: str
    report: LoadReport
    stages: dict[str, float]
    replica_cpu: dict[str, float]  # per request, by thread kind
    gateway_cpu: float


def thread_names(pid: int) -> dict[int, str]:
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            out[int(tid)] = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
        except OSError:
            continue
    return out


async def one_run(name: str, url: str, replica_urls: list[str], rpids: list[int], gpid: int | None,
                  rate: float | None, duration: float) -> Run:
    load = LoadConfig(url=url, rate=rate, concurrency=None if rate else 1, duration_s=duration, warmup_s=1.0,
                      workload="texts", long_fraction=LONG[0])
    await run_load(LoadConfig(url=url, concurrency=1, duration_s=1.0, workload="texts", long_fraction=LONG[0]))
    urls = replica_urls + ([url] if gpid else [])
    before = histogram_sums([metrics_text(u) for u in urls])
    t0 = {pid: thread_cpu_seconds(pid) for pid in rpids}
    g0 = tree_cpu_seconds(gpid) if gpid else 0.0
    report = await run_load(load)
    t1 = {pid: thread_cpu_seconds(pid) for pid in rpids}
    g1 = tree_cpu_seconds(gpid) if gpid else 0.0
    after = histogram_sums([metrics_text(u) for u in urls])
    sent = max(1, report.sent)
    cpu: dict[str, float] = {}
    for pid in rpids:
        names = thread_names(pid)
        for tid, c in t1[pid].items():
            kind = "event loop" if tid == pid else names.get(tid, "?").rstrip("_0123456789")
            cpu[kind] = cpu.get(kind, 0.0) + (c - t0[pid].get(tid, 0.0)) / sent
    return Run(name, report, histogram_means(before, after), cpu, (g1 - g0) / sent)


def predict(profile: Profile, rate: float, gateway: bool, replicas: int = 1) -> tuple[float, float, float]:
    """The simulator's (mean, p50, p99) seconds for the case: one replica, short texts, Poisson at ``rate``."""
    mix = profile.lengths
    keep = [(v, w) for v, w in zip(mix.values, mix.weights, strict=True) if (v > SHORT_MAX_TOKENS) == (LONG[0] == 1)]
    lengths = LengthMix(tuple(v for v, _ in keep), tuple(w for _, w in keep)) if LONG[0] in (0, 1) else mix
    config = replace(local_fleet(profile, replicas, rate, 3000, warmup_s=1.0), lengths=lengths,
                     gateway_cpu_s=None if gateway else 0.0, gateway_wait_s=None if gateway else 0.0)
    result = simulate(config)
    print(f"(simulated mean batch {result.mean_batch:.2f})")
    return result.latency_s["mean"], result.p("p50"), result.p("p99")


def by_length_config(profile: Profile, replicas: int, rate: float, duration_s: float, background: float,
                     seed: int, policy: str | None = None) -> SimConfig:
    """The simulated fleet of a ``--by-length`` run: the profile's full mix, its classes reported apart; with
    ``policy``, the gateway's balancing policy instead of the default."""
    config = local_fleet(profile, replicas, rate, max(1000, round(rate * (1.0 + duration_s))), warmup_s=1.0)
    if policy is not None:
        config = replace(config, balancer=replace(config.balancer, policy=policy))
    return replace(config, background_cores=background, split_tokens=SHORT_MAX_TOKENS, seed=seed)


def _ms(stats: dict[str, float]) -> str:
    return " / ".join(f"{stats[q] * 1e3:.1f}" for q in ("p50", "p90", "p99"))


async def by_length(args: argparse.Namespace, profile: Profile) -> None:
    """Short and long texts' latencies, real and simulated, through the gateway to ``args.replicas`` replicas."""
    async with contextlib.AsyncExitStack() as stack:
        urls, _ = await start_replicas(stack, args.replicas)
        gateway_url, _ = await start_gateway(stack, urls, () if args.policy is None else ("--policy", args.policy))
        await run_load(LoadConfig(url=gateway_url, concurrency=2, duration_s=1.0, workload="texts"))
        before = histogram_sums([metrics_text(u) for u in urls])
        cpu0 = time.process_time()
        reports = await asyncio.gather(*(
            run_load(LoadConfig(url=gateway_url, rate=args.rate * share, duration_s=args.duration, warmup_s=1.0,
                                workload="texts", long_fraction=long, seed=args.seed + long))
            for share, long in ((1 - args.long_fraction, 0.0), (args.long_fraction, 1.0))))
        generator_s = time.process_time() - cpu0
        after = histogram_sums([metrics_text(u) for u in urls])
    sent = sum(r.sent for r in reports)
    lag = sum(r.schedule_lag_mean_s * r.sent for r in reports) / max(1, sent)
    compute = histogram_means(before, after).get("fleetserve_request_duration_seconds{stage=compute}", float("nan"))
    print(f"## gateway ({args.policy or DEFAULT_POLICY}) + {args.replicas} replicas, {args.rate:g} req/s Poisson, "
          f"{args.long_fraction:.0%} long: "
          f"{sum(r.achieved_rps for r in reports):.1f} req/s, {sum(r.errors for r in reports)} errors, generator "
          f"lag {lag * 1e3:.2f} ms (added to the simulated latencies), engine call {compute * 1e3:.2f} ms per request")
    print("| | short p50 / p90 / p99 ms | long p50 / p90 / p99 ms | engine call ms per request |\n|---|---|---|---|")
    short, long = ({q: r.percentile(v) for q, v in (("p50", 50), ("p90", 90), ("p99", 99))} for r in reports)
    print(f"| measured | {_ms(short)} | {_ms(long)} | {compute * 1e3:.2f} |")
    background = args.rate * generator_s / max(1, sent)
    for seed in range(args.seeds):
        result = simulate(by_length_config(profile, args.replicas, args.rate, args.duration, background, seed,
                                           args.policy))
        classes = {k: {q: v + lag for q, v in stats.items()} for k, stats in result.latency_by_length.items()}
        print(f"| simulated, seed {seed} | {_ms(classes['short'])} | {_ms(classes['long'])} | "
              f"{result.engine_s_per_request * 1e3:.2f} |")


def show(run: Run) -> None:
    r = run.report
    ms = 1e3
    s = run.stages
    client = r.latency_s["mean"]
    print(f"\n## {run.name}: {r.achieved_rps:.1f} req/s, client p50 {r.percentile(50) * ms:.2f} ms, "
          f"p99 {r.percentile(99) * ms:.2f} ms, from send: mean {r.service_latency_s['mean'] * ms:.2f} ms; "
          f"schedule lag mean {r.schedule_lag_mean_s * ms:.2f} ms")
    gw = s.get("fleetserve_gateway_request_duration_seconds{}")
    up = s.get("fleetserve_gateway_upstream_duration_seconds{}")
    total = s.get("fleetserve_request_duration_seconds{stage=total}", 0.0)
    queue = s.get("fleetserve_request_duration_seconds{stage=queue}", 0.0)
    compute = s.get("fleetserve_request_duration_seconds{stage=compute}", 0.0)
    print("| part | mean ms |\n|---|---|")
    print(f"| client latency (load generator) | {client * ms:.2f} |")
    outer = client
    if gw is not None and up is not None:
        print(f"| client - gateway request time (client, kernel, gateway HTTP parse) | {(client - gw) * ms:.2f} |")
        print(f"| gateway request - upstream attempt (gateway routing, proxying) | {(gw - up) * ms:.2f} |")
        outer = up
        print(f"| upstream attempt - replica handler (replica HTTP, loopback) | {(up - total) * ms:.2f} |")
    else:
        print(f"| client - replica handler (client, kernel, replica HTTP parse) | {(outer - total) * ms:.2f} |")
    print(f"| replica handler - queue - compute (JSON, tokenise, thread hops, encode) | "
          f"{(total - queue - compute) * ms:.2f} |")
    print(f"| batcher queue wait (max-delay included) | {queue * ms:.2f} |")
    print(f"| engine call | {compute * ms:.2f} |")
    print(f"mean batch {s.get('fleetserve_batch_size{}', 0.0):.2f} rows")
    cpu = ", ".join(f"{k} {v * 1e6:.0f}" for k, v in sorted(run.replica_cpu.items(), key=lambda kv: -kv[1]) if v)
    print(f"replica CPU us/request: {cpu}" + (f"; gateway CPU {run.gateway_cpu * 1e6:.0f} us/request"
                                            if run.gateway_cpu else ""))


def serve(port: int) -> list[str]:
    return [*CLI, "serve", "minilm", "--precision", "int8", "--threads", "1", "--host", "127.0.0.1",
            "--port", str(port), "--grpc-port", "0"]


async def start_replicas(stack: contextlib.AsyncExitStack, n: int) -> tuple[list[str], list[int]]:
    """``n`` real replicas, stopped with ``stack``: their URLs and process ids."""
    urls, pids = [], []
    for _ in range(n):
        port = free_port()
        urls.append(f"http://127.0.0.1:{port}")
        pids.append(await stack.enter_async_context(process(serve(port), f"{urls[-1]}/v2/health/ready")))
    return urls, pids


async def start_gateway(stack: contextlib.AsyncExitStack, backends: list[str],
                        extra: tuple[str, ...] = ()) -> tuple[str, int]:
    """A real gateway in front of ``backends`` (with ``extra`` options), stopped with ``stack``: its URL and
    process id."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [*CLI, "gateway", *(a for u in backends for a in ("--backend", u)), "--host", "127.0.0.1",
            "--port", str(port), "--health-interval", "1", *UNMODELLED_GATEWAY_ARGS, *extra]
    return url, await stack.enter_async_context(process(argv, f"{url}/readyz"))


async def main_async(args: argparse.Namespace) -> list[Run]:
    runs: list[Run] = []
    async with contextlib.AsyncExitStack() as stack:
        urls, rpids = await start_replicas(stack, args.replicas)
        if args.replicas == 1:
            for rate in (None, args.rate):
                name = f"replica alone, {'1 in flight' if rate is None else f'{rate:g} req/s Poisson'}"
                runs.append(await one_run(name, urls[0], urls, rpids, None, rate, args.duration))
                show(runs[-1])
        if args.skip_gateway:
            return runs
        gateway_url, gpid = await start_gateway(stack, urls)
        for rate in (None, args.rate):
            name = (f"gateway + {args.replicas} replica(s), "
                    f"{'1 in flight' if rate is None else f'{rate:g} req/s Poisson'}")
            runs.append(await one_run(name, gateway_url, urls, rpids, gpid, rate, args.duration))
            show(runs[-1])
    return runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", type=Path, required=True)
    ap.add_argument("--rate", type=float, default=25.0, help="open-loop rate (30%% of one replica is ~25)")
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--long-fraction", type=float, default=0.0)
    ap.add_argument("--skip-gateway", action="store_true")
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--by-length", action="store_true",
                    help="short and long texts' latencies apart, through the gateway (the full mix; see above)")
    ap.add_argument("--seeds", type=int, default=3, help="--by-length: simulated runs")
    ap.add_argument("--seed", type=int, default=11, help="--by-length: the load generators' seed")
    ap.add_argument("--policy", choices=policy_names(), help="--by-length: the balancing policy of the real "
                    "gateway and the simulated one alike (default: the gateway's default)")
    args = ap.parse_args()
    if args.by_length and not 0 < args.long_fraction < 1:
        ap.error("--by-length needs 0 < --long-fraction < 1")
    LONG[0] = args.long_fraction
    profile = Profile.load(args.profile)
    mix = profile.lengths
    for name, keep in (("short", lambda v: v <= SHORT_MAX_TOKENS), ("long", lambda v: v > SHORT_MAX_TOKENS)):
        pairs = [(v, w) for v, w in zip(mix.values, mix.weights, strict=True) if keep(v)]
        mean = sum(w * profile.timing(1, v)[0] for v, w in pairs) / sum(w for _, w in pairs)
        print(f"profile: mean engine call at batch 1 over the {name} texts: {mean * 1e3:.2f} ms")
    print(f"# request breakdown, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d %H:%M %Z')}, "
          f"load average {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")
    if args.by_length:
        asyncio.run(by_length(args, profile))
        return
    asyncio.run(main_async(args))
    for gateway in (False, True):
        mean, p50, p99 = predict(profile, args.rate, gateway, args.replicas)
        print(f"simulator, {'gateway + ' if gateway else ''}replica, {args.rate:g} req/s, long fraction {LONG[0]:g}: "
              f"mean {mean * 1e3:.2f} ms, p50 {p50 * 1e3:.2f} ms, p99 {p99 * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
