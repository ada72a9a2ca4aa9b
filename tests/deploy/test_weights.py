"""Proxy weights from measured throughput per GPU model (``fleetserve deploy nginx --weights-from``)."""

import json
import re
from pathlib import Path

import pytest

from fleetserve.cli import main
from fleetserve.deploy.weights import report_throughput, weighted_backends
from fleetserve.errors import UsageError


def _report(path: Path, achieved_rps: float, rows: int, ok: int = 100) -> Path:
    """The fields a `fleetserve bench --out` report carries that throughput is read from."""
    path.write_text(json.dumps({"mode": "closed", "achieved_rps": achieved_rps, "ok": ok,
                                "config": {"workload": "v2-binary", "rows": rows}}))
    return path


def _weights(tmp_path: Path, gpu_models: object, backends: object) -> Path:
    path = tmp_path / "weights.json"
    path.write_text(json.dumps({"gpu_models": gpu_models, "backends": backends}))
    return path


def test_a_bench_report_gives_sequences_per_second(tmp_path: Path) -> None:
    assert report_throughput(_report(tmp_path / "r.json", 544.0, rows=32)) == pytest.approx(17408.0)


def test_each_backend_weighs_its_gpu_models_measured_throughput(tmp_path: Path) -> None:
    _report(tmp_path / "h200.json", 544.0, rows=32)  # 17,408 seq/s: BENCHMARKS.md section 5's replica
    path = _weights(tmp_path, {"H200": "h200.json", "L4": 4352},
                    {"http://10.0.0.5:8000": "H200", "http://10.0.0.6:8000": "L4", "http://10.0.0.7:8000": "H200"})
    backends = weighted_backends(path)
    assert [(b.address, b.weight) for b in backends] == [
        ("10.0.0.5:8000", 17408.0), ("10.0.0.6:8000", 4352.0), ("10.0.0.7:8000", 17408.0)]


def test_nginx_config_carries_the_ratio(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _report(tmp_path / "h200.json", 544.0, rows=32)
    path = _weights(tmp_path, {"H200": "h200.json", "L4": 4352},
                    {"http://10.0.0.5:8000": "H200", "http://10.0.0.6:8000": "L4"})
    assert main(["deploy", "nginx", "--weights-from", str(path)]) == 0
    weights = {a: int(w) for a, w in re.findall(r"server (\S+) weight=(\d+)", capsys.readouterr().out)}
    assert weights["10.0.0.5:8000"] == 4 * weights["10.0.0.6:8000"]


@pytest.mark.parametrize(("gpu_models", "backends", "message"), [
    ({"H200": 100}, {"http://a:1": "A100"}, "no measured throughput"),
    ({"H200": 0}, {"http://a:1": "H200"}, "must be positive"),
    ({"H200": True}, {"http://a:1": "H200"}, "sequences per second or a bench report"),
    ({"H200": "missing.json"}, {"http://a:1": "H200"}, "cannot read bench report"),
    ({"H200": "empty.json"}, {"http://a:1": "H200"}, "no successful request"),
    ({"H200": "notreport.json"}, {"http://a:1": "H200"}, "not a `fleetserve bench --out` report"),
    ({"H200": 100}, {}, "needs objects"),
    ({"H200": 100}, {"https://a:1": "H200"}, "only http://"),
])
def test_bad_weights_files_name_the_problem(tmp_path: Path, gpu_models: object, backends: object,
                                            message: str) -> None:
    _report(tmp_path / "empty.json", 0.0, rows=1, ok=0)
    (tmp_path / "notreport.json").write_text("[1, 2]")
    with pytest.raises(UsageError, match=message):
        weighted_backends(_weights(tmp_path, gpu_models, backends))
