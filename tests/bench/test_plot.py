from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fleetserve.bench.plot import PlotUnavailable, plot_report
from tests.support.reports import report


def test_plot_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "latency.png"
    plot_report(report(), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size > 5_000


def test_missing_matplotlib_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(PlotUnavailable, match="pip install"):
        plot_report(report(), tmp_path / "x.png")
