"""``benchmarks/handoff_wait.py`` runs end to end for a moment (real processes, a real socket pair), so that it
cannot rot; nothing here judges a figure."""

from __future__ import annotations

import importlib

import pytest


def test_one_row_per_busy_share_with_the_idle_row_as_the_baseline(capsys: pytest.CaptureFixture[str]) -> None:
    hw = importlib.import_module("handoff_wait")
    assert hw.main(["--shares", "0,0.5", "--seconds", "0.3", "--busy", "1", "--burst-ms", "2", "--rate", "500"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 0.")]
    assert [r.split(" | ")[0] for r in rows] == ["| 0.00", "| 0.50"]
    assert rows[0].endswith("| 0 | 0 |")  # the idle row is its own baseline
    with pytest.raises(SystemExit):
        hw.main(["--shares", "1.5"])
