"""The GPU benchmark scripts' non-GPU parts (arguments, plans, reports) on CPU, so they cannot rot unseen.

Each script runs on the GPU machine only now and then; a renamed helper (``ShapeProfile.seq_bucket``) once
crashed a run there. Here each is imported, its arguments parsed, and its report written from a result of
the shape the GPU run produces.
"""

from __future__ import annotations

import importlib
import subprocess
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def script(name: str) -> ModuleType:
    return importlib.import_module(name)


def point(**extra: object) -> dict[str, object]:
    return {"command": "fleetserve bench http://x --concurrency 8", "concurrency": 8, "req_per_s": 1000.0,
            "seq_per_s": 32000.0, "p50_ms": 5.0, "p99_ms": 9.0, "errors": 0, "gpu_util": 0.9, "gpu_util_min": 0.85,
            "replica_gpu_gauge": 0.9, "mean_batch_rows": 64.0, "replica_cores": 1.0, "gateway_cores": 0.5,
            "bench_cores": 0.5, "machine_cores": 2.0, **extra}


def test_gpu_server_raw_phase_replays_the_bucket_the_engine_uses_and_reuses_the_home(tmp_path: Path) -> None:
    gs = script("gpu_server")
    cfg, _ = gs.parse_args(["--home", str(tmp_path), "--out", str(tmp_path)])
    assert gs.graph_seq(cfg) == 128
    assert gs.graph_seq(gs.parse_args(["--cpu-smoke"])[0]) == 32
    buckets, _ = gs.parse_args(["--seq-buckets", "32,96"])
    assert gs.graph_seq(gs.replace(buckets, tokens=40)) == 96 and gs.graph_seq(buckets) == 128
    assert buckets.engine_args()[-2:] == ["--seq-buckets", "32,96"]
    child = gs.raw_argv(cfg, ["--model", "minilm"])
    assert child[child.index("--home") + 1] == str(tmp_path) and "--raw" in child and "minilm" in child
    texts, _ = gs.parse_args(["--workload", "texts", "--phases", "fleet", "--gateway-workers", "6",
                              "--serve-args", "--max-delay-ms 4 --promote-overdue"])
    assert texts.rows == 1 and texts.phases == ("fleet",) and texts.gateway_workers == 6
    assert texts.serve_args == ("--max-delay-ms", "4", "--promote-overdue")
    rank, _ = gs.parse_args(["--workload", "rank", "--candidates", "20"])
    assert rank.rows == 21 and rank.candidates == 20
    with pytest.raises(ValueError, match="unknown phases"):
        gs.parse_args(["--phases", "warp"])


def test_gpu_server_report_has_percent_of_raw(tmp_path: Path) -> None:
    gs = script("gpu_server")
    cfg, _ = gs.parse_args(["--home", str(tmp_path), "--out", str(tmp_path)])
    results = {"gpu": "NVIDIA H200", "config": gs.asdict(cfg), "elapsed_s": 100.0,
               "build": {"command": "fleetserve build bert-base", "ok": True},
               "raw": {"infer_embedding_only_seq_per_s": 64000.0},
               "replica": [{"instances": 2, **point()}, {"instances": 4, "concurrency": 64, "skipped": "out of time"}],
               "fleet": [{"replicas": 2, "gateway_workers": 2, "gateway": "gateway --workers 2", **point()}]}
    text = gs.markdown(results)
    assert "| 2 | 8 | 1,000 | 32,000 | 50 | 5.0 | 9.0 |" in text
    assert "| out of time |" in text and "fleetserve gateway --workers 2" in text


def test_gpu_server_times_each_stage_of_the_path_from_the_servers_histograms() -> None:
    gs = script("gpu_server")
    def page(gateway: tuple[float, float], replica: tuple[float, float], front_end: tuple[float, float]) -> str:
        """A /metrics page in the exposition format: the gateway's histogram and the replica's, by stage."""
        return "\n".join([
            "# TYPE fleetserve_gateway_request_duration_seconds histogram",
            f"fleetserve_gateway_request_duration_seconds_sum {gateway[0]}",
            f"fleetserve_gateway_request_duration_seconds_count {gateway[1]}",
            "# TYPE fleetserve_request_duration_seconds histogram",
            f'fleetserve_request_duration_seconds_sum{{model="m",stage="total"}} {replica[0]}',
            f'fleetserve_request_duration_seconds_count{{model="m",stage="total"}} {replica[1]}',
            f'fleetserve_request_duration_seconds_sum{{model="m",stage="queue"}} {front_end[0]}',
            f'fleetserve_request_duration_seconds_count{{model="m",stage="queue"}} {front_end[1]}', ""])

    before = {"gateway": [page((1.0, 100.0), (0, 0), (0, 0))],
              "replica": [page((0, 0), (5.0, 1000.0), (1.0, 1000.0)), page((0, 0), (0, 0), (0, 0))]}
    after = {"gateway": [page((4.0, 400.0), (0, 0), (0, 0))],  # two replicas' pages add up
             "replica": [page((0, 0), (6.0, 1200.0), (1.0, 1000.0)), page((0, 0), (1.0, 200.0), (0, 0))]}
    stages = gs.stage_means_ms(before, after)
    assert stages["gateway"] == pytest.approx(10.0) and stages["replica"] == pytest.approx(5.0)
    assert stages["upstream"] is None and stages["engine queue"] is None
    assert stages["batch queue"] is None  # nothing observed in between
    row = {"replicas": 1, "gateway_workers": 2, **point(mean_ms=12.5, stage_ms=stages,
                                                        busiest_threads={"gateway": [["python (main)", 0.97]]})}
    text = gs.markdown({"gpu": "NVIDIA H200", "config": gs.asdict(gs.parse_args([])[0]), "build": {},
                        "raw": {}, "replica": [], "fleet": [row]})
    assert "| fleet | 1 | 8 | 12.50 | 10.00 |  | 5.00 |" in text and "gateway: python (main) 0.97 |" in text


def test_mean_batch_reads_the_engine_process_of_a_replica_with_front_ends() -> None:
    common = script("_common")
    plain = [{"fleetserve_batch_size_sum": 10.0, "fleetserve_batch_size_count": 5.0}]
    fronted = [{"fleetserve_batch_size_sum": 40.0, "fleetserve_batch_size_count": 20.0,
                "fleetserve_engine_batch_size_sum": 40.0, "fleetserve_engine_batch_size_count": 4.0}]
    assert common.mean_batch([{}], plain) == 2.0
    assert common.mean_batch([{}], fronted) == 10.0
    assert common.mean_batch(plain, plain) is None
    assert common.mean_batch(plain, [{"fleetserve_batch_size_sum": 50.0, "fleetserve_batch_size_count": 10.0}]) == 8.0
    gm = script("gpu_mlperf")
    assert gm.parse_args(["--server-frontends", "4"]).server_frontends == 4


def test_gpu_engine_script_parses_and_reports() -> None:
    pytest.importorskip("torch")
    gpu = script("gpu")
    args = gpu.parse_args(["--models", "bert-base", "--engines", "fp8,bert-base/fp8:ffn1=triton", "--batches", "128"])
    assert gpu.engines_for("bert-base", args.engines) == ["fp8", "fp8:ffn1=triton"]
    assert gpu.engines_for("minilm", args.engines) == ["fp8"]
    assert gpu.summary([9.0] + [1.0] * 99, 4) == {"median_ms": 1.0, "p99_ms": 9.0, "seq_per_s": 4000.0, "runs": 100}
    timing = {"median_ms": 5.0, "p99_ms": 5.5, "seq_per_s": 25600.0}
    cos = {"mean_cosine": 0.998, "min_cosine": 0.997}
    result = {"gpu": "NVIDIA H200", "torch": "2.11", "cuda": "13.0", "seq": 128, "nvml_idle": [],
              "models": {"bert-base": {"eager_attention": "sdpa", "eager": {}, "engines": {
                  "fp8": {"rows": {128: {"graph": timing, "infer": timing}}, "accuracy_heldout": cos,
                          "accuracy_bench": cos, "build_s": 3.3, "load_and_capture_s": 0.1},
                  "bf16": {"error": "RuntimeError: no"}}}}}
    text = gpu.render(result)
    assert "| torch-cuda fp8 | 128 | 5.000 | 5.500 | 25,600 |" in text and "bf16: FAILED RuntimeError: no" in text


def test_gpu_fleet_counts_efficiency_and_verdict() -> None:
    gf = script("gpu_fleet")
    assert gf.gpu_counts(8, ()) == [1, 2, 4, 8] and gf.gpu_counts(1, ()) == [1] and gf.gpu_counts(0, ()) == [1]
    assert gf.gpu_counts(4, (2, 8)) == [2]
    assert gf.efficiency({1: 100.0, 2: 190.0, 4: 360.0}) == {1: 1.0, 2: 0.95, 4: 0.9}
    fc = gf.parse_args(["--gpus", "1,2", "--phases", "throttle"])
    assert fc.gpus == (1, 2) and fc.phases == ("throttle",) and fc.server.model == "bert-base"
    with pytest.raises(ValueError, match="shorter than its period"):
        gf.FleetConfig(stop_ms=100.0)
    throttle = [{"phase": "healthy", "replicas": 2, "gpus": 1, **point(rate=500.0)},
                {"phase": "stalled", "replicas": 2, "gpus": 1, **point(rate=500.0, p99_ms=18.0)}]
    assert "2.00 (goal <= 1.5)" in gf.throttle_verdict(throttle) and "not met" in gf.throttle_verdict(throttle)
    scale = [{"gpus": 1, "workload": "v2-binary", "gateway_workers": 4, **point()},
             {"gpus": 2, "workload": "v2-binary", "gateway_workers": 6, **point(seq_per_s=60800.0)}]
    results = {"gpu": "NVIDIA H200", "gpus_present": 2, "config": gf.asdict(fc), "scale": scale,
               "throttle": throttle, "efficiency": {"v2-binary": gf.efficiency({1: 32000.0, 2: 60800.0})}}
    text = gf.markdown(results)
    assert "| 2 | v2-binary | 6 | 8 | 1,000 | 60,800 | 0.95 |" in text and "| stalled | 2 | 1 | 500 |" in text


def test_gpu_mlperf_plans_padded_batches_and_reports_against_mlperf() -> None:
    gm = script("gpu_mlperf")
    lengths = gm.sample_lengths(1000)
    plan = gm.plan_batches(lengths, 128, (64, 128, 256, 384))
    assert sum(rows for rows, _ in plan) == 1000 and all(rows <= 128 for rows, _ in plan)
    assert [seq for _, seq in plan] == sorted(seq for _, seq in plan) and plan[-1][1] == 384
    assert gm.padded_tokens(plan) >= sum(lengths)
    cfg = gm.parse_args(["--rates", "1000,2000", "--precisions", "fp16", "--server-fleets", "3x2,1x1"])
    assert cfg.rates == (1000.0, 2000.0) and cfg.precisions == ("fp16",) and cfg.max_seq == 384
    assert cfg.server_fleets == ((3, 2), (1, 1))
    with pytest.raises(SystemExit):
        gm.parse_args(["--server-fleets", "three"])
    with pytest.raises(ValueError, match="largest sequence bucket"):
        gm.RunConfig(seq_buckets=(64, 128))
    server = [{"replicas": 3, "instances": 2, "rate": 1000.0, "achieved": 999.0, "errors": 0, "p50_ms": 20.0,
               "p99_ms": 60.0},
              {"replicas": 3, "instances": 2, "rate": 2000.0, "achieved": 1990.0, "errors": 0, "p50_ms": 90.0,
               "p99_ms": 300.0}]
    assert gm.server_result(server, 130.0) == 999.0
    offline = [{"precision": "fp16", "samples_per_s": 8100.0, "mean_tokens": 185.0, "padding_overhead": 0.1,
                "accuracy": {"mean_cosine": 0.9991}}, {"precision": "fp8", "error": "RuntimeError: no"},
               {"precision": "fp8:attention=triton", "samples_per_s": 9200.0, "mean_tokens": 185.0,
                "padding_overhead": 0.1, "accuracy": {"mean_cosine": 0.992}}]
    text = gm.markdown({"gpu": "NVIDIA H200", "config": gm.asdict(cfg), "offline": offline, "server": server})
    assert "| fp16 | 8,100 | 185 | 10% | 0.9991 | 7,940 |" in text and "| fp8 | failed: RuntimeError: no" in text
    assert "| fp8:attention=triton | 9,200 | 185 | 10% | 0.9920 | 9,081 |" in text  # an option keeps its tier
    assert "| 3 x 2 | 1,000 | 999 | 20.0 | 60.0 | 0 | yes |  |  |  |  |" in text
    assert "server result: 999 samples/s within the bound (MLPerf v4.0 one H100: 6,096)" in text
    only_offline = gm.asdict(gm.parse_args(["--phases", "offline"]))
    text = gm.markdown({"gpu": "NVIDIA H200", "config": only_offline, "offline": offline, "server": []})
    assert "| fp16 | 8,100 |" in text and "server" not in text  # a phase not run gets no table and no verdict


def test_gpu_prepare_pins_the_installed_versions_and_writes_an_env_script(tmp_path: Path) -> None:
    gp = script("gpu_prepare")
    pins = gp.pinned(("numpy", "aiohttp"))
    assert all("==" in p for p in pins) and pins[0].startswith("numpy==")
    args = gp.parse_args(["--dest", str(tmp_path / "carry"), "--no-weights"])
    assert args.no_weights and args.python == "3.12" and args.limit_mib == 64.0
    env = gp.ENV_SH.format(dest=".gpu-carry")
    assert 'ln -sfn "$(pwd)" "$C/src"' in env and 'PYTHONPATH="$C/src:' in env
    assert gp.tracked_bytes(BENCHMARKS.parent) > 0
    assert gp.parse_args(["--without", "pytest,pluggy"]).without == {"pytest", "pluggy"}
    with pytest.raises(SystemExit, match="not among the wheels: numpy"):
        gp.main(["--dest", str(tmp_path / "carry"), "--without", "pytest,numpy"])


def test_gpu_prepare_carries_the_package_at_another_revision_for_gpu_server_to_run_from(tmp_path: Path) -> None:
    gp, gs = script("gpu_prepare"), script("gpu_server")
    gp.copy_revision(tmp_path / "trees", "before=HEAD")
    (tmp_path / "trees" / "before").mkdir()  # what env.sh does on the GPU machine
    subprocess.run(["tar", "-xzf", str(tmp_path / "trees" / "before.tar.gz"), "-C", str(tmp_path / "trees" / "before")],
                   check=True)
    assert (tmp_path / "trees" / "before" / "fleetserve" / "replica" / "engine_link.py").is_file()
    assert not (tmp_path / "trees" / "before" / "benchmarks").exists()
    assert gp.parse_args(["--tree", "a=HEAD", "--tree", "b=HEAD~0"]).tree == ["a=HEAD", "b=HEAD~0"]
    with pytest.raises(SystemExit, match="is not a commit"):
        gp.copy_revision(tmp_path / "trees", "x=no-such-revision")
    with pytest.raises(SystemExit, match="NAME=REV"):
        gp.copy_revision(tmp_path / "trees", "HEAD")
    cfg, _ = gs.parse_args(["--tree", str(tmp_path / "trees" / "before")])
    assert cfg.tree == str((tmp_path / "trees" / "before").resolve())
    with pytest.raises(SystemExit) as bad:
        gs.parse_args(["--tree", str(tmp_path)])  # no fleetserve/ there
    assert bad.value.code == 2


def test_gpu_ffn1_parses_shapes_and_marks_the_fastest_kernel() -> None:
    gf = script("gpu_ffn1")
    args = gf.parse_args(["--rows", "1024,16384", "--shapes", "3072x768"])
    assert args.rows == (1024, 16384) and args.shapes == ((3072, 768),)
    with pytest.raises(SystemExit):
        gf.parse_args(["--shapes", "3072by768"])
    table = gf.render([{"m": 16384, "n": 3072, "k": 768,
                        "us": {"cuBLAS + pass": 119.8, "one tile per program": 105.8, "persistent TMA": 87.2}}])
    assert table.splitlines()[-1] == "| 16,384 × 3,072 × 768 | 119.8 | 105.8 | **87.2** |"


def test_gpu_attention_parses_shapes_and_reports_the_fastest_tile() -> None:
    ga = script("gpu_attention")
    args = ga.parse_args(["--shapes", "128x128x12x64,64x384x16x64"])
    assert args.shapes == ((128, 128, 12, 64), (64, 384, 16, 64))
    for bad in ("128x128x12", "128by128"):
        with pytest.raises(SystemExit):
            ga.parse_args(["--shapes", bad])
    table = ga.render([{"shape": [128, 128, 12, 64],
                        "us": {"SDPA + cast": 60.0, "64x64/s2/w4": 45.0, "128x128/s2/w8": 42.0}}])
    assert table.splitlines()[-1] == "| 128 × 128 × 12 × 64 | 60.0 | 42.0 | 128x128/s2/w8 | 0.70 |"
