"""Supervise a local fleet: N replica processes and one gateway process in front of them.

Each child gets its validated config whole (:mod:`fleetserve.fleet.child`), never re-parsed flags, and an
environment without the parent's ``FLEETSERVE_*`` options. The engine is built once before any replica
starts (replicas then load it from the cache, never racing to build it). A replica that exits is restarted
with exponential backoff (reset after it stayed up for ``stable_s``); it rejoins through the gateway's health
checks and slow start. SIGINT/SIGTERM stop the gateway first (no new traffic), then drain every replica. The
clock is injectable for tests of the restart policy.

An autoscaled fleet starts with no replicas: its actuator adds replicas by slot (:meth:`Supervisor.add_replica`,
ports ``base_port + 2i``) and removes them by drain (:meth:`Supervisor.retire`); the same restart policy keeps
them running meanwhile. How a process starts is the ``launcher``'s concern (:mod:`fleetserve.fleet.launch`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import shutil
import signal
import tempfile
import time
import urllib.request
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from fleetserve.errors import FleetserveError
from fleetserve.fleet.config import FleetConfig
from fleetserve.fleet.launch import Child, Launcher, SpawnLauncher
from fleetserve.gateway.config import GatewayConfig
from fleetserve.options import ENV_PREFIX
from fleetserve.replica.config import ReplicaConfig
from fleetserve.telemetry import logs

log = logging.getLogger(__name__)


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


# What a child keeps of the parent's environment among FLEETSERVE_* variables: where models live.
_KEPT_ENV = frozenset({"FLEETSERVE_HOME"})


def child_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """The parent's environment without its ``FLEETSERVE_*`` options (the child's config says it all)."""
    return {k: v for k, v in environ.items() if not k.startswith(ENV_PREFIX) or k in _KEPT_ENV}


@dataclass(frozen=True)
class Placement:
    """Where one replica runs instead of ``fleet.host``: its listen address and a command prefix that puts the
    process there (e.g. ``ip netns exec NAME``; it must exec the command, keeping the PID)."""

    host: str
    prefix: tuple[str, ...] = ()


@dataclass
class Member:
    name: str
    config: ReplicaConfig | GatewayConfig
    url: str
    ready_path: str
    backoff: Backoff
    prefix: tuple[str, ...] = ()
    process: Child | None = None
    started: float = 0.0
    restarts: int = 0
    ready: bool = False
    retired: bool = False  # asked to stop for good (scaled down): not restarted


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return bool(r.status == 200)
    except OSError:
        return False


class Supervisor:
    """Runs ``replica`` (its ports and threads set per member) ``fleet.replicas`` times and ``gateway`` (its
    backends set to the replicas) in front, unless ``fleet.gateway`` is off. ``placements`` put replica i
    elsewhere than ``fleet.host`` (the fault harness's network namespaces). ``initial`` replicas start with the
    fleet (default ``fleet.replicas``; 0 for an autoscaled fleet, whose gateway then starts with no backends)."""

    def __init__(self, fleet: FleetConfig, replica: ReplicaConfig, gateway: GatewayConfig | None = None, *,
                 log_level: str | None = None, clock: Callable[[], float] = time.monotonic,
                 placements: Mapping[int, Placement] | None = None, launcher: Launcher | None = None,
                 initial: int | None = None, threads: int | None = None) -> None:
        self.config = fleet
        self.clock = clock
        self.launcher = launcher or SpawnLauncher()
        # The children log like the parent was asked to (fleetserve's own loggers' level, and the format).
        self.log_level = log_level or logging.getLevelName(logging.getLogger("fleetserve").getEffectiveLevel()).lower()
        self.log_format = logs.settings()[1]
        self.stopping = False
        self._folder: Path | None = None
        self._replica = replace(replica, threads=replica.threads or threads or fleet.threads_per_replica())
        self._placements = dict(placements or {})
        self.replicas = [self.replica_member(i) for i in range(fleet.replicas if initial is None else initial)]
        self._watchers: dict[str, asyncio.Task[None]] = {}
        if gateway is None:
            gateway = GatewayConfig(backends=(self.replicas[0].url,))
        elif self.replicas:
            gateway = replace(gateway, discovery="static", backends=tuple(m.url for m in self.replicas))
        self.gateway = Member(
            "gateway",
            replace(gateway, host=fleet.host, port=fleet.gateway_port),
            f"http://{fleet.host}:{fleet.gateway_port}",
            # Without replicas yet (autoscaled), the gateway is up once it is live: the actuator adds them.
            "/readyz" if self.replicas else "/healthz",
            Backoff(fleet.backoff_initial_s, fleet.backoff_max_s, fleet.stable_s),
        )

    def replica_member(self, i: int) -> Member:
        """Replica slot ``i``: ports ``base_port + 2i`` (HTTP) and the next (gRPC)."""
        fleet, placement = self.config, self._placements.get(i)
        host = placement.host if placement is not None else fleet.host
        port = fleet.replica_port(i)
        return Member(
            f"replica-{i}",
            replace(self._replica, host=host, port=port, grpc_port=port + 1),
            f"http://{host}:{port}",
            "/v2/health/ready",
            Backoff(fleet.backoff_initial_s, fleet.backoff_max_s, fleet.stable_s),
            placement.prefix if placement is not None else (),
        )

    @property
    def members(self) -> list[Member]:
        return [*self.replicas, self.gateway] if self.config.gateway else list(self.replicas)

    def _config_file(self, m: Member) -> Path:
        """Where ``m``'s config waits for it (and for its restarts) while the fleet runs."""
        if self._folder is None:
            self._folder = Path(tempfile.mkdtemp(prefix="fleetserve-up-"))
        path = self._folder / f"{m.name}.pickle"
        if not path.exists():
            path.write_bytes(pickle.dumps((m.config, self.log_level, self.log_format)))
        return path

    async def _spawn(self, m: Member) -> None:
        m.process = await self.launcher.start(m.prefix, self._config_file(m), child_environ(os.environ))
        m.started = self.clock()
        m.ready = False

    async def _watch(self, m: Member) -> None:
        """Keep ``m`` running: restart it with backoff whenever it exits, until the fleet stops or it is retired."""
        while not self.stopping and not m.retired:
            assert m.process is not None
            code = await m.process.wait()
            if self.stopping or m.retired:
                return
            delay = m.backoff.next_delay(self.clock() - m.started)
            log.warning("%s exited with %s; restarting in %.1f s", m.name, code, delay)
            await asyncio.sleep(delay)
            if self.stopping or m.retired:
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

    async def add_replica(self, i: int) -> Member:
        """Start replica slot ``i`` while the fleet runs, restarted like the others until :meth:`retire`."""
        if any(m.name == f"replica-{i}" for m in self.replicas):
            raise ValueError(f"replica slot {i} is in use")
        m = self.replica_member(i)
        self.replicas.append(m)
        await self._spawn(m)
        self._watchers[m.name] = asyncio.create_task(self._watch(m))
        return m

    async def retire(self, m: Member, timeout_s: float = 30.0) -> int | None:
        """Stop ``m`` for good by SIGTERM (a replica drains: it finishes everything it accepted) and forget it;
        its exit code (None: it was not running)."""
        m.retired = True
        watcher = self._watchers.pop(m.name, None)
        code = None
        if m.process is not None and m.process.returncode is None:
            m.process.send_signal(signal.SIGTERM)
            try:
                code = await asyncio.wait_for(m.process.wait(), timeout=timeout_s)
            except TimeoutError:
                log.warning("%s did not drain within %.0f s; killed", m.name, timeout_s)
                m.process.kill()
                code = await m.process.wait()
        if watcher is not None:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
        if m in self.replicas:
            self.replicas.remove(m)
        if self._folder is not None:
            (self._folder / f"{m.name}.pickle").unlink(missing_ok=True)
        return code

    async def wait_ready(self, stop: asyncio.Event | None = None) -> bool:
        """True once every member is ready; False when ``stop`` is set first (Ctrl-C while starting)."""
        stop = stop or asyncio.Event()
        deadline = self.clock() + self.config.ready_timeout_s
        while self.clock() < deadline:
            await self._poll_ready()
            if all(m.ready for m in self.members):
                return True
            for m in self.members:
                if m.process is not None and m.process.returncode is not None and m.restarts == 0:
                    raise FleetserveError(f"{m.name} exited with {m.process.returncode} during start-up")
            try:
                await asyncio.wait_for(stop.wait(), timeout=0.2)
                return False
            except TimeoutError:
                pass
        raise FleetserveError(f"fleet not ready after {self.config.ready_timeout_s:.0f} s: {self.status_line()}")

    async def stop(self) -> None:
        self.stopping = True
        try:
            await self._stop_members()
        finally:
            if self._folder is not None:
                shutil.rmtree(self._folder, ignore_errors=True)
                self._folder = None

    async def _stop_members(self) -> None:
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

    async def run(self, stop: asyncio.Event, print_status: Callable[[str], None] | None = None,
                  actuator: Callable[[asyncio.Event], Coroutine[Any, Any, None]] | None = None) -> None:
        """Start the fleet, wait until it is ready, keep it running until ``stop``; ``actuator(stop)`` runs
        beside it once the fleet is ready (it adds and retires replicas)."""
        await self.start()
        self._watchers.update({m.name: asyncio.create_task(self._watch(m)) for m in self.members})
        acting: asyncio.Task[None] | None = None
        try:
            if not await self.wait_ready(stop):
                return
            c = self.config
            if c.gateway:
                print(f"fleet ready: gateway {self.gateway.url}  (dashboard {self.gateway.url}/dashboard, "
                      f"metrics {self.gateway.url}/metrics, backends {self.gateway.url}/gateway/backends)",
                      flush=True)
            for m in self.replicas:
                print(f"  {m.name}: {m.url}  grpc {m.config.host}:{int(m.url.rsplit(':', 1)[1]) + 1}", flush=True)
            if actuator is not None:
                acting = asyncio.create_task(actuator(stop))
            while not stop.is_set():
                if acting is not None and acting.done():
                    acting.result()  # an actuator that failed stops the fleet with its error
                try:
                    await asyncio.wait_for(stop.wait(), timeout=c.status_interval_s)
                except TimeoutError:
                    await self._poll_ready()
                    if print_status is not None:
                        print_status(self.status_line())
        finally:
            if acting is not None:
                acting.cancel()
                await asyncio.gather(acting, return_exceptions=True)
            await self.stop()
            watchers = list(self._watchers.values())
            self._watchers.clear()
            for w in watchers:
                w.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)

