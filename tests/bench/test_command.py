"""``fleetserve bench`` through its command-line surface, against a server in another thread."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from fleetserve import cli
from fleetserve.bench.command import BenchOptions, run
from fleetserve.bench.report import LoadReport
from tests.support.target import TargetServer, refused_url


def parse(*argv: str) -> BenchOptions:
    options: BenchOptions = cli.parse("bench", argv, {})[1]
    return options


def test_bench_prints_writes_json_and_plots(
    threaded_server: TargetServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    plot = ["--plot", str(png)] if importlib.util.find_spec("matplotlib") else []
    args = parse(
        threaded_server.url,
        "--rate",
        "100",
        "--duration",
        "0.5",
        "--arrivals",
        "constant",
        "--workload",
        "v2-binary",
        "--header",
        "X-Tenant: a",
        "--out",
        str(out),
        "--per-second",
        *plot,
    )
    assert run(args) == 0
    report = LoadReport.from_json(json.loads(out.read_text()))
    assert report.ok == 50 and report.config["workload"] == "v2-binary"
    assert threaded_server.seen.headers[0]["X-Tenant"] == "a"
    printed = capsys.readouterr().out
    assert "requests 50" in printed and "p50 ms" in printed
    if plot:
        assert png.read_bytes()[:4] == b"\x89PNG"


def test_no_success_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(parse(refused_url(), "--concurrency", "1", "--duration", "0.2")) == 1
    assert "connect" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ((), "--rate"),
        (("--rate", "0"), "rate"),
        (("--rate", "10", "--header", "no-colon"), "NAME: VALUE"),
        (("--rate", "10", "--long-fraction", "3"), "long_fraction"),
        (("--rate", "10", "--rows", "4"), "v2 workloads"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(
    argv: tuple[str, ...], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["bench", "http://127.0.0.1:1", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_rate_and_concurrency_are_exclusive(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "http://h:1", "--rate", "1", "--concurrency", "1"]) == 2
    assert "exactly one of --rate" in capsys.readouterr().err


def test_plot_without_matplotlib_fails_before_sending(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert cli.main(["bench", refused_url(), "--rate", "10", "--plot", str(tmp_path / "p.png")]) == 2
    assert "matplotlib" in capsys.readouterr().err


def test_rows_tokens_and_outputs_reach_the_workload() -> None:
    args = parse("http://h", "--concurrency", "2", "--workload", "v2-binary", "--rows", "32", "--tokens", "128",
                 "--output", "sentence_embedding")
    workload = args.config().workload_config()
    assert (workload.rows, workload.tokens, workload.outputs) == (32, 128, ("sentence_embedding",))
