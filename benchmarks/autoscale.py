"""Autoscaling (issue 10): a local fleet under four load traces, fixed or autoscaled, on real processes.

Every replica is ``tiny`` with ``--batch-latency-ms`` (each engine call holds its one instance that long),
``--max-batch`` rows per call and one sequence length (``--padding fixed --fixed-seq 32``), so its capacity is
about ``max_batch / batch_latency`` requests/s whatever the box does otherwise, and the scenarios stay
reproducible on 2 shared cores. (A replica warms every batch shape once before it turns ready, each call
taking the added latency too: one sequence length keeps that to a few calls, as a real engine's warm-up is.) Each run is
``fleetserve up`` as a user starts it: a fixed fleet (``--replicas N``) or an autoscaled one (``--autoscale
hpa|predictive --min-replicas 1 --max-replicas M``), with an open-loop Poisson load whose rate follows a trace
(multiples of ``--base-rate``; :class:`fleetserve.bench.arrivals.RateProfile`):

- ``ramp``:  1x for 10 s, up to 10x over 60 s, 10x for 20 s;
- ``step``:  1x for 20 s, 5x within 1 s, 5x for 60 s;
- ``sine``:  a compressed day, 1x to 5x and back in 120 s;
- ``flash``: 1x for 20 s, 8x within 1 s for 30 s, back to 1x at once for 40 s.

Modes: ``fixed-small`` (``--small`` replicas, enough for 1x), ``fixed-large`` (``--large``, enough for the
peak), ``hpa`` and ``predictive`` (both ticking every second, with the same range and the same scale-down
stabilisation, ``--scale-down-s``: the traces compress hours into minutes, so Kubernetes' 300 s default would
never act), and ``hpa-15s``: the same hpa rule evaluated every 15 s, Kubernetes' default sync period, i.e. the
HorizontalPodAutoscaler as a cluster runs it on these signals. ``--replica-startup-s`` adds that many seconds
between a replica's warm-up and its readiness (``--warmup-delay-s``), standing in for the engine load or image
pull that makes real start-ups take seconds to minutes: the lead the predictive rule forecasts over.

First, how fast one replica turns ready from the warm engine cache, started the two ways the supervisor can
(``--launch-repeats`` times each, alternating; :mod:`fleetserve.fleet.launch`): ``spawn`` (a fresh interpreter)
and ``forkserver`` (a fork of a server that imported the replica once; what the autoscaler uses), from the call
that starts it to its first 200 on ``/v2/health/ready``, with the replica settings below.

Per trace and mode: **SLO-violation seconds** (1 s windows, by completion time, whose p99 exceeds
``--slo-p99-ms``), **replica-seconds** (replica processes alive, sampled every 0.25 s, integrated over the
trace), failed requests (every non-2xx answer, timeout, refused connection or drop), and for the autoscaled
modes the decision-to-ready time of every added replica (the actuator's measurement: from the poll that saw
the gateway's decision to the PUT that made the replica routable, printed by ``fleetserve up``). Then the
scale-from-zero probe: ``--min-replicas 0``, a burst of ``--zero-burst`` requests at a fleet of 0, the time to
the first answer and how many of the burst failed, ``--zero-repeats`` times (the fleet returns to zero after
``--idle-to-zero-s`` between them). One plot per trace (load, replicas, p99 over time, every mode).

    flock /tmp/fleetserve-bench.lock .venv/bin/python benchmarks/autoscale.py [--traces ramp,step,sine,flash]
        [--modes fixed-small,fixed-large,hpa,predictive] [--duration-scale 1.0] [--plots DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import os
import re
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fleetserve.bench.arrivals import RateProfile
from fleetserve.bench.loadgen import LoadConfig, run_load
from fleetserve.bench.report import LoadReport
from fleetserve.deploy.local import free_port, free_port_block

from _common import machine

TRACES: dict[str, RateProfile] = {
    "ramp": RateProfile(((0, 1), (10, 1), (70, 10), (90, 10))),
    "step": RateProfile(((0, 1), (20, 1), (21, 5), (81, 5))),
    "sine": RateProfile(tuple((float(t), 3 - 2 * math.cos(2 * math.pi * t / 120)) for t in range(0, 121, 4))),
    "flash": RateProfile(((0, 1), (20, 1), (21, 8), (51, 8), (51.05, 1), (91, 1))),
}
MODES = ("fixed-small", "fixed-large", "hpa", "predictive", "hpa-15s")
AUTOSCALED = {"hpa": ("hpa", 1.0), "predictive": ("predictive", 1.0), "hpa-15s": ("hpa", 15.0)}  # rule, tick s
READY_LINE = re.compile(r"(replica-\d+) ready and receiving traffic ([0-9.]+) s after the decision")
SAMPLE_S = 0.25


@dataclass
class Setup:
    base_rate: float
    batch_latency_ms: float
    max_batch: int
    small: int
    large: int
    max_replicas: int
    slo_p99_ms: float
    scale_down_s: float
    duration_scale: float
    replica_startup_s: float = 0.0
    timeout_s: float = 30.0

    def replica_args(self) -> str:
        return (f"--batch-latency-ms {self.batch_latency_ms:g} --max-batch {self.max_batch} --padding fixed "
                f"--fixed-seq 32 --instances 1 --threads 1 --max-queue 100000 "
                f"--warmup-delay-s {self.replica_startup_s:g}")

    @property
    def capacity_rps(self) -> float:
        return self.max_batch / (self.batch_latency_ms / 1000)


# ------------------------------------------------------------------------------------------------ the fleet
class Fleet:
    """``fleetserve up`` as a subprocess; its output collected (the actuator's decision-to-ready lines)."""

    def __init__(self, setup: Setup, mode: str, *, min_replicas: int = 1, idle_to_zero_s: float = 60.0) -> None:
        self.port = free_port()
        self.base = free_port_block(2 * max(setup.large, setup.max_replicas))
        args = ["up", "tiny", "--port", str(self.port), "--base-port", str(self.base),
                "--replica-args", setup.replica_args(), "--log-level", "info"]
        self.autoscaled = mode in AUTOSCALED
        if self.autoscaled:
            rule, tick_s = AUTOSCALED[mode]
            args += ["--autoscale", rule, "--autoscale-interval-s", f"{tick_s:g}",
                     "--min-replicas", str(min_replicas), "--max-replicas",
                     str(setup.max_replicas), "--slo-p99-ms", f"{setup.slo_p99_ms:g}",
                     "--hpa-scale-down-stabilization-s", f"{setup.scale_down_s:g}",
                     "--idle-to-zero-s", f"{idle_to_zero_s:g}"]
        else:
            args += ["--replicas", str(setup.small if mode == "fixed-small" else setup.large)]
        self.replicas = 0 if self.autoscaled else int(args[-1])
        self.proc = subprocess.Popen([sys.executable, "-m", "fleetserve.cli", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.lines: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def state(self) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(f"{self.url}/gateway/autoscale", timeout=2) as r:
                state: dict[str, Any] = json.load(r)
                return state
        except (OSError, ValueError):
            return None

    def alive(self) -> int:
        """Replica processes running now: the autoscaler's members (ready + starting + draining), or N."""
        if not self.autoscaled:
            return self.replicas
        state = self.state()
        if state is None:
            return 0
        members = state["members"]
        return len(members["ready"]) + len(members["starting"]) + len(members["draining"])

    def ready_count(self) -> int:
        state = self.state()
        return 0 if state is None else len(state["members"]["ready"])

    def wait_ready(self, replicas: int, timeout_s: float = 180.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"fleetserve up exited {self.proc.returncode}:\n{''.join(self.lines[-30:])}")
            if any("fleet ready" in line for line in self.lines) and (
                    not self.autoscaled or self.ready_count() >= replicas):
                return
            time.sleep(0.1)
        raise TimeoutError(f"fleet not ready after {timeout_s} s:\n{''.join(self.lines[-30:])}")

    def startup_times(self) -> list[float]:
        return [float(m.group(2)) for line in self.lines if (m := READY_LINE.search(line))]

    def stop(self) -> None:
        self.proc.send_signal(2)  # SIGINT, as Ctrl-C
        try:
            self.proc.wait(90)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


# ------------------------------------------------------------------------------------------ launch probe
async def launch_times(setup: Setup, repeats: int) -> dict[str, list[float]]:
    """Seconds from starting a replica slot to its readiness 200, per launcher, ``repeats`` times each."""
    import aiohttp

    from fleetserve.fleet.config import FleetConfig, gateway_config, replica_config
    from fleetserve.fleet.launch import ForkServerLauncher, Launcher, SpawnLauncher
    from fleetserve.fleet.supervisor import Supervisor

    forkserver = ForkServerLauncher()
    await forkserver.prepare()
    launchers: dict[str, Launcher] = {"spawn": SpawnLauncher(), "forkserver": forkserver}
    replica = replica_config("tiny", ("--drain-grace-s", "0", *setup.replica_args().split()))
    times: dict[str, list[float]] = {name: [] for name in launchers}
    async with aiohttp.ClientSession() as session:
        for _ in range(repeats):
            for name, launcher in launchers.items():
                fleet = FleetConfig(replicas=1, base_port=free_port_block(2), cores=1)
                supervisor = Supervisor(fleet, replica, gateway_config(), launcher=launcher, initial=0)
                t0 = time.monotonic()
                member = await supervisor.add_replica(0)
                while True:
                    with contextlib.suppress(aiohttp.ClientError):
                        async with session.get(member.url + member.ready_path) as r:
                            if r.status == 200:
                                break
                    await asyncio.sleep(0.01)
                times[name].append(time.monotonic() - t0)
                await supervisor.retire(member)
                await supervisor.stop()
    return times


# --------------------------------------------------------------------------------------------------- a run
@dataclass
class Run:
    trace: str
    mode: str
    duration_s: float
    slo_violation_s: int
    replica_s: float
    requests: int
    failed: int
    failures: dict[str, int]
    startup_s: list[float]
    seconds: list[dict[str, Any]] = field(default_factory=list)  # t, offered, ok, p99_s
    replicas: list[tuple[float, int]] = field(default_factory=list)  # (t, alive)

    def row(self) -> str:
        ready = (f"{len(self.startup_s)}: median {statistics.median(self.startup_s):.2f} s, "
                 f"max {max(self.startup_s):.2f} s" if self.startup_s else "–")
        return (f"| {self.trace} | {self.mode} | {self.slo_violation_s} | {self.replica_s:.0f} | {self.failed} "
                f"of {self.requests} | {ready} |")


async def sample(fleet: Fleet, stop: asyncio.Event, t0: float, into: list[tuple[float, int]]) -> None:
    while not stop.is_set():
        into.append((time.monotonic() - t0, await asyncio.to_thread(fleet.alive)))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), SAMPLE_S)


def replica_seconds(samples: list[tuple[float, int]], end: float) -> float:
    """The step function of sampled counts, integrated over [0, end]."""
    total = 0.0
    for (t, n), (t_next, _) in zip(samples, [*samples[1:], (end, 0)], strict=True):
        total += n * max(0.0, min(t_next, end) - min(t, end))
    return total


async def run_one(setup: Setup, trace: str, mode: str, logs: Path | None) -> Run:
    profile = TRACES[trace].scaled(setup.duration_scale)
    fleet = Fleet(setup, mode)
    try:
        await asyncio.to_thread(fleet.wait_ready, 1)
        load = LoadConfig(url=fleet.url, rate=setup.base_rate, profile=profile, duration_s=profile.duration_s,
                          workload="texts", long_fraction=0.0, timeout_s=setup.timeout_s, max_inflight=20_000,
                          seed=7)
        samples: list[tuple[float, int]] = []
        stop = asyncio.Event()
        t0 = time.monotonic()
        sampler = asyncio.create_task(sample(fleet, stop, t0, samples))
        report: LoadReport = await run_load(load)
        stop.set()
        await sampler
    finally:
        await asyncio.to_thread(fleet.stop)
        if logs is not None:
            logs.mkdir(parents=True, exist_ok=True)
            (logs / f"{trace}-{mode}.log").write_text("".join(fleet.lines))
    slo_s = setup.slo_p99_ms / 1000
    seconds = [{"t": s.t, "offered": s.sent, "ok": s.ok, "errors": s.errors,
                "p99_s": None if math.isnan(s.p99_s) else s.p99_s} for s in report.timeseries]
    violations = sum(1 for s in report.timeseries if not math.isnan(s.p99_s) and s.p99_s > slo_s)
    return Run(trace, mode, profile.duration_s, violations, replica_seconds(samples, profile.duration_s),
               report.requests, report.errors, dict(report.errors_by_type), fleet.startup_times(), seconds, samples)


async def from_zero(setup: Setup, repeats: int, burst: int, idle_s: float) -> list[dict[str, Any]]:
    """A fleet at 0: a burst of requests, the time to the first answer, failures; back to 0 between repeats."""
    import aiohttp

    fleet = Fleet(setup, "hpa", min_replicas=0, idle_to_zero_s=idle_s)
    results = []
    try:
        await asyncio.to_thread(fleet.wait_ready, 0)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=setup.timeout_s)) as session:
            for _ in range(repeats):
                deadline = time.monotonic() + idle_s + 60
                while fleet.alive() > 0 or fleet.ready_count() > 0:
                    if time.monotonic() > deadline:
                        raise TimeoutError("the fleet did not return to zero")
                    await asyncio.sleep(0.2)
                t0 = time.monotonic()
                firsts: list[float] = []

                async def one(session: aiohttp.ClientSession = session, t0: float = t0,
                              firsts: list[float] = firsts) -> int:
                    async with session.post(f"{fleet.url}/inference", json={"texts": ["hello world"]}) as r:
                        await r.read()
                        firsts.append(time.monotonic() - t0)
                        return r.status

                statuses = await asyncio.gather(*(one() for _ in range(burst)), return_exceptions=True)
                failed = sum(1 for s in statuses if s != 200)
                results.append({"first_response_s": min(firsts) if firsts else None,
                                "last_response_s": max(firsts) if firsts else None,
                                "burst": burst, "failed": failed})
                print(f"  from zero: first answer {results[-1]['first_response_s']:.2f} s, "
                      f"{failed} of {burst} failed", flush=True)
    finally:
        await asyncio.to_thread(fleet.stop)
    return results


# ------------------------------------------------------------------------------------------------- report
def plot(trace: str, runs: list[Run], setup: Setup, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (load, reps, p99) = plt.subplots(3, 1, sharex=True, figsize=(9, 8))
    offered = runs[0].seconds
    load.plot([s["t"] for s in offered], [s["offered"] for s in offered], color="black", label="offered")
    for run in runs:
        load.plot([s["t"] for s in run.seconds], [s["ok"] for s in run.seconds], label=f"{run.mode} answered",
                  alpha=0.7)
        reps.step([t for t, _ in run.replicas], [n for _, n in run.replicas], where="post", label=run.mode)
        p99.plot([s["t"] for s in run.seconds], [s["p99_s"] * 1000 if s["p99_s"] is not None else math.nan
                                                  for s in run.seconds], label=run.mode)
    p99.axhline(setup.slo_p99_ms, color="red", linestyle="--", label="SLO")
    p99.set_yscale("log")
    load.set_ylabel("requests/s")
    reps.set_ylabel("replicas alive")
    p99.set_ylabel("p99 (ms)")
    p99.set_xlabel("seconds")
    for ax in (load, reps, p99):
        ax.legend(fontsize=7, loc="upper left")
        ax.grid(alpha=0.3)
    load.set_title(f"{trace}: base {setup.base_rate:g} req/s, replica capacity ~{setup.capacity_rps:.0f} req/s")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def table(runs: list[Run]) -> Iterator[str]:
    yield ("| trace | mode | SLO-violation s | replica-s | failed requests | decision-to-ready per added replica |")
    yield "|---|---|---:|---:|---:|---|"
    for run in runs:
        yield run.row()


def goals(runs: list[Run], zero: list[dict[str, Any]]) -> Iterator[str]:
    by = {(r.trace, r.mode): r for r in runs}
    for trace, against in itertools.product(("ramp", "step"), ("hpa", "hpa-15s")):
        hpa, pred = by.get((trace, against)), by.get((trace, "predictive"))
        if hpa and pred:
            fewer = (f"{1 - pred.slo_violation_s / hpa.slo_violation_s:.0%} fewer" if hpa.slo_violation_s
                     else f"{against} had none to cut")
            more = pred.replica_s / hpa.replica_s - 1 if hpa.replica_s else math.nan
            yield (f"- {trace}: predictive {pred.slo_violation_s} vs {against} {hpa.slo_violation_s} SLO-violation "
                   f"s ({fewer}; goal >= 50% fewer), replica-s {pred.replica_s:.0f} vs {hpa.replica_s:.0f} "
                   f"({more:+.0%}; goal <= +15%)")
    for trace in TRACES:
        small, large = by.get((trace, "fixed-small")), by.get((trace, "fixed-large"))
        for mode in AUTOSCALED:
            run = by.get((trace, mode))
            if run and small and large:
                yield (f"- {trace} {mode}: violations {run.slo_violation_s} vs fixed-small {small.slo_violation_s}"
                       f"; replica-s {run.replica_s:.0f} vs fixed-large {large.replica_s:.0f}")
    scaled = [r for r in runs if r.mode in AUTOSCALED]
    yield f"- failed requests in autoscaled runs: {sum(r.failed for r in scaled)} (goal 0)"
    startups = [s for r in scaled for s in r.startup_s]
    if startups:
        yield (f"- decision-to-ready: {len(startups)} replicas, max {max(startups):.2f} s, "
               f"{sum(s <= 2 for s in startups)} within 2 s (goal <= 2 s)")
    firsts = [z["first_response_s"] for z in zero if z["first_response_s"] is not None]
    if zero:
        yield (f"- from zero: first answer {', '.join(f'{f:.2f}' for f in firsts)} s (goal <= 3 s), "
               f"{sum(z['failed'] for z in zero)} of {sum(z['burst'] for z in zero)} failed")


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", default=",".join(TRACES))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--duration-scale", type=float, default=1.0, help="stretch (>1) or shrink every trace")
    parser.add_argument("--base-rate", type=float, default=20.0, help="requests/s at 1x")
    parser.add_argument("--batch-latency-ms", type=float, default=100.0)
    parser.add_argument("--max-batch", type=int, default=4)
    parser.add_argument("--small", type=int, default=2, help="replicas of fixed-small")
    parser.add_argument("--large", type=int, default=8, help="replicas of fixed-large")
    parser.add_argument("--max-replicas", type=int, default=8)
    parser.add_argument("--slo-p99-ms", type=float, default=400.0)
    parser.add_argument("--scale-down-s", type=float, default=30.0, help="hpa scale-down stabilisation")
    parser.add_argument("--replica-startup-s", type=float, default=0.0,
                        help="seconds a new replica waits after warm-up before turning ready (slow start-ups)")
    parser.add_argument("--zero-repeats", type=int, default=3, help="scale-from-zero probes (0: none)")
    parser.add_argument("--launch-repeats", type=int, default=5, help="replica starts per launcher (0: none)")
    parser.add_argument("--zero-burst", type=int, default=20)
    parser.add_argument("--idle-to-zero-s", type=float, default=5.0)
    parser.add_argument("--plots", type=Path, default=Path("docs/autoscale"))
    parser.add_argument("--json", type=Path, default=None, help="write every run's time series here")
    parser.add_argument("--logs", type=Path, default=None, help="write each run's `fleetserve up` output here")
    args = parser.parse_args()
    traces, modes = [t for t in args.traces.split(",") if t], args.modes.split(",")
    for name in traces:
        if name not in TRACES:
            raise SystemExit(f"unknown trace {name!r}: {', '.join(TRACES)}")
    for name in modes:
        if name not in MODES:
            raise SystemExit(f"unknown mode {name!r}: {', '.join(MODES)}")
    setup = Setup(args.base_rate, args.batch_latency_ms, args.max_batch, args.small, args.large, args.max_replicas,
                  args.slo_p99_ms, args.scale_down_s, args.duration_scale, args.replica_startup_s)
    print(f"machine: {machine()}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {uptime()}", flush=True)
    print(f"setup: {asdict(setup)} (replica capacity ~{setup.capacity_rps:.0f} req/s)", flush=True)
    launch = await launch_times(setup, args.launch_repeats) if args.launch_repeats else {}
    for name, seconds in launch.items():
        print(f"replica start to ready, {name}: median {statistics.median(seconds):.2f} s, max {max(seconds):.2f} s "
              f"({', '.join(f'{t:.2f}' for t in seconds)})", flush=True)
    runs: list[Run] = []
    for trace in traces:
        done = []
        for mode in modes:
            run = await run_one(setup, trace, mode, args.logs)
            print(run.row(), f"  [{uptime()}]", flush=True)
            runs.append(run)
            done.append(run)
        with contextlib.suppress(ImportError):
            plot(trace, done, setup, args.plots / f"{trace}.png")
    zero = await from_zero(setup, args.zero_repeats, args.zero_burst, args.idle_to_zero_s) \
        if args.zero_repeats else []
    if runs:
        print()
        print("\n".join(table(runs)))
    print()
    print("\n".join(goals(runs, zero)))
    print(f"\nfinished {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {uptime()}")
    if args.json is not None:
        args.json.write_text(json.dumps({"setup": asdict(setup), "launch": launch, "runs": [asdict(r) for r in runs],
                                         "from_zero": zero}, indent=1))


if __name__ == "__main__":
    asyncio.run(main())
