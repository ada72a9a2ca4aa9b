"""``benchmarks/engine_overlap.py`` runs end to end for a moment with the tiny model (real engine processes started
together), so that it cannot rot; nothing here judges a figure."""

from __future__ import annotations

import importlib

import pytest


def test_each_mix_reports_each_kind_against_its_time_alone(capsys: pytest.CaptureFixture[str]) -> None:
    eo = importlib.import_module("engine_overlap")
    argv = ["--model", "tiny", "--precision", "fp32", "--mixes", "short,long,short+long+long", "--seconds", "0.3",
            "--short-tokens", "8", "--long-tokens", "32"]
    assert eo.main(argv) == 0
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines() if line.startswith("| short")
            or line.startswith("| long")]
    assert [(r[0], r[1]) for r in rows] == [("| short", "short"), ("| long", "long"), ("| short+long+long", "short"),
                                            ("| short+long+long", "long")]
    assert rows[0][5] == "1.00" and rows[1][5] == "1.00"  # each kind alone is its own baseline
    assert rows[2][6].rstrip(" |") == f"{max(1.0, 3 / eo.os.cpu_count()):.2f}"
    with pytest.raises(SystemExit):
        eo.main(["--mixes", "short+medium"])
    with pytest.raises(SystemExit, match="ended without its call times"):  # a failed load ends the mix, no hang
        eo.main(["--model", "nosuchmodel", "--mixes", "short+long", "--seconds", "0.2"])
