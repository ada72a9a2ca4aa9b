"""The benchmark scripts import as top-level modules (``import sim_validate``), as they do when run."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module", autouse=True)
def on_path() -> Iterator[None]:
    sys.path.insert(0, str(BENCHMARKS))
    yield
    sys.path.remove(str(BENCHMARKS))
