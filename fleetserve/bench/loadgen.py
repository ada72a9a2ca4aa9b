"""The load generator: open loop (``rate``) or closed loop (``concurrency``) against one base URL.

Open loop sends each request at its scheduled time (see :mod:`fleetserve.bench.arrivals`) and
measures latency from that time, so a stalled server shows in the tail instead of pausing the
client (no coordinated omission). At most ``max_inflight`` requests are outstanding; a request due
while the bound is reached is counted as a ``dropped`` error, never silently skipped. Closed loop
runs ``concurrency`` workers that each send the next request when the previous one answers; it
reports what such clients see, and under-reports stalls by design.

The run lasts ``warmup_s + duration_s``: requests scheduled during the warmup are sent but not
recorded. After the last send the generator waits for outstanding requests (bounded by
``timeout_s``). ``processes > 1`` splits the load over worker processes and merges their results.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from fleetserve.bench.arrivals import ARRIVALS, RateProfile, arrival_offsets
from fleetserve.bench.client import CLIENTS, ClientConfig, HttpClient, RequestError, client_name, open_client
from fleetserve.bench.recorder import RawResult, Recorder
from fleetserve.bench.report import LoadReport, build_report
from fleetserve.bench.workloads import RANK_CANDIDATES, WORKLOADS, WorkloadConfig, make_payloads
from fleetserve.options import option
from fleetserve.wire import TIMEOUT_HEADER

Clock = Callable[[], float]
# Open loop without max_inflight-many connections: requests beyond this wait for a free connection,
# and that wait is part of their latency (measured from the schedule), so nothing is hidden.
DEFAULT_OPEN_CONNECTIONS = 512
# When the generator falls behind, it still yields to the loop this often so responses are read.
YIELD_EVERY = 32
# Longest single sleep, so a stop request is noticed promptly even at very low rates.
MAX_SLEEP_S = 0.05
# Shortest sleep. Event loop timers have millisecond resolution (epoll_wait, libuv); asked for less,
# asyncio rounds up to 1 ms anyway and uvloop busy-polls, which would steal a core from the server
# under test. So sends are up to ~1 ms late; the report's schedule lag says by how much.
MIN_SLEEP_S = 0.001


@dataclass(frozen=True)
class LoadConfig:
    """One load run. Exactly one of ``rate`` (open loop, requests/s) and ``concurrency`` is set.

    ``max_samples`` caps the latency samples kept (24 bytes each); past the cap a uniform
    subset is kept. ``connections`` defaults to ``concurrency`` (closed loop) or
    ``min(max_inflight, 512)`` (open loop). ``client`` is ``auto``, ``fast`` or ``aiohttp``. ``profile``
    (open loop, set by code) varies the rate over the run: ``rate`` times its multiplier at each moment,
    counted from the start of the warmup."""

    url: str = option("", "base URL of a replica, gateway or proxy, e.g. http://127.0.0.1:8080", positional=True,
                      required=True)
    rate: float | None = option(None, "open loop: requests per second (latency measured from the schedule)",
                                default_text="closed loop")
    concurrency: int | None = option(None, "closed loop: concurrent clients", default_text="open loop")
    duration_s: float = option(10.0, "measured seconds", flag="--duration")
    warmup_s: float = option(0.0, "seconds sent before, not measured", flag="--warmup")
    workload: str = option("texts", "what each request carries", choices=WORKLOADS.keys)
    model: str = option("minilm", "model name for the v2 workloads")
    arrivals: str = option("poisson", "open loop: arrival process", choices=ARRIVALS.keys)
    long_fraction: float = option(0.1, "share of 100-300 token texts (the rest are 5-30 tokens)")
    max_inflight: int = option(4096, "open loop: outstanding requests at most; more are counted as dropped")
    timeout_s: float = option(10.0, "per-request seconds, also sent as the request's deadline "
                              "(X-Fleetserve-Timeout-Ms) unless --headers set one", flag="--timeout")
    seed: int = option(0, "random seed of arrivals and payloads")
    headers: Mapping[str, str] = field(default_factory=dict)
    connections: int | None = option(None, "connection pool size", default_text="concurrency, or min(max-inflight, "
                                     "512) in open loop")
    client: str = option("auto", "HTTP client (auto: fast for http://, aiohttp for https://)",
                         choices=lambda: ["auto", *CLIENTS])
    processes: int = option(1, "worker processes sharing the load (results merged)")
    max_samples: int = option(1_000_000, "latency samples kept (a uniform subset beyond)")
    pool_size: int = 512
    rows: int = option(1, "v2 workloads: sequences per request (e.g. ranking candidates)")
    tokens: int | None = option(None, "v2 workloads: tokens per row", default_text="the length mix")
    outputs: tuple[str, ...] = option((), "v2 workloads: ask for this output only (repeatable)", flag="--output",
                                      metavar="NAME", default_text="all outputs")
    lengths: str = option("search", "v2 workloads without --tokens: length mix (squad: MLPerf BERT-like, max 384)",
                          choices=("search", "squad"))
    candidates: int = option(RANK_CANDIDATES, "rank workload: candidates ranked against each query")
    profile: RateProfile | None = None

    def __post_init__(self) -> None:
        if (self.rate is None) == (self.concurrency is None):
            raise ValueError("set exactly one of --rate (open loop) and --concurrency (closed loop)")
        if self.rate is not None and not self.rate > 0:
            raise ValueError(f"rate must be > 0 requests/s, got {self.rate}")
        if self.profile is not None and self.rate is None:
            raise ValueError("a rate profile needs --rate (open loop): it multiplies the rate")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if not self.duration_s > 0:
            raise ValueError(f"duration_s must be > 0, got {self.duration_s}")
        if self.warmup_s < 0:
            raise ValueError(f"warmup_s must be >= 0, got {self.warmup_s}")
        if self.arrivals not in ARRIVALS:
            raise ValueError(f"unknown arrivals {self.arrivals!r}; choose one of {sorted(ARRIVALS)}")
        if self.max_inflight < 1:
            raise ValueError(f"max_inflight must be >= 1, got {self.max_inflight}")
        if self.processes < 1:
            raise ValueError(f"processes must be >= 1, got {self.processes}")
        if self.concurrency is not None and self.concurrency < self.processes:
            raise ValueError(f"concurrency {self.concurrency} is below processes {self.processes}")
        if self.max_samples < self.processes:
            raise ValueError(f"max_samples must be >= processes, got {self.max_samples}")
        client_name(self.client, self.url)
        self.client_config()
        self.workload_config()

    @property
    def mode(self) -> str:
        return "open" if self.rate is not None else "closed"

    def client_config(self) -> ClientConfig:
        if self.connections is not None:
            connections = self.connections
        elif self.concurrency is not None:
            connections = self.concurrency
        else:
            connections = min(self.max_inflight, DEFAULT_OPEN_CONNECTIONS)
        # The client's deadline travels with each request, as a real client's would: a gateway in front
        # splits it over retries, a replica drops work that outlives it.
        headers = dict(self.headers)
        if all(name.lower() != TIMEOUT_HEADER.lower() for name in headers):
            headers[TIMEOUT_HEADER] = str(max(1, round(self.timeout_s * 1000)))
        return ClientConfig(self.url, connections, self.timeout_s, headers)

    def workload_config(self) -> WorkloadConfig:
        return WorkloadConfig(
            self.workload, self.model, self.long_fraction, self.pool_size, self.rows, self.tokens, self.outputs,
            self.lengths, self.candidates,
        )

    def split(self) -> list[LoadConfig]:
        """One config per process: the load, bounds and sample cap shared out, seeds distinct."""
        n = self.processes

        def share(total: int, i: int) -> int:
            return total // n + (1 if i < total % n else 0)

        conns = self.client_config().connections
        return [
            replace(
                self,
                rate=None if self.rate is None else self.rate / n,
                concurrency=None if self.concurrency is None else share(self.concurrency, i),
                max_inflight=max(1, share(self.max_inflight, i)),
                connections=max(1, share(conns, i)),
                max_samples=share(self.max_samples, i),
                seed=self.seed * 1_000_003 + i,
                processes=1,
            )
            for i in range(n)
        ]

    def to_json(self) -> dict[str, Any]:
        """The config as recorded in reports; header values are redacted (they may be credentials)."""
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["headers"] = {k: "<redacted>" for k in self.headers}
        d["profile"] = None if self.profile is None else [list(p) for p in self.profile.points]
        d["connections"] = self.client_config().connections
        d["client"] = client_name(self.client, self.url)
        return d


class _Run:
    def __init__(
        self,
        config: LoadConfig,
        client: HttpClient,
        prepared: list[object],
        recorder: Recorder,
        clock: Clock,
        stop: asyncio.Event,
    ) -> None:
        self._config = config
        self._client = client
        self._prepared = prepared
        self._rec = recorder
        self._clock = clock
        self._stop = stop
        self._next = 0
        self._inflight = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._failure: BaseException | None = None
        self.stopped_at: float | None = None

    def _payload(self) -> object:
        raw = self._prepared[self._next % len(self._prepared)]
        self._next += 1
        return raw

    def _stopping(self) -> bool:
        if not self._stop.is_set():
            return False
        if self.stopped_at is None:
            self.stopped_at = self._clock()
        return True

    def watch_stop(self) -> asyncio.Task[None]:
        """Note when a stop is requested, even while every worker waits on a slow response."""

        async def watch() -> None:
            await self._stop.wait()
            self._stopping()

        return asyncio.create_task(watch())

    async def _exchange(self, raw: object, begin: float, sent: float, window: float, measured: bool) -> None:
        """Send one request at ``sent``; its latency runs from ``begin`` (the scheduled time in open loop)."""
        try:
            status = await self._client.send(raw)
        except RequestError as exc:
            if measured:
                self._rec.record_error(exc.kind, self._clock() - window)
            return
        if measured:
            done = self._clock()
            if 200 <= status < 300:
                self._rec.record_ok(done - window, done - begin, done - sent)
            else:
                self._rec.record_error(f"http_{status}", done - window)

    async def _scheduled(self, raw: object, scheduled: float, window: float, measured: bool) -> None:
        try:
            sent = self._clock()
            if measured:
                self._rec.record_sent(scheduled - window, sent - scheduled)
            await self._exchange(raw, scheduled, sent, window, measured)
        finally:
            self._inflight -= 1

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None and self._failure is None:
            self._failure = task.exception()

    async def open_loop(self, start: float, window: float, end: float) -> None:
        assert self._config.rate is not None
        rng = random.Random(f"arrivals-{self._config.seed}")
        burst = 0
        profile = self._config.profile
        offsets = (arrival_offsets(self._config.arrivals, self._config.rate, rng) if profile is None
                   else profile.offsets(self._config.arrivals, self._config.rate, rng))
        for offset in offsets:
            due = start + offset
            if due >= end:
                return
            while (now := self._clock()) < due:
                burst = 0
                await asyncio.sleep(min(max(due - now, MIN_SLEEP_S), MAX_SLEEP_S))
                if self._stopping():
                    return
            if burst >= YIELD_EVERY:
                burst = 0
                await asyncio.sleep(0)
            if self._stopping():
                return
            burst += 1
            measured = due >= window
            if self._inflight >= self._config.max_inflight:
                if measured:
                    self._rec.record_dropped(due - window)
                continue
            self._inflight += 1
            task = asyncio.create_task(self._scheduled(self._payload(), due, window, measured))
            self._tasks.add(task)
            task.add_done_callback(self._task_done)

    async def _worker(self, window: float, end: float) -> None:
        while not self._stopping():
            begin = self._clock()
            if begin >= end:
                return
            measured = begin >= window
            if measured:
                self._rec.record_sent(begin - window)
            await self._exchange(self._payload(), begin, begin, window, measured)

    async def closed_loop(self, window: float, end: float) -> None:
        assert self._config.concurrency is not None
        for _ in range(self._config.concurrency):
            task = asyncio.create_task(self._worker(window, end))
            self._tasks.add(task)
            task.add_done_callback(self._task_done)

    async def drain(self) -> None:
        """Wait for every outstanding request (each bounded by the client timeout)."""
        while self._tasks:
            await asyncio.wait(list(self._tasks))
        if self._failure is not None:
            raise self._failure

    async def cancel(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def collect(
    config: LoadConfig,
    *,
    stop: asyncio.Event | None = None,
    clock: Clock = time.monotonic,
    start_at: float | None = None,
) -> RawResult:
    """Run the load in this process and return the raw result; ``start_at`` (a ``clock`` time) lets
    several processes share one measurement window."""
    rng = random.Random(config.seed)
    payloads = make_payloads(config.workload_config(), random.Random(rng.getrandbits(64)))
    recorder = Recorder(config.max_samples, random.Random(rng.getrandbits(64)))
    client = await open_client(config.client, config.client_config())
    run = _Run(config, client, [client.prepare(p) for p in payloads], recorder, clock, stop or asyncio.Event())
    cpu_start = time.process_time()
    watcher = run.watch_stop()
    try:
        if start_at is not None and start_at > clock():
            await asyncio.sleep(start_at - clock())
        start = clock()
        window = start + config.warmup_s
        end = window + config.duration_s
        if config.rate is not None:
            await run.open_loop(start, window, end)
        else:
            await run.closed_loop(window, end)
        await run.drain()
    finally:
        watcher.cancel()
        await run.cancel()
        await client.close()
    stopped = min(end, run.stopped_at) if run.stopped_at is not None else end
    return recorder.result(max(0.0, stopped - window), time.process_time() - cpu_start)


async def run_load(
    config: LoadConfig, *, stop: asyncio.Event | None = None, clock: Clock = time.monotonic
) -> LoadReport:
    """Run one load test and report it. Setting ``stop`` ends the sending early; outstanding
    requests still complete and the measured window ends where the stop was noticed."""
    began = clock()
    if config.processes > 1:
        # Imported here: the processes module builds on this one.
        from fleetserve.bench.processes import collect_in_processes

        raw = await collect_in_processes(config, stop=stop)
    else:
        raw = await collect(config, stop=stop, clock=clock)
    return build_report(
        raw,
        mode=config.mode,
        config=config.to_json(),
        target_rps=config.rate,
        elapsed_s=clock() - began,
        processes=config.processes,
    )
