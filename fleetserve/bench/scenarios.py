"""Scenario runs: a local fleet, a front (our gateway, NGINX, HAProxy, Envoy), open-loop load and one fault.

The same harness backs ``benchmarks/gateway.py`` (long runs, recorded in BENCHMARKS.md) and the slow
integration tests (short runs with assertions). Faults (see :mod:`fleetserve.bench.faults`) hit replica 0:
``throttle`` (SIGSTOP duty cycle), ``crash`` (SIGKILL; the supervisor restarts it), ``rolling`` (SIGTERM
every replica in turn), ``partition-drop`` and ``partition-delay`` (replica 0 runs in its own network
namespace whose packets are dropped, or held 2 s each way, from the fault on: :mod:`fleetserve.bench.netns`).
The Envoy fronts are ``fleetserve deploy envoy``'s config with ``LEAST_REQUEST`` (``envoy-least-request``)
or ORCA-fed ``client_side_weighted_round_robin`` (``envoy-cwrr``). With our gateway or Envoy in front, the
harness also records when the front stopped routing to the faulty replica and when it took it back
(``GET /gateway/backends``, Envoy's admin ``/clusters``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import urllib.request
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from fleetserve.bench import faults
from fleetserve.bench.cpu import replica_overhead, thread_cpu_seconds, tree_cpu_seconds
from fleetserve.bench.loadgen import LoadConfig, run_load
from fleetserve.bench.netns import NetworkNamespace
from fleetserve.bench.replica_metrics import batch_events, engine_counters, fetch
from fleetserve.bench.report import LoadReport
from fleetserve.fleet.config import FleetConfig, gateway_config, replica_config
from fleetserve.fleet.supervisor import Placement, Supervisor, http_ok

FRONTS = ("fleetserve", "nginx-round-robin", "nginx-least-conn", "haproxy-leastconn", "envoy-least-request",
          "envoy-cwrr", "direct")
ENVOY_FRONTS = {"envoy-least-request": "least-request", "envoy-cwrr": "client-side-weighted-round-robin"}
# Every front checks health at the pace our gateway does in these runs (--health-interval 1).
HEALTH_INTERVAL_S = 1.0
PARTITIONS = ("partition-drop", "partition-delay")
FAULTS = ("none", "throttle", "crash", "rolling", *PARTITIONS)


@dataclass(frozen=True)
class ScenarioConfig:
    fault: str = "none"
    front: str = "fleetserve"
    policy: str = "p2c-peak-ewma"
    model: str = "tiny"
    replicas: int = 4
    rate: float | None = 200.0
    concurrency: int | None = None
    duration_s: float = 30.0
    warmup_s: float = 2.0
    fault_at_s: float = 5.0  # seconds into the measured window
    base_port: int = 20100
    gateway_port: int = 20080
    gateway_args: tuple[str, ...] = ()
    replica_args: tuple[str, ...] = ()
    partition_delay_ms: float = 2000.0

    def __post_init__(self) -> None:
        if self.fault not in FAULTS:
            raise ValueError(f"fault must be one of {FAULTS}, got {self.fault!r}")
        if self.front not in FRONTS:
            raise ValueError(f"front must be one of {FRONTS}, got {self.front!r}")


@dataclass
class ScenarioResult:
    config: ScenarioConfig
    report: LoadReport
    events: dict[str, float] = field(default_factory=dict)

    def row(self) -> dict[str, object]:
        r = self.report
        return {
            "fault": self.config.fault, "front": self.config.front,
            "policy": " ".join((self.config.policy, *self.config.gateway_args))
            if self.config.front == "fleetserve" else "",
            "ok_rps": r.achieved_rps, "errors": r.errors,
            "p50_ms": r.percentile(50) * 1e3, "p99_ms": r.percentile(99) * 1e3, "p999_ms": r.percentile(99.9) * 1e3,
            "error_types": dict(r.errors_by_type),
            **self.events,
        }


def gateway_state(gateway_url: str) -> Callable[[str], str]:
    """A replica's state as our gateway reports it (``healthy`` when routable), by URL."""
    def state(url: str) -> str:
        with urllib.request.urlopen(f"{gateway_url}/gateway/backends", timeout=2) as resp:
            rows: list[dict[str, object]] = json.loads(resp.read())["backends"]
        return next((str(r.get("state")) for r in rows if r.get("url") == url), "")

    return state


async def _watch_state(state_of: Callable[[str], str], url: str, since: float, events: dict[str, float],
                       stop: asyncio.Event) -> None:
    """Record when the front stopped treating ``url`` as routable and when it took it back."""
    while not stop.is_set():
        try:
            state = await asyncio.to_thread(state_of, url)
        except (OSError, ValueError, KeyError):
            state = ""
        now = time.monotonic() - since
        if state and state != "healthy" and "out_after_s" not in events:
            events["out_after_s"] = now
        if state == "healthy" and "out_after_s" in events and "back_after_s" not in events:
            events["back_after_s"] = now
        await asyncio.sleep(0.05)


@dataclass
class Front:
    """Where the load goes, the process whose CPU is the front's, and how it sees a replica (or None)."""

    url: str
    pid: int | None
    state_of: Callable[[str], str] | None = None


@contextlib.asynccontextmanager
async def _front(cfg: ScenarioConfig, supervisor: Supervisor) -> AsyncIterator[Front]:
    if cfg.front == "fleetserve":
        assert supervisor.gateway.process is not None
        yield Front(supervisor.gateway.url, supervisor.gateway.process.pid, gateway_state(supervisor.gateway.url))
        return
    if cfg.front == "direct":
        yield Front(supervisor.replicas[0].url, None)
        return
    from fleetserve.deploy.local import EnvoyProcess, ForegroundProcess, HaproxyProcess, NginxProcess

    backends = [(m.url, 1.0) for m in supervisor.replicas]
    port = cfg.gateway_port + 1
    proc: ForegroundProcess
    if cfg.front.startswith("nginx"):
        policy = "least_conn" if cfg.front.endswith("least-conn") else "round-robin"
        proc = NginxProcess(backends, port=port, policy=policy, access_log=False)
    elif cfg.front in ENVOY_FRONTS:
        proc = EnvoyProcess(backends, port=port, policy=ENVOY_FRONTS[cfg.front],
                            health_interval_s=HEALTH_INTERVAL_S)
    else:
        proc = HaproxyProcess(backends, port=port, policy="leastconn", access_log=False,
                              health_interval_s=HEALTH_INTERVAL_S)
    with proc:
        yield Front(proc.url, proc.pid, proc.health_of if isinstance(proc, EnvoyProcess) else None)


async def _inject(cfg: ScenarioConfig, supervisor: Supervisor, partition: NetworkNamespace | None,
                  stop: asyncio.Event) -> list[asyncio.Task[object]]:
    """Start the fault on replica 0; returns the tasks that keep it going until ``stop``."""
    victim = supervisor.replicas[0]
    if cfg.fault == "throttle":
        assert victim.process is not None
        return [asyncio.create_task(faults.duty_cycle_stop(victim.process.pid, stop))]
    if cfg.fault == "crash":
        assert victim.process is not None
        faults.crash(victim.process.pid)
    elif cfg.fault == "rolling":
        async def ready(i: int) -> None:
            member = supervisor.replicas[i]
            await asyncio.sleep(0.5)
            while not await asyncio.to_thread(http_ok, f"{member.url}/v2/health/ready"):
                await asyncio.sleep(0.1)

        return [asyncio.create_task(faults.rolling_restart(
            lambda: [m.process.pid for m in supervisor.replicas if m.process is not None], ready))]
    elif cfg.fault == "partition-drop":
        assert partition is not None
        await asyncio.to_thread(partition.drop)
    elif cfg.fault == "partition-delay":
        assert partition is not None
        await asyncio.to_thread(partition.delay, cfg.partition_delay_ms)
    return []


async def run_scenario(cfg: ScenarioConfig) -> ScenarioResult:
    """One run; a partition fault puts replica 0 in its own network namespace, removed afterwards whatever
    happened."""
    with contextlib.ExitStack() as stack:
        partition = stack.enter_context(NetworkNamespace()) if cfg.fault in PARTITIONS else None
        return await _run_scenario(cfg, partition)


async def _run_scenario(cfg: ScenarioConfig, partition: NetworkNamespace | None) -> ScenarioResult:
    fleet = FleetConfig(
        replicas=1 if cfg.front == "direct" else cfg.replicas, gateway_port=cfg.gateway_port,
        base_port=cfg.base_port, gateway=cfg.front == "fleetserve", status_interval_s=3600,
    )
    replica = replica_config(cfg.model, ("--drain-grace-s", "1", *cfg.replica_args))
    gateway = gateway_config(("--health-interval", f"{HEALTH_INTERVAL_S:g}", "--policy", cfg.policy,
                              *cfg.gateway_args))
    placements = None if partition is None else {0: Placement(partition.address, tuple(partition.wrap([])))}
    supervisor = Supervisor(fleet, replica, gateway, placements=placements)
    stop_fleet = asyncio.Event()
    fleet_task = asyncio.create_task(supervisor.run(stop_fleet))
    events: dict[str, float] = {}
    stop_fault = asyncio.Event()
    background: list[asyncio.Task[object]] = []
    try:
        while not all(m.ready for m in supervisor.members):
            if fleet_task.done():
                fleet_task.result()
                raise RuntimeError("fleet stopped before it was ready")
            await asyncio.sleep(0.1)
        async with _front(cfg, supervisor) as front:
            front_pid = front.pid
            load = asyncio.create_task(run_load(LoadConfig(
                url=front.url, rate=cfg.rate, concurrency=cfg.concurrency, duration_s=cfg.duration_s,
                warmup_s=cfg.warmup_s, workload="texts", model=cfg.model,
            )))
            await asyncio.sleep(cfg.warmup_s)
            cpu_start = tree_cpu_seconds(front_pid) if front_pid else 0.0
            replica_threads = {m.process.pid: thread_cpu_seconds(m.process.pid)
                               for m in supervisor.replicas if m.process is not None}
            urls = [m.url for m in supervisor.replicas]
            counters = await asyncio.to_thread(lambda: [engine_counters(fetch(u)) for u in urls]) \
                if cfg.fault in ("none", "throttle") else None
            if cfg.fault in ("crash", "rolling", *PARTITIONS):
                await asyncio.sleep(cfg.fault_at_s)
            t0 = time.monotonic()
            if front.state_of is not None and cfg.fault != "none":
                background.append(asyncio.create_task(_watch_state(front.state_of, supervisor.replicas[0].url, t0,
                                                                   events, stop_fault)))
            background += await _inject(cfg, supervisor, partition, stop_fault)
            report = await load
            if front_pid:
                # Health checks and metrics scrapes are in the CPU too: a small, honest overcount.
                cpu = tree_cpu_seconds(front_pid) - cpu_start
                events["front_cpu_us_per_req"] = cpu / max(1, report.requests) * 1e6
            if cfg.fault == "none":  # a restarted replica is another process
                with contextlib.suppress(OSError):
                    overhead = sum(replica_overhead(pid, before, thread_cpu_seconds(pid))
                                   for pid, before in replica_threads.items())
                    events["replica_cpu_us_per_req"] = overhead / max(1, report.requests) * 1e6
            if counters is not None:  # the same processes throughout: their totals' differences are the run's
                events.update(batch_events(counters, await asyncio.to_thread(
                    lambda: [engine_counters(fetch(u)) for u in urls])))
            events["restarts"] = float(sum(m.restarts for m in supervisor.replicas))
            return ScenarioResult(cfg, report, events)
    finally:
        stop_fault.set()
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        if partition is not None:
            await asyncio.to_thread(partition.heal)  # the replica stops as it would anywhere else
        stop_fleet.set()
        await fleet_task
