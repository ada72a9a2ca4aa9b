"""``wrk`` (the Debian package; C, one event loop per thread) as a closed-loop load generator for the scripts.

:func:`script` writes a Lua script that posts a pool of bodies in turn (each thread starting at another place
in the pool) and prints one ``RESULT`` line of JSON when done; :func:`run` runs one bounded ``wrk`` with it and
returns that line. Against one replica on the 2-core box (the search mix, 16 in flight, 6 s, twice), wrk spent
45-50 µs of CPU per request where ``fleetserve bench`` (Python) spent 190-214 (its start-up included); on a host
whose cores the servers under test share, that is CPU left to them, and its event loops' waits are left out of
the latencies. (On a 16-core GPU host it served the same single-text fleet no faster: BENCHMARKS.md §10.15.)

Scripts run as ``python benchmarks/NAME.py``, which puts this folder on ``sys.path``: they import it as ``_wrk``.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from pathlib import Path

_LUA = """\
wrk.method = "POST"
wrk.path = "{path}"
wrk.headers["Content-Type"] = "{content_type}"
local bodies = {{
{bodies}
}}
local n, i, threads = #bodies, 0, 0
function setup(thread)
  thread:set("id", threads)
  threads = threads + 1
end
function init(args)
  i = ((id or 0) * 7919) % n
end
function request()
  i = i % n + 1
  return wrk.format(nil, nil, nil, bodies[i])
end
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '\\nRESULT {{"requests":%d,"duration_us":%d,"p50_us":%d,"p90_us":%d,"p99_us":%d,"mean_us":%.1f,"max_us":%d,' ..
    '"socket_errors":%d,"status_errors":%d}}\\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.mean, latency.max, e.connect + e.read + e.write + e.timeout, e.status))
end
"""


def script(path: str, bodies: Sequence[bytes], content_type: str = "application/json") -> str:
    """The Lua script posting ``bodies`` (ASCII, e.g. JSON) to ``path`` in turn."""
    if not bodies:
        raise ValueError("wrk script: no bodies")
    quoted = []
    for body in bodies:
        text = body.decode("ascii")
        if "]==]" in text:
            raise ValueError("wrk script: a body holds the Lua long-string terminator ]==]")
        quoted.append(f"  [==[{text}]==],")
    return _LUA.format(path=path, content_type=content_type, bodies="\n".join(quoted))


def seconds(duration_s: float) -> int:
    """A duration as wrk takes it: whole seconds, at least one."""
    return max(1, round(duration_s))


def run(url: str, script_path: Path, connections: int, duration_s: float, threads: int = 1,
        timeout_s: float = 5.0, wrk: str = "wrk") -> dict[str, float]:
    """One bounded run of ``connections`` keep-alive connections over ``threads`` threads against ``url`` (the
    script sets the path) for ``duration_s`` rounded to whole seconds, the finest wrk takes; the ``RESULT``
    line as a dict (times in µs)."""
    argv = [wrk, f"-t{threads}", f"-c{max(connections, threads)}", f"-d{seconds(duration_s)}s", "--timeout",
            f"{seconds(timeout_s)}s", "-s", str(script_path), url]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=duration_s + 30, check=True).stdout
    line = next((ln for ln in out.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"wrk printed no result:\n{out}")
    result: dict[str, float] = json.loads(line.removeprefix("RESULT "))
    return result
