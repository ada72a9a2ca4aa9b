"""``fleetserve profile`` and ``fleetserve plan`` end to end: the real engine, real processes, the real CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleetserve.cli import main
from fleetserve.sim.profile import Profile
from tests.sim.support import linear_profile


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fleetserve.cli", *args], capture_output=True, text=True,
                          timeout=600, env=os.environ.copy())


def test_profile_measures_the_tiny_engine_and_a_real_replica_and_gateway(tmp_path: Path) -> None:
    out = tmp_path / "tiny.json"
    done = _cli("profile", "tiny", "--out", str(out), "--batch-sizes", "1,4", "--seq-lengths", "16,64",
                "--repeats", "3", "--budget-s", "0.05", "--cost-duration-s", "1", "--cost-per-hour", "0.5")
    assert done.returncode == 0, done.stderr
    profile = Profile.load(out)
    assert profile.batch_sizes == (1, 4) and profile.seq_lengths == (16, 64)
    assert all(t.n == 3 and t.mean_s > 0 for row in profile.service for t in row)
    assert all(t.idle_mean_s is not None and t.idle_mean_s > 0 for row in profile.service for t in row)
    # Real processes answered: CPU per request and a cold start were measured, not defaulted.
    assert 0 < profile.replica_cpu_s < 0.1 and 0 < profile.gateway_cpu_s < 0.1
    assert profile.replica_busy_cpu_s is not None and 0 < profile.replica_busy_cpu_s < 0.1
    assert profile.gateway_busy_cpu_s is not None and 0 < profile.gateway_busy_cpu_s < 0.1
    for curve, one, busy in ((profile.replica_cpu_curve, profile.replica_cpu_s, profile.replica_busy_cpu_s),
                             (profile.gateway_cpu_curve, profile.gateway_cpu_s, profile.gateway_busy_cpu_s)):
        assert [k for k, _ in curve] == [1, 2, 4, 8, 16] and curve[0][1] == one and curve[-1][1] == busy
    # Wall times at low load hold the CPU and more (the client, loopback, wake-ups), well under a second.
    assert profile.replica_cpu_s <= profile.replica_wall_s < 1 and profile.gateway_cpu_s <= profile.gateway_wall_s < 1
    assert 0 <= profile.timer_lag_s < 1
    # The replica's own engine calls at low load against the table's timing of the same texts: measured, not 1.0
    # (0.80-0.84 on a quiet 2-core box; a loaded one moves both sides, so only a wrong unit falls outside).
    assert 0.05 < profile.served_factor < 20 and profile.served_factor != 1.0
    assert profile.cold_start_s is not None and profile.cold_start_s > 0
    assert profile.cost_per_hour == 0.5 and profile.derived_from is None
    # The benchmark's text mix through tiny's tokenizer (its small vocabulary splits many words into pieces).
    assert len(profile.lengths.values) > 10 and 5 < profile.lengths.mean() <= 512
    assert profile.command.startswith("fleetserve profile tiny")


def test_profile_without_costs_and_a_bad_model(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    done = _cli("profile", "tiny", "--out", str(out), "--batch-sizes", "1", "--seq-lengths", "16", "--repeats", "1",
                "--no-costs")
    assert done.returncode == 0, done.stderr
    assert Profile.load(out).cold_start_s is None
    bad = _cli("profile", "no-such-model", "--out", str(out))
    assert bad.returncode == 2 and "no-such-model" in bad.stderr and "Traceback" not in bad.stderr


def test_plan_prints_a_table_and_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    linear_profile(base_s=0.001, cv=0.2, name="gpu-a").save(a)
    linear_profile(base_s=0.0005, cv=0.2, name="gpu-b").save(b)
    out = tmp_path / "plan.json"
    code = main(["plan", "--profile", str(a), "--profile", str(b), "--qps", "1500", "--slo-p99-ms", "20",
                 "--requests", "5000", "--cost-per-hour", "2", "--cost-per-hour", "3", "--policies",
                 "round-robin,p2c-peak-ewma", "--gateway-workers", "1", "--out", str(out), "--quiet"])
    assert code == 0
    text = capsys.readouterr().out
    assert "| gpu-a |" in text and "| gpu-b |" in text and "weights for a weighted front end" in text
    report = json.loads(out.read_text())
    assert report["qps"] == 1500 and report["slo_p99_ms"] == 20
    best = {p["name"]: p["best"] for p in report["profiles"]}
    assert best["gpu-b"]["replicas"] <= best["gpu-a"]["replicas"]
    assert all(p["best"]["latency_ms"]["p99"] <= 20 for p in report["profiles"])
    assert report["weights"]["gpu-b"] > report["weights"]["gpu-a"]


def test_plan_draws_latency_against_load(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    a = tmp_path / "a.json"
    linear_profile(base_s=0.001, name="gpu").save(a)
    code = main(["plan", "--profile", str(a), "--qps", "800", "--slo-p99-ms", "20", "--requests", "3000",
                 "--policies", "round-robin", "--gateway-workers", "1", "--plot", str(tmp_path / "plots"), "--quiet"])
    assert code == 0
    pngs = list((tmp_path / "plots").glob("*.png"))
    assert len(pngs) == 1 and pngs[0].read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("args", [
    ["--qps", "100", "--slo-p99-ms", "50"],  # no profile
    ["--profile", "missing.json", "--qps", "100", "--slo-p99-ms", "50"],
    ["--profile", "PROFILE", "--qps", "100", "--slo-p99-ms", "50", "--policies", "fastest"],
    ["--profile", "PROFILE", "--qps", "100", "--slo-p99-ms", "50", "--cost-per-hour", "1", "--cost-per-hour", "2"],
    ["--profile", "PROFILE", "--qps", "-5", "--slo-p99-ms", "50"],
    ["--profile", "PROFILE", "--qps", "100", "--slo-p99-ms", "50", "--fault", "melt:1%"],
])
def test_plan_mistakes_are_one_line_and_exit_2(tmp_path: Path, args: list[str],
                                               capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "p.json"
    linear_profile().save(good)
    try:
        code = main(["plan", *[str(good) if a == "PROFILE" else a for a in args]])
    except SystemExit as exc:  # argparse's own errors (missing or malformed flags)
        code = int(exc.code or 0)
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err and "Traceback" not in err
