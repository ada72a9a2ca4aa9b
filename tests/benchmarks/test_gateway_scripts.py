"""The gateway CPU benchmarks run end to end for a second per front (real gateway, NGINX upstream, wrk), so that
a change to what they share cannot break one unseen: ``gateway_tracing.py`` once stopped at its first run
because ``gateway_cpu.front()`` had started reading an option it did not set. Nothing here judges a figure.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"

pytestmark = pytest.mark.skipif(shutil.which("wrk") is None or shutil.which("nginx") is None,
                                reason="the gateway benchmarks need wrk and nginx (make setup installs them)")


def run(script: str, *argv: str) -> str:
    done = subprocess.run([sys.executable, str(BENCHMARKS / script), *argv], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done.stdout


def test_gateway_cpu_alternating_reports_paired_ratios() -> None:
    out = run("gateway_cpu.py", "--alternate", "--fronts", "fleetserve", "--variant", "aiohttp=--server aiohttp",
              "--repeat", "2", "--duration", "1", "--warmup", "1")
    assert "| fleetserve:aiohttp | 2 |" in out and "CPU ÷ first front's" in out
    assert "round 2: fleetserve:aiohttp:" in out and " 0 errors" in out


def test_gateway_tracing_runs_each_mode() -> None:
    out = run("gateway_tracing.py", "--modes", "off,ratio-0", "--repeat", "1", "--duration", "1", "--warmup", "1",
              "--server", "aiohttp")
    assert "round 1: off:" in out and "round 1: ratio-0:" in out and "| ratio-0 |" in out
