"""Overload (issue 12, item 6): one replica of known capacity behind the gateway, offered 3x its capacity.

The replica is ``tiny`` with ``--batch-latency-ms`` (each engine call holds its one instance that long, like
a slower accelerator), ``--max-batch`` rows per call and ``--padding longest`` (one queue), so its capacity is
about ``max_batch / batch_latency``. The script measures capacity closed loop, straight at the replica and
through the gateway (limiter off), and scales every phase from the latter: on a small shared box the gateway
and this client take CPU from the replica, so that is what the whole path can do. For each gateway setting
(adaptive concurrency off, on), a fresh replica and gateway get one open-loop Poisson schedule, phases back to
back:

1. ``unloaded``  0.2x capacity  — the unloaded p99;
2. ``p60``       0.6x capacity  — the all-healthy p99 at 60% load (the limiter must not hurt it);
3. ``burst``     3x capacity    — admitted p50/p99 (and the p99 from its second second on), share answered 503
                                  (with Retry-After?) and how fast, other failures (disconnects, timeouts),
                                  goodput against capacity;
4. ``after``     0.5x capacity  — time to full recovery: from the end of the burst to the start of the first
                                  500 ms bin after which every bin has only 200s and a p99 within 1.5x the
                                  ``p60`` phase's.

Latency is measured from each request's scheduled send time (no coordinated omission); a 503's latency also
"on the wire", from the write of the request to its answer (without this client's send lag and connection
set-up), and the send lag (schedule to write) is reported beside it. The client here is a lean keep-alive
HTTP/1.1 client on httptools, like ``fleetserve bench``'s, that also notes ``Retry-After``; it holds at most
``--max-connections`` connections and counts a request due when all are busy as ``no_socket``. Gateway RSS,
its CPU time and its concurrency limit are sampled every 250 ms (/proc, /metrics).

    .venv/bin/python benchmarks/overload.py [--settings off,on] [--burst-s 20] [--batch-latency-ms 20]
                                            [--max-batch 8] [--scale 1.0] [--gateway-core N]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import httptools
import numpy as np

from fleetserve.bench.arrivals import arrival_offsets
from fleetserve.bench.loadgen import LoadConfig, run_load
from fleetserve.bench.workloads import WorkloadConfig, make_payloads
from fleetserve.eventloop import loop_factory

SETTINGS = {"off": ("--no-adaptive-concurrency",), "on": ("--adaptive-concurrency",)}


def gateway_flags(setting: str) -> tuple[str, ...]:
    """``off``, ``on``, or ``on:FLAG=VALUE:...`` (the limiter with other settings, e.g. a larger RTT buffer),
    each optionally followed by ``@DIR``: run that setting's gateway from the source tree DIR (another commit,
    e.g. ``git archive OLD | tar -x -C DIR``), to compare code side by side in one run."""
    name, *extra = setting.split("@")[0].split(":")
    if name not in SETTINGS or (extra and name != "on"):
        raise SystemExit(f"unknown setting {setting!r}: off, on or on:--flag=value[:...], then @DIR optionally")
    return (*SETTINGS[name], *extra)


def source_tree(setting: str) -> str | None:
    """The DIR of ``SETTING@DIR``, or None: the gateway runs from this checkout."""
    _, _, tree = setting.partition("@")
    if tree and not Path(tree, "fleetserve", "cli.py").is_file():
        raise SystemExit(f"setting {setting!r}: {tree} holds no fleetserve/cli.py")
    return tree or None


TIMEOUT_S = 30.0


# ---------------------------------------------------------------------------------------------- processes
def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spawn(*args: str, tree: str | None = None, core: int | None = None) -> subprocess.Popen[bytes]:
    """``fleetserve ARGS`` (from source tree ``tree``), on core ``core`` alone if given."""
    env = None if tree is None else {**os.environ, "PYTHONPATH": tree}
    pin = [] if core is None else ["taskset", "-c", str(core)]
    return subprocess.Popen([*pin, sys.executable, "-m", "fleetserve.cli", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, cwd=tree, env=env)


def wait_ok(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} not ready after {timeout_s} s")


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def gauge(port: int, name: str) -> float:
    """One unlabelled sample from the gateway's /metrics (nan if absent)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
    except OSError:
        pass
    return float("nan")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds the process has used (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


# ------------------------------------------------------------------------------------------------- client
@dataclass
class Outcome:
    scheduled: float  # seconds from the schedule's start
    sent: float = 0.0  # when the request was written (after a connection was found or opened)
    done: float = 0.0
    status: int = 0  # 0: no HTTP answer (see error)
    error: str = ""
    retry_after: bool = False

    @property
    def latency(self) -> float:
        return self.done - self.scheduled

    @property
    def on_the_wire(self) -> float:
        """From the write to the answer: without this client's own scheduling lag and connection set-up."""
        return self.done - self.sent


class _Conn(asyncio.Protocol):
    """One keep-alive connection, one request at a time; reports the status and whether Retry-After came."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[tuple[int, bool]] | None = None
        self._retry_after = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"retry-after":
            self._retry_after = True

    def on_message_complete(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result((self._parser.get_status_code(), self._retry_after))
        if not self._parser.should_keep_alive():
            self.close()

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(f"protocol: {exc}")
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail("disconnected")

    def _fail(self, why: str) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(ConnectionError(why))

    def request(self, raw: bytes) -> asyncio.Future[tuple[int, bool]]:
        assert self.transport is not None
        self._retry_after = False
        self._waiter = asyncio.get_running_loop().create_future()
        self.transport.write(raw)
        return self._waiter

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.close()


class Driver:
    """Sends prepared requests on pooled connections, at most ``max_connections`` open."""

    def __init__(self, host: str, port: int, max_connections: int) -> None:
        self._host, self._port = host, port
        self._max = max_connections
        self._idle: list[_Conn] = []
        self._open = 0

    async def send(self, raw: bytes, outcome: Outcome, t0: float) -> None:
        conn = None
        while self._idle:
            candidate = self._idle.pop()
            if not candidate.closed:
                conn = candidate
                break
            self._open -= 1
        try:
            if conn is None:
                if self._open >= self._max:
                    outcome.error = "no_socket"
                    return
                self._open += 1
                try:
                    _, conn = await asyncio.get_running_loop().create_connection(_Conn, self._host, self._port)
                except OSError as exc:
                    self._open -= 1
                    outcome.error = f"connect: {exc.strerror}"
                    return
            try:
                outcome.sent = time.monotonic() - t0
                async with asyncio.timeout(TIMEOUT_S):
                    outcome.status, outcome.retry_after = await conn.request(raw)
            except TimeoutError:
                outcome.error = "timeout"
                conn.close()
            except ConnectionError as exc:
                outcome.error = str(exc)
            if conn.closed:
                self._open -= 1
            else:
                self._idle.append(conn)
        finally:
            outcome.done = time.monotonic() - t0

    def close(self) -> None:
        for conn in self._idle:
            conn.close()


def requests(url_path: str, authority: str, count: int) -> list[bytes]:
    payloads = make_payloads(WorkloadConfig("texts", "tiny", 0.0, count), random.Random(7))
    return [
        (f"POST {url_path}{p.path} HTTP/1.1\r\nHost: {authority}\r\nContent-Type: {p.content_type}\r\n"
         f"Content-Length: {len(p.body)}\r\n\r\n").encode() + p.body
        for p in payloads
    ]


@dataclass(frozen=True)
class Phase:
    name: str
    share: float  # of capacity
    seconds: float


def schedule(phases: list[Phase], capacity: float, rng: random.Random) -> Iterator[tuple[float, str]]:
    start = 0.0
    for phase in phases:
        for offset in arrival_offsets("poisson", phase.share * capacity, rng):
            if offset >= phase.seconds:
                break
            yield start + offset, phase.name
        start += phase.seconds


async def drive(port: int, phases: list[Phase], capacity: float, gateway_pid: int,
                max_connections: int) -> tuple[list[tuple[str, Outcome]], list[tuple[float, float, float, float]],
                                               float]:
    driver = Driver("127.0.0.1", port, max_connections)
    raws = requests("", f"127.0.0.1:{port}", 256)
    outcomes: list[tuple[str, Outcome]] = []
    rss: list[tuple[float, float, float, float]] = []  # (time, gateway RSS MiB, limit or nan, gateway CPU s)
    tasks: set[asyncio.Task[None]] = set()
    lag_max = 0.0
    t0 = time.monotonic()

    async def sample_rss() -> None:
        while True:
            now = time.monotonic() - t0
            limit = await asyncio.to_thread(gauge, port, "fleetserve_gateway_concurrency_limit")
            rss.append((now, rss_mib(gateway_pid), limit, cpu_s(gateway_pid)))
            await asyncio.sleep(0.25)

    sampler = asyncio.create_task(sample_rss())
    for i, (due, phase) in enumerate(schedule(phases, capacity, random.Random(11))):
        wait = due - (time.monotonic() - t0)
        if wait > 0.001:
            await asyncio.sleep(wait)
        elif i % 32 == 0:
            await asyncio.sleep(0)
        lag_max = max(lag_max, time.monotonic() - t0 - due)
        outcome = Outcome(due)
        outcomes.append((phase, outcome))
        task = asyncio.create_task(driver.send(raws[i % len(raws)], outcome, t0))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.wait(tasks, timeout=TIMEOUT_S + 5)
    sampler.cancel()
    driver.close()
    return outcomes, rss, lag_max


# ------------------------------------------------------------------------------------------------ analysis
def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


@dataclass
class Result:
    setting: str
    capacity: float
    rows: dict[str, float] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)
    limits: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # phase -> limit min, median, max


def analyse(setting: str, capacity: float, phases: list[Phase], outcomes: list[tuple[str, Outcome]],
            rss: list[tuple[float, float, float, float]], lag_max: float) -> Result:
    by: dict[str, list[Outcome]] = {p.name: [o for name, o in outcomes if name == p.name] for p in phases}
    ok = {name: [o.latency for o in got if o.status == 200] for name, got in by.items()}
    burst = by["burst"]
    burst_start = sum(p.seconds for p in phases[:2])
    burst_end = burst_start + phases[2].seconds
    refused = [o for o in burst if o.status == 503]
    other = [o for o in burst if o.status not in (200, 503)]
    failures: dict[str, int] = {}
    for o in other:
        key = o.error or f"http_{o.status}"
        failures[key] = failures.get(key, 0) + 1
    good = sum(1 for o in burst if o.status == 200 and o.done <= burst_end)
    p60_p99 = pct(ok["p60"], 99)
    rows = {
        "unloaded_p99_ms": pct(ok["unloaded"], 99) * 1e3,
        "unloaded_failed": float(sum(1 for o in by["unloaded"] if o.status != 200)),
        "p60_p50_ms": pct(ok["p60"], 50) * 1e3,
        "p60_p99_ms": p60_p99 * 1e3,
        "p60_failed": float(sum(1 for o in by["p60"] if o.status != 200)),
        "burst_offered_rps": len(burst) / phases[2].seconds,
        "burst_admitted_p50_ms": pct(ok["burst"], 50) * 1e3,
        "burst_admitted_p99_ms": pct(ok["burst"], 99) * 1e3,
        # Without the burst's first second, when the limit comes down from where the calm left it.
        "burst_admitted_p99_after_1s_ms": pct([o.latency for o in burst if o.status == 200
                                               and o.scheduled >= burst_start + 1.0], 99) * 1e3,
        "burst_503_share": len(refused) / max(1, len(burst)),
        "burst_503_p50_ms": pct([o.latency for o in refused], 50) * 1e3,
        "burst_503_p99_ms": pct([o.latency for o in refused], 99) * 1e3,
        "burst_503_wire_p50_ms": pct([o.on_the_wire for o in refused], 50) * 1e3,
        "burst_503_wire_p99_ms": pct([o.on_the_wire for o in refused], 99) * 1e3,
        "burst_send_lag_p99_ms": pct([o.sent - o.scheduled for o in burst if o.sent], 99) * 1e3,
        "burst_503_without_retry_after": float(sum(1 for o in refused if not o.retry_after)),
        "burst_other_failures": float(len(other)),
        "goodput_rps": good / phases[2].seconds,
        "goodput_share": good / phases[2].seconds / capacity,
        "recovery_s": recovery(by["after"], burst_end, phases[3].seconds, p60_p99),
        "after_failed": float(sum(1 for o in by["after"] if o.status != 200)),
        # When the last of them was due, from the burst's end: beside recovery_s, it tells whether a late
        # failure or a slow bin put off the recovery.
        "after_last_failure_s": max((o.scheduled - burst_end for o in by["after"] if o.status != 200),
                                    default=float("nan")),
        "burst_gateway_cpu_cores": burst_cpu(rss, burst_start, burst_end),
        "rss_before_mib": max((m for t, m, _, _ in rss if t < burst_start), default=float("nan")),
        "rss_peak_mib": max((m for _, m, _, _ in rss), default=float("nan")),
        "rss_end_mib": rss[-1][1] if rss else float("nan"),
        "client_lag_max_ms": lag_max * 1e3,
    }
    limits: dict[str, tuple[int, int, int]] = {}
    start = 0.0
    for phase in phases:
        seen = [lim for t, _, lim, _ in rss if start <= t < start + phase.seconds and not np.isnan(lim)]
        if seen:
            limits[phase.name] = (int(min(seen)), int(np.median(seen)), int(max(seen)))
        start += phase.seconds
    return Result(setting, capacity, rows, failures, limits)


def burst_cpu(samples: list[tuple[float, float, float, float]], start: float, end: float) -> float:
    """The gateway's CPU use (cores) between the samples nearest the burst's start and end."""
    inside = [(t, cpu) for t, _, _, cpu in samples if start <= t <= end]
    if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
        return float("nan")
    return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])


def recovery(after: list[Outcome], start: float, seconds: float, p60_p99: float, bin_s: float = 0.5) -> float:
    """Seconds from the burst's end to the first bin after which every bin is all-200 with p99 <= 1.5x p60's."""
    bins = int(seconds / bin_s)
    healthy = []
    for b in range(bins):
        got = [o for o in after if start + b * bin_s <= o.scheduled < start + (b + 1) * bin_s]
        healthy.append(bool(got) and all(o.status == 200 for o in got)
                       and pct([o.latency for o in got], 99) <= 1.5 * p60_p99)
    for b in range(bins):
        if all(healthy[b:]):
            return b * bin_s
    return float("inf")


# -------------------------------------------------------------------------------------------------- runs
def start_replica(args: argparse.Namespace) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = spawn("serve", "tiny", "--host", "127.0.0.1", "--port", str(port), "--grpc-port", "0",
                 "--batch-latency-ms", str(args.batch_latency_ms), "--max-batch", str(args.max_batch),
                 "--padding", "longest", "--instances", "1", "--drain-grace-s", "0")
    url = f"http://127.0.0.1:{port}"
    wait_ok(f"{url}/v2/health/ready", proc)
    return proc, url


async def measure_capacity(url: str, max_batch: int) -> float:
    report = await run_load(LoadConfig(url=url, concurrency=4 * max_batch, duration_s=5, warmup_s=1,
                                       workload="texts", model="tiny", long_fraction=0.0))
    return report.achieved_rps


@contextlib.contextmanager
def fleet(args: argparse.Namespace, setting: str) -> Iterator[tuple[str, int, int]]:
    """A fresh replica behind a fresh gateway: (replica URL, gateway port, gateway PID)."""
    replica, replica_url = start_replica(args)
    port = free_port()
    gateway = spawn("gateway", "--host", "127.0.0.1", "--port", str(port), "--backend", replica_url,
                    *gateway_flags(setting), tree=source_tree(setting), core=args.gateway_core)
    try:
        wait_ok(f"http://127.0.0.1:{port}/readyz", gateway)
        yield replica_url, port, gateway.pid
    finally:
        stop(gateway)
        stop(replica)


def capacities(args: argparse.Namespace) -> tuple[float, float]:
    """Closed-loop throughput straight at the replica and through the gateway (limiter off)."""
    with fleet(args, "off") as (replica_url, port, _), asyncio.Runner(loop_factory=loop_factory("auto")) as runner:
        direct = runner.run(measure_capacity(replica_url, args.max_batch))
        via_gateway = runner.run(measure_capacity(f"http://127.0.0.1:{port}", args.max_batch))
    return direct, via_gateway


def run_setting(setting: str, args: argparse.Namespace, phases: list[Phase], capacity: float) -> Result:
    with fleet(args, setting) as (_, port, pid), asyncio.Runner(loop_factory=loop_factory("auto")) as runner:
        outcomes, rss, lag = runner.run(drive(port, phases, capacity, pid, args.max_connections))
    return analyse(setting, capacity, phases, outcomes, rss, lag)


def table(results: list[Result]) -> str:
    keys = list(results[0].rows)
    lines = ["| measure | " + " | ".join(f"limiter {r.setting}" for r in results) + " |",
             "|---|" + "---|" * len(results)]
    for key in keys:
        cells = []
        for r in results:
            v = r.rows[key]
            cells.append(f"{v:.1%}" if key.endswith("share") else f"{v:.2f}" if v < 100 else f"{v:.0f}")
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    lines.append("| other failures in burst | " + " | ".join(json.dumps(r.failures) for r in results) + " |")
    lines.append("| concurrency limit min/median/max by phase | "
                 + " | ".join(", ".join(f"{k} {'/'.join(map(str, v))}" for k, v in r.limits.items()) or "—"
                              for r in results) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--settings", default="off,on", help="comma list of off, on, on:--flag=value[:...], each "
                    "optionally with @DIR (that setting's gateway from the source tree DIR)")
    ap.add_argument("--batch-latency-ms", type=float, default=20.0)
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--burst-s", type=float, default=20.0)
    ap.add_argument("--scale", type=float, default=1.0, help="multiply the other phases' lengths (short dev runs)")
    ap.add_argument("--capacity", type=float, help="skip measuring it (requests/s)")
    ap.add_argument("--max-connections", type=int, default=10_000)
    ap.add_argument("--gateway-core", type=int, help="run the gateway on this core alone, and this client and "
                    "the replica on the others (the gateway's refusals then wait for no other process)")
    ap.add_argument("--out", type=Path, default=Path("out/overload.json"))
    args = ap.parse_args()
    if args.gateway_core is not None:
        others = os.sched_getaffinity(0) - {args.gateway_core}
        if args.gateway_core not in os.sched_getaffinity(0) or not others:
            ap.error(f"--gateway-core {args.gateway_core}: needs one of this machine's cores "
                     f"{sorted(os.sched_getaffinity(0))} and at least one more")
        os.sched_setaffinity(0, others)  # this client, and the replica it starts, keep off the gateway's core
    s = args.scale
    phases = [Phase("unloaded", 0.2, 8 * s), Phase("p60", 0.6, 20 * s), Phase("burst", 3.0, args.burst_s),
              Phase("after", 0.5, 15 * s)]
    pinned = "" if args.gateway_core is None else f", gateway alone on core {args.gateway_core}"
    print(f"# overload — {os.cpu_count()} cores{pinned}, load average {os.getloadavg()[0]:.2f}, "
          f"{time.strftime('%Y-%m-%d %H:%M')}", flush=True)
    capacity = args.capacity
    if capacity is None:
        direct, capacity = capacities(args)
        print(f"capacity, closed loop with {4 * args.max_batch} in flight: {direct:.0f} req/s straight at the "
              f"replica, {capacity:.0f} req/s through the gateway (limiter off; the phases' unit); max_batch "
              f"{args.max_batch} / batch latency {args.batch_latency_ms} ms allows "
              f"{args.max_batch / args.batch_latency_ms * 1000:.0f}", flush=True)
    results = []
    for setting in args.settings.split(","):
        gateway_flags(setting)
        source_tree(setting)
    for setting in args.settings.split(","):
        print(f"-- limiter {setting}", flush=True)
        results.append(run_setting(setting, args, phases, capacity))
        print(table(results[-1:]), flush=True)
    print(f"\n### overload, load average {os.getloadavg()[0]:.2f}\n" + table(results))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps([{"setting": r.setting, "capacity": r.capacity, **r.rows,
                                     "failures": r.failures, "limits": r.limits} for r in results], indent=2))


if __name__ == "__main__":
    main()
