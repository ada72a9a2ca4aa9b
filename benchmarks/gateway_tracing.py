"""Gateway CPU per proxied request with tracing off, at sample ratio 0 and 1.0, and with the access log.

Same harness as ``benchmarks/gateway_cpu.py`` (``fleetserve gateway`` as a real process with its defaults and
one worker, pinned to its own CPU; an NGINX upstream answering a fixed 200; ``wrk`` saturating it with ~5 KB
KServe v2 JSON bodies; CPU time of the gateway's process tree from /proc ÷ requests answered), one
gateway per mode:

- ``off``: no tracing, ``--access-log-rate 0`` (the baseline);
- ``ratio-0``: tracing on (``--otlp-endpoint`` at a local OTLP/HTTP sink), ``--trace-sample-ratio 0``: every
  request gets an unsampled root span and passes its trace context on, nothing is recorded or exported;
- ``ratio-1``: every request recorded (request, pick and attempt spans) and exported over OTLP/HTTP by the
  SDK's batch processor: its export thread's CPU counts, and spans beyond its queue (2,048) are dropped;
- ``log-1000``: the access log at its default rate limit (1,000 lines/s) and tracing off;
- ``log-all``: an access-log line for every request (``--access-log-rate 1e9``).

The gateway's stdout (its log lines) goes to a file. The modes run interleaved ``--repeat`` times (the box is
shared: compare within a round); each round's cost relative to that round's ``off`` is reported, with the
range over rounds.

    flock /tmp/fleetserve-bench.lock .venv/bin/python benchmarks/gateway_tracing.py [--duration 8] [--repeat 3] \
        [--server granian|aiohttp]
"""

from __future__ import annotations

import argparse
import contextlib
import http.server
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gateway_cpu import INFER_PATH, Run, UpstreamNginx, cpu_split, measure, request_body

from fleetserve.gateway.config import SERVERS

import _wrk

MODES = {
    "off": "--access-log-rate 0",
    "ratio-0": "--access-log-rate 0 --otlp-endpoint {sink} --trace-sample-ratio 0",
    "ratio-1": "--access-log-rate 0 --otlp-endpoint {sink} --trace-sample-ratio 1",
    "log-1000": "",
    "log-all": "--access-log-rate 1e9",
}


@contextlib.contextmanager
def otlp_sink() -> Iterator[tuple[str, list[int]]]:
    """An OTLP/HTTP endpoint on 127.0.0.1 that accepts every export (and counts its bytes)."""
    received = [0, 0]  # exports, bytes

    class Sink(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received[0] += 1
            received[1] += len(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()
        server.server_close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=8.0, help="measured seconds per run")
    ap.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds of load before each run")
    ap.add_argument("--connections", type=int, default=32, help="requests in flight (wrk connections)")
    ap.add_argument("--body-bytes", type=int, default=5000, help="approximate POST body size")
    ap.add_argument("--repeat", type=int, default=3, help="rounds of every mode, interleaved")
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma list of {','.join(MODES)}")
    ap.add_argument("--server", choices=SERVERS, default="granian", help="the gateway's public server")
    args = ap.parse_args()
    args.baseline, args.variants = None, {}
    modes = [m for m in args.modes.split(",") if m]
    front_cpus, rest = cpu_split()
    if rest is not None:
        os.sched_setaffinity(0, rest)
    body = request_body(args.body_bytes)
    load = os.getloadavg()
    print(f"# gateway CPU with tracing and access logs — {os.cpu_count()} CPUs, front on CPU {front_cpus or 'any'}, "
          f"{args.connections} connections, {args.duration:g} s per run, {time.strftime('%Y-%m-%d %H:%M')}, "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}", flush=True)
    runs: dict[str, list[Run]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory(prefix="fleetserve-gwtrace-") as tmp, UpstreamNginx() as upstream, \
            otlp_sink() as (sink, received):
        script = Path(tmp) / "post.lua"
        script.write_text(_wrk.script(INFER_PATH, [body]))
        for round_ in range(args.repeat):
            for mode in modes:
                args.gateway_args = f"--server {args.server} " + MODES[mode].format(sink=sink)
                exported = received[0]
                run = measure("fleetserve", upstream.url, args, script, front_cpus)
                runs[mode].append(run)
                print(f"round {round_ + 1}: {mode}: {run.rps:.0f} req/s, {run.cpu_us_per_req:.1f} µs CPU/req, "
                      f"p50 {run.p50_ms:.2f} ms, p99 {run.p99_ms:.2f} ms, {run.errors} errors, "
                      f"{received[0] - exported} OTLP exports", flush=True)
    print("\n| mode | req/s (median) | gateway CPU µs/req: median (range) | vs off, same round: median (range) |")
    print("|---|---|---|---|")
    for mode in modes:
        cpu = [r.cpu_us_per_req for r in runs[mode]]
        line = f"| {mode} | {statistics.median(r.rps for r in runs[mode]):.0f} | {statistics.median(cpu):.1f} " \
               f"({min(cpu):.1f}–{max(cpu):.1f}) |"
        if "off" in runs and mode != "off":
            pairs = zip(runs[mode], runs["off"], strict=True)
            rel = [(r.cpu_us_per_req / o.cpu_us_per_req - 1) * 100 for r, o in pairs]
            line += f" {statistics.median(rel):+.1f}% ({min(rel):+.1f}% to {max(rel):+.1f}%) |"
        else:
            line += " — |"
        print(line)
    load = os.getloadavg()
    print(f"\nload average at the end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {received[1] / 1e6:.1f} MB exported")


if __name__ == "__main__":
    main()
