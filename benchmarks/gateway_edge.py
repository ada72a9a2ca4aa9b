"""What the gateway's edge guards cost (issue 5): throughput and added latency with JWT auth (RS256, HS256)
and per-client rate limiting on vs off, in one run on one machine.

One ``tiny`` replica; one single-worker ``fleetserve gateway`` process per guard setting, all started at
once in front of it; a closed loop of ``--concurrency`` requests (``fleetserve bench`` machinery, the
``texts`` workload) through each gateway in turn, ``--rounds`` times interleaved (every other round in
reverse order) so drift in other people's load on a shared box hits every setting alike; per setting
the median over rounds is reported, ratios being taken within a round first. The
client reuses one token, as real clients do, so the gateway's verified-token cache is what is measured;
the rate limit is set high enough never to refuse (its bookkeeping is the cost measured). Besides
end-to-end req/s (which on a small box also pays the replica and the load generator), each point reads
the gateway process's CPU time: ``gw CPU µs/req`` and the capacity it implies for one gateway core are
the gateway's own throughput, and the ratio against "guards off" is the guards' cost (goal: ≤ 15%).
Two in-process measurements complete the picture with far less noise: the guard chain's own cost per
request (each setting's middlewares around a trivial handler, best of several runs) next to the "off"
gateway's CPU per request, and the uncached cost of one signature check (RS256, HS256).

    .venv/bin/python benchmarks/gateway_edge.py [--concurrency 16] [--duration 8] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any
from unittest import mock

import jwt
from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from aiohttp.typedefs import Handler, Middleware
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from fleetserve import cli
from fleetserve.bench.loadgen import LoadConfig, run_load
from fleetserve.deploy.local import free_port
from fleetserve.gateway.edge import JwtConfig, KeySpec, build_middlewares
from fleetserve.gateway.edge.keyset import KeySet
from fleetserve.gateway.edge.tokens import TokenVerifier

from _common import http_get, machine, machine_cpu_s, markdown_table, process_cpu_s, scrape, stop_process, wait_ready

ISSUER, AUDIENCE = "https://issuer.bench", "fleetserve"
HMAC_SECRET = b"bench-secret-" * 6  # 78 bytes: long enough for every HS* variant
NO_LIMIT = "1000000:1000000"  # never refuses: measures the bookkeeping, not refusals


@contextlib.contextmanager
def fleetserve(*args: str, ready_path: str) -> Iterator[tuple[str, int]]:
    """A ``fleetserve`` process on a free port: yields (base URL, pid); stopped with SIGTERM."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "fleetserve.cli", *args, "--host", "127.0.0.1",
                             "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(lambda: http_get(url + ready_path, 2.0)[0] == 200, [proc], 60.0, url + ready_path)
        yield url, proc.pid
    finally:
        stop_process(proc, 15.0)


@dataclass(frozen=True)
class Setting:
    name: str
    args: tuple[str, ...]
    token: str | None


def settings(folder: Path) -> list[Setting]:
    """Guard settings, each with the gateway arguments and the token its clients send."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = folder / "rsa.pem"
    pem.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo))
    secret = folder / "hmac.secret"
    secret.write_bytes(HMAC_SECRET)
    hs_config = folder / "hs256.yaml"
    jwt_section = {"keys": [{"secret_file": str(secret), "algorithms": ["HS256"]}], "issuers": [ISSUER],
                   "audiences": [AUDIENCE]}
    hs_config.write_text(json.dumps({"edge": {"jwt": jwt_section}}))
    now = int(time.time())
    claims = {"iss": ISSUER, "aud": AUDIENCE, "sub": "bench", "iat": now, "exp": now + 24 * 3600}
    rs256 = jwt.encode(claims, key, algorithm="RS256")
    hs256 = jwt.encode(claims, HMAC_SECRET, algorithm="HS256")
    rs_args = ("--jwt-key", str(pem), "--jwt-algorithm", "RS256", "--jwt-issuer", ISSUER, "--jwt-audience", AUDIENCE)
    hs_args = ("--config", str(hs_config))
    return [
        Setting(OFF, (), None),
        Setting("rate limit", ("--rate-limit", NO_LIMIT), None),
        Setting("JWT RS256", rs_args, rs256),
        Setting("JWT HS256", hs_args, hs256),
        Setting("JWT RS256 + rate limit", (*rs_args, "--rate-limit", NO_LIMIT), rs256),
        Setting("JWT HS256 + rate limit", (*hs_args, "--rate-limit", NO_LIMIT), hs256),
    ]


def answered(url: str) -> float:
    """Requests the gateway has answered so far (``fleetserve_gateway_requests_total``, all labels)."""
    return scrape(url).get("fleetserve_gateway_requests_total", 0.0)


@dataclass
class Point:
    rps: float
    p50_ms: float
    p99_ms: float
    gw_cpu_us: float  # gateway CPU per request (0 for direct)
    errors: int
    others_cores: float  # CPU that processes other than ours used meanwhile (noise on a shared box)


async def measure(url: str, pid: int | None, replica_pid: int, token: str | None,
                  args: argparse.Namespace) -> Point:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    config = LoadConfig(url=url, rate=None, concurrency=args.concurrency, duration_s=args.duration,
                        warmup_s=args.warmup, headers=headers)
    served_before = answered(url) if pid else 0.0
    ours = [p for p in (pid, replica_pid, os.getpid()) if p]
    before = [process_cpu_s(p) for p in ours]
    machine_before, began = machine_cpu_s(), time.monotonic()
    report = await run_load(config)
    used = [process_cpu_s(p) - b for p, b in zip(ours, before, strict=True)]
    others = (machine_cpu_s() - machine_before - sum(used)) / (time.monotonic() - began)
    # Warmup and measured window alike: the gateway's CPU time over every request it answered meanwhile.
    served = (answered(url) - served_before) if pid else 0.0
    return Point(report.achieved_rps, report.latency_s["p50"] * 1e3, report.latency_s["p99"] * 1e3,
                 used[0] / served * 1e6 if served else 0.0, report.errors, max(0.0, others))


async def verify_cost_us(alg: str, folder: Path, n: int = 300) -> float:
    """Microseconds per uncached verification (a fresh token each time, cache of one entry)."""
    if alg == "RS256":
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        path = folder / "verify.pem"
        path.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                       serialization.PublicFormat.SubjectPublicKeyInfo))
        spec, signing_key = KeySpec("pem", str(path), ("RS256",)), key
    else:
        path = folder / "verify.secret"
        path.write_bytes(HMAC_SECRET)
        spec, signing_key = KeySpec("secret_file", str(path), ("HS256",)), HMAC_SECRET  # type: ignore[assignment]
    config = JwtConfig(keys=(spec,), issuers=(ISSUER,), audiences=(AUDIENCE,), cache_size=1)
    verifier = TokenVerifier(config, KeySet.from_config(config))
    now = int(time.time())
    tokens = [jwt.encode({"iss": ISSUER, "aud": AUDIENCE, "sub": f"u{i}", "iat": now, "exp": now + 600},
                         signing_key, algorithm=alg) for i in range(n)]

    began = time.perf_counter()
    for token in tokens:
        await verifier.verify(token)
    return (time.perf_counter() - began) / n * 1e6


def chain(middlewares: list[Middleware], handler: Handler) -> Handler:
    for middleware in reversed(middlewares):
        handler = _wrapped(middleware, handler)
    return handler


def _wrapped(middleware: Middleware, inner: Handler) -> Handler:
    async def call(request: web.Request) -> web.StreamResponse:
        return await middleware(request, inner)

    return call


async def guard_cost_us(args: tuple[str, ...], token: str | None, folder: Path, n: int = 20_000,
                        repeats: int = 5) -> float:
    """Microseconds per request spent in one setting's guard chain (cached token), best of ``repeats``."""
    edge = cli.parse("gateway", ["--backend", "http://127.0.0.1:1", *args], {})[1].config().edge
    done = web.Response(text="ok")

    async def handler(request: web.Request) -> web.StreamResponse:
        return done

    run = chain(build_middlewares(edge), handler)
    transport = mock.Mock()
    transport.get_extra_info.side_effect = lambda name, default=None: ("127.0.0.1", 40000) if name == "peername" \
        else default
    headers = {"Host": "gw", "Content-Type": "application/json", "User-Agent": "fleetserve-bench"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    requests = [make_mocked_request("POST", "/inference", headers=headers, transport=transport) for _ in range(n)]
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        for request in requests:
            await run(request)
        best = min(best, (time.perf_counter() - began) / n * 1e6)
    return best


DIRECT = "direct (no gateway)"
OFF = "guards off (input limits only)"


def summarize(rounds: dict[str, list[Point]]) -> dict[str, dict[str, float]]:
    """Per setting, medians over rounds; ratios to "guards off" are taken within each round first, so
    load that other processes put on the box during one round cancels out."""
    off, direct = rounds[OFF], rounds[DIRECT]
    rows = {}
    for name, points in rounds.items():
        row = {
            "rps": median([p.rps for p in points]),
            "p50_ms": median([p.p50_ms for p in points]),
            "p99_ms": median([p.p99_ms for p in points]),
            "errors": float(sum(p.errors for p in points)),
        }
        if name != DIRECT:
            row["added_p50_ms"] = median([p.p50_ms - d.p50_ms for p, d in zip(points, direct, strict=True)])
            row["added_p99_ms"] = median([p.p99_ms - d.p99_ms for p, d in zip(points, direct, strict=True)])
            row["gw_cpu_us"] = median([p.gw_cpu_us for p in points])
            row["capacity_per_core"] = 1e6 / row["gw_cpu_us"]
            row["rps_vs_off"] = median([p.rps / o.rps for p, o in zip(points, off, strict=True)])
            row["capacity_vs_off"] = median([o.gw_cpu_us / p.gw_cpu_us for p, o in zip(points, off, strict=True)])
        rows[name] = row
    return rows


def table(rows: dict[str, dict[str, float]]) -> str:
    head = ["setting", "ok req/s", "vs off", "p50 ms", "p99 ms", "added p50 ms", "added p99 ms", "gw CPU µs/req",
            "gw req/s per core", "vs off", "errors"]
    cells_by_row = []
    for name, r in rows.items():
        if name == DIRECT:
            cells = [name, f"{r['rps']:.0f}", "—", f"{r['p50_ms']:.2f}", f"{r['p99_ms']:.2f}", "—", "—", "—", "—",
                     "—", f"{r['errors']:.0f}"]
        else:
            cells = [name, f"{r['rps']:.0f}", f"{r['rps_vs_off']:.1%}", f"{r['p50_ms']:.2f}", f"{r['p99_ms']:.2f}",
                     f"{r['added_p50_ms']:+.2f}", f"{r['added_p99_ms']:+.2f}", f"{r['gw_cpu_us']:.0f}",
                     f"{r['capacity_per_core']:.0f}", f"{r['capacity_vs_off']:.1%}", f"{r['errors']:.0f}"]
        cells_by_row.append(cells)
    return markdown_table(head, cells_by_row)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        folder = Path(tmp)
        replica_url, replica_pid = stack.enter_context(fleetserve(
            "serve", "tiny", "--grpc-port", "0", "--instances", "1", "--threads", "1", ready_path="/v2/health/ready"))
        targets: dict[str, tuple[str, int | None, str | None]] = {DIRECT: (replica_url, None, None)}
        for setting in settings(folder):
            gateway_url, gateway_pid = stack.enter_context(fleetserve(
                "gateway", "--backend", replica_url, *setting.args, ready_path="/healthz"))
            targets[setting.name] = (gateway_url, gateway_pid, setting.token)
        rounds: dict[str, list[Point]] = {name: [] for name in targets}
        for r in range(args.rounds):
            # Every other round runs backwards, so a drift during a round (the box heating up, someone
            # else's job starting) does not always hit the settings measured last.
            order = list(targets.items()) if r % 2 == 0 else list(reversed(targets.items()))
            for name, (url, pid, token) in order:
                point = await measure(url, pid, replica_pid, token, args)
                rounds[name].append(point)
                print(f"round {r + 1} {name:<32} {point.rps:7.0f} req/s  p50 {point.p50_ms:6.2f} ms  "
                      f"p99 {point.p99_ms:6.2f} ms  gw {point.gw_cpu_us:5.0f} µs/req  errors {point.errors}  "
                      f"others {point.others_cores:.2f} cores", flush=True)
        verify = {alg: await verify_cost_us(alg, folder) for alg in ("RS256", "HS256")}
        guard_us = {s.name: await guard_cost_us(s.args, s.token, folder) for s in settings(folder)}
    rows = summarize(rounds)
    others = median([p.others_cores for ps in rounds.values() for p in ps])
    print(f"\nmedian of {args.rounds} interleaved rounds; closed loop, {args.concurrency} in flight, "
          f"{args.duration:g} s per point; other processes used a median {others:.2f} cores meanwhile\n")
    print(table(rows))
    off_cpu = rows[OFF]["gw_cpu_us"]
    print(f"\nguard chain in-process (best of 5 x 20k requests; token cached), against the {off_cpu:.0f} µs of CPU "
          "a request costs the gateway with guards off:\n")
    print("| setting | guard chain µs/req | added µs/req | added / gateway CPU per request |\n|---|---|---|---|")
    for name, us in guard_us.items():
        added = us - guard_us[OFF]
        print(f"| {name} | {us:.1f} | {added:+.1f} | {added / off_cpu:+.1%} |")
    print("\nuncached verification (in-process): " + ", ".join(f"{a} {us:.0f} µs" for a, us in verify.items()))
    return {"summary": rows, "rounds": {name: [vars(p) for p in ps] for name, ps in rounds.items()},
            "guard_chain_us": guard_us, "verify_uncached_us": verify,
            "args": {k: str(v) for k, v in vars(args).items()}}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, default=16, help="requests in flight (closed loop)")
    ap.add_argument("--duration", type=float, default=6.0, help="measured seconds per point")
    ap.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before each point")
    ap.add_argument("--rounds", type=int, default=6, help="interleaved rounds; medians are reported")
    ap.add_argument("--out", type=Path, default=Path("out/gateway_edge.json"))
    cli = ap.parse_args()
    print(f"# gateway edge guards — {machine()}, {time.strftime('%Y-%m-%d %H:%M')}, "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    result = asyncio.run(main(cli))
    cli.out.parent.mkdir(parents=True, exist_ok=True)
    cli.out.write_text(json.dumps(result, indent=2, default=str))
