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
        (["build", "gpt-17"], "unknown model 'gpt-17'; valid models: minilm, bert-base, tiny"),
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
    for cmd in ("build", "serve", "gateway", "up", "bench"):
        assert cmd in proc.stdout
