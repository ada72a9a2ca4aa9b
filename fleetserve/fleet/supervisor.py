"""Supervise a local fleet: N ``fleetserve serve`` processes and one ``fleetserve gateway`` in front of them.

The engine is built once before any replica starts (replicas then load it from the cache, never racing to
build it). A replica that exits is restarted with exponential backoff (reset after it stayed up for
``stable_s``); it rejoins through the gateway's health checks and slow start. SIGINT/SIGTERM stop the
gateway first (no new traffic), then drain every replica. Clock and sleep are injectable for tests of the
restart policy.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field

from fleetserve.errors import FleetserveError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FleetConfig:
    model: str = "minilm"
    replicas: int = 3
    host: str = "127.0.0.1"
    gateway_port: int = 8080
    base_port: int = 8100  # replica i listens on base_port + 2i (HTTP) and base_port + 2i + 1 (gRPC)
    gateway_workers: int = 1
    policy: str = "p2c-peak-ewma"
    replica_args: tuple[str, ...] = ()  # extra `fleetserve serve` flags, e.g. --precision int8
    gateway_args: tuple[str, ...] = ()
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 10.0
    stable_s: float = 30.0
    ready_timeout_s: float = 300.0
    status_interval_s: float = 2.0
    gateway: bool = True  # False: replicas only (e.g. NGINX or HAProxy in front instead)
    cores: int = field(default_factory=lambda: len(os.sched_getaffinity(0)))

    def __post_init__(self) -> None:
        if not 1 <= self.replicas <= 64:
            raise ValueError(f"replicas must be in 1..64, got {self.replicas}")
        if self.backoff_initial_s <= 0 or self.backoff_max_s < self.backoff_initial_s:
            raise ValueError("backoff must be positive and max >= initial")

    def replica_port(self, i: int) -> int:
        return self.base_port + 2 * i

    def threads_per_replica(self) -> int:
        return max(1, self.cores // self.replicas)


class Backoff:
    """Exponential restart delay, reset once a process stayed up for ``stable_s``."""

    def __init__(self, initial: float, maximum: float, stable_s: float) -> None:
        self.initial, self.maximum, self.stable_s = initial, maximum, stable_s
        self.current = initial

    def next_delay(self, uptime_s: float) -> float:
        if uptime_s >= self.stable_s:
            self.current = self.initial
        delay = self.current
        self.current = min(self.maximum, self.current * 2)
        return delay


@dataclass
class Member:
    name: str
    argv: list[str]
    url: str
    ready_path: str
    backoff: Backoff
    process: asyncio.subprocess.Process | None = None
    started: float = 0.0
    restarts: int = 0
    ready: bool = False


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return bool(r.status == 200)
    except OSError:
        return False


class Supervisor:
    def __init__(self, config: FleetConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.clock = clock
        self.stopping = False
        cli = [sys.executable, "-m", "fleetserve.cli"]
        self.replicas = [
            Member(
                f"replica-{i}",
                [*cli, "serve", config.model, "--host", config.host, "--port", str(config.replica_port(i)),
                 "--grpc-port", str(config.replica_port(i) + 1), "--threads", str(config.threads_per_replica()),
                 "--drain-grace-s", "1", *config.replica_args],
                f"http://{config.host}:{config.replica_port(i)}",
                "/v2/health/ready",
                Backoff(config.backoff_initial_s, config.backoff_max_s, config.stable_s),
            )
            for i in range(config.replicas)
        ]
        backends = [a for m in self.replicas for a in ("--backend", m.url)]
        self.gateway = Member(
            "gateway",
            [*cli, "gateway", *backends, "--host", config.host, "--port", str(config.gateway_port),
             "--workers", str(config.gateway_workers), "--policy", config.policy, *config.gateway_args],
            f"http://{config.host}:{config.gateway_port}",
            "/readyz",
            Backoff(config.backoff_initial_s, config.backoff_max_s, config.stable_s),
        )

    @property
    def members(self) -> list[Member]:
        return [*self.replicas, self.gateway] if self.config.gateway else list(self.replicas)

    async def _spawn(self, m: Member) -> None:
        m.process = await asyncio.create_subprocess_exec(*m.argv, stdin=asyncio.subprocess.DEVNULL)
        m.started = self.clock()
        m.ready = False

    async def _watch(self, m: Member) -> None:
        """Keep ``m`` running: restart it with backoff whenever it exits, until the fleet stops."""
        while not self.stopping:
            assert m.process is not None
            code = await m.process.wait()
            if self.stopping:
                return
            delay = m.backoff.next_delay(self.clock() - m.started)
            log.warning("%s exited with %s; restarting in %.1f s", m.name, code, delay)
            await asyncio.sleep(delay)
            if self.stopping:
                return
            m.restarts += 1
            await self._spawn(m)

    async def _poll_ready(self) -> None:
        members = self.members
        states = await asyncio.gather(*(asyncio.to_thread(http_ok, m.url + m.ready_path) for m in members))
        for m, ok in zip(members, states, strict=True):
            m.ready = ok

    def status_line(self) -> str:
        ready = sum(m.ready for m in self.replicas)
        restarts = sum(m.restarts for m in self.replicas)
        line = f"replicas ready {ready}/{len(self.replicas)} | restarts {restarts}"
        return line + (f" | gateway {'up' if self.gateway.ready else 'down'}" if self.config.gateway else "")

    async def start(self) -> None:
        for m in self.replicas:
            await self._spawn(m)
        if self.config.gateway:
            await self._spawn(self.gateway)

    async def wait_ready(self) -> None:
        deadline = self.clock() + self.config.ready_timeout_s
        while self.clock() < deadline:
            await self._poll_ready()
            if all(m.ready for m in self.members):
                return
            for m in self.members:
                if m.process is not None and m.process.returncode is not None and m.restarts == 0:
                    raise FleetserveError(f"{m.name} exited with {m.process.returncode} during start-up")
            await asyncio.sleep(0.2)
        raise FleetserveError(f"fleet not ready after {self.config.ready_timeout_s:.0f} s: {self.status_line()}")

    async def stop(self) -> None:
        self.stopping = True
        for group in ([self.gateway], self.replicas) if self.config.gateway else (self.replicas,):
            procs = [m.process for m in group if m.process is not None and m.process.returncode is None]
            for p in procs:
                p.send_signal(signal.SIGTERM)
            for p in procs:
                try:
                    await asyncio.wait_for(p.wait(), timeout=30)
                except TimeoutError:
                    p.kill()
                    await p.wait()

    async def run(self, stop: asyncio.Event, print_status: Callable[[str], None] | None = None) -> None:
        await self.start()
        watchers = [asyncio.create_task(self._watch(m)) for m in self.members]
        try:
            await self.wait_ready()
            c = self.config
            if c.gateway:
                print(f"fleet ready: gateway {self.gateway.url}  (metrics {self.gateway.url}/metrics, "
                      f"backends {self.gateway.url}/gateway/backends)", flush=True)
            for m in self.replicas:
                print(f"  {m.name}: {m.url}  grpc {c.host}:{int(m.url.rsplit(':', 1)[1]) + 1}", flush=True)
            while not stop.is_set():
                try:
                    await asyncio.wait_for(stop.wait(), timeout=c.status_interval_s)
                except TimeoutError:
                    await self._poll_ready()
                    if print_status is not None:
                        print_status(self.status_line())
        finally:
            await self.stop()
            for w in watchers:
                w.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)

