"""Helpers the benchmark scripts share: the machine a table was measured on, CPU time from /proc, HTTP
probes and Prometheus scrapes of the servers under test, starting and stopping them, Markdown tables.

Scripts run as ``python benchmarks/NAME.py``, which puts this folder on ``sys.path``: they import it as
``_common``.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

HZ = os.sysconf("SC_CLK_TCK")


def cpu_model() -> str:
    """The processor's marketing name (``/proc/cpuinfo``), for the header of a results table."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def machine() -> str:
    """``CPU model, N cores``: where a table's numbers come from."""
    return f"{cpu_model()}, {os.cpu_count()} cores"


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process so far."""
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(stat[11]) + int(stat[12])) / HZ


def machine_cpu_s() -> float:
    """Busy CPU seconds of the whole machine since boot (every state but idle and iowait)."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(ticks[:8]) - ticks[3] - ticks[4]) / HZ


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """(status, body); an HTTP error status with its body; (0, b"") when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return int(r.status), r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError:
        return 0, b""


def metrics_text(base_url: str, timeout: float = 5.0) -> str:
    """A server's ``/metrics`` page."""
    status, body = http_get(f"{base_url}/metrics", timeout)
    if status != 200:
        raise RuntimeError(f"{base_url}/metrics answered {status or 'nothing'}")
    return body.decode()


def totals(text: str) -> dict[str, float]:
    """Each sample name of a ``/metrics`` page, summed over its label sets."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


def scrape(base_url: str, timeout: float = 5.0) -> dict[str, float]:
    """Each sample name of a server's ``/metrics`` page, summed over its label sets."""
    return totals(metrics_text(base_url, timeout))


def histogram_sums(texts: Sequence[str]) -> dict[str, tuple[float, float]]:
    """(sum, count) of every histogram on some ``/metrics`` pages, added up over the pages, keyed
    ``name{label=value,...}`` without the ``model`` and ``backend`` labels."""
    out: dict[str, list[float]] = {}
    for text in texts:
        for family in text_string_to_metric_families(text):
            if family.type != "histogram":
                continue
            for s in family.samples:
                if s.name.endswith(("_sum", "_count")):
                    labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k not in ("model", "backend"))
                    pair = out.setdefault(f"{family.name}{{{labels}}}", [0.0, 0.0])
                    pair[0 if s.name.endswith("_sum") else 1] += s.value
    return {k: (v[0], v[1]) for k, v in out.items()}


def histogram_means(before: dict[str, tuple[float, float]],
                    after: dict[str, tuple[float, float]]) -> dict[str, float]:
    """Each histogram's mean observation between two :func:`histogram_sums`; those with none in between left out."""
    out = {}
    for key, (s1, c1) in after.items():
        s0, c0 = before.get(key, (0.0, 0.0))
        if c1 > c0:
            out[key] = (s1 - s0) / (c1 - c0)
    return out


class NotReady(RuntimeError):
    """A server under test exited, or did not get ready in time."""


def mean_batch(before: Sequence[dict[str, float]], after: Sequence[dict[str, float]]) -> float | None:
    """Rows per engine call over the replicas between two scrapes: the engine process's calls
    (``fleetserve_engine_batch_size``) for a replica with ``--frontends``, else ``fleetserve_batch_size``."""
    total = {"rows": 0.0, "calls": 0.0}
    for a, b in zip(after, before, strict=True):
        name = "fleetserve_engine_batch_size" if "fleetserve_engine_batch_size_count" in a else "fleetserve_batch_size"
        total["rows"] += a.get(f"{name}_sum", 0) - b.get(f"{name}_sum", 0)
        total["calls"] += a.get(f"{name}_count", 0) - b.get(f"{name}_count", 0)
    return total["rows"] / total["calls"] if total["calls"] else None


def wait_ready(ready: Callable[[], bool], procs: Sequence[subprocess.Popen[Any]], timeout_s: float,
               what: str, poll_s: float = 0.1) -> None:
    """Poll ``ready()`` (an OSError or ValueError counts as not ready) until it holds; raise :class:`NotReady`
    at once when one of ``procs`` exits, or when ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(OSError, ValueError):
            if ready():
                return
        for proc in procs:
            if proc.poll() is not None:
                raise NotReady(f"{what}: {_command(proc)} exited with {proc.returncode}")
        if time.monotonic() >= deadline:
            raise NotReady(f"{what} not ready within {timeout_s:.0f} s")
        time.sleep(poll_s)


def _command(proc: subprocess.Popen[Any]) -> str:
    args = proc.args
    return " ".join(map(str, args)) if isinstance(args, list | tuple) else str(args)


def stop_process(proc: subprocess.Popen[Any], grace_s: float, *, term_group: bool = False,
                 kill_group: bool = False) -> None:
    """SIGTERM, then SIGKILL after ``grace_s``; ``*_group`` sends that signal to the process's session
    (a server started with ``start_new_session=True`` together with its workers)."""
    if proc.poll() is None:
        if term_group:
            os.killpg(proc.pid, signal.SIGTERM)
        else:
            proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        if kill_group:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
        proc.wait()


def nearest_rank(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of non-empty ``values`` by the nearest-rank rule: an observed value, never an
    interpolation between two."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def markdown_table(head: Sequence[str], rows: Sequence[Sequence[str]], align: str | Sequence[str] = "---") -> str:
    """A Markdown table; ``align`` is one separator cell for every column (``---``, ``---:``) or one each."""
    cells = [align] * len(head) if isinstance(align, str) else list(align)
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(cells) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def write_report(out: Path, name: str, rows: Any, table: str) -> None:
    """``rows`` as ``NAME.json`` and ``table`` as ``NAME.md`` under ``out`` (created), and the table printed."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(rows, indent=1))
    (out / f"{name}.md").write_text(table)
    print(table)
