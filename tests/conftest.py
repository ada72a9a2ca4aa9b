"""Suite-wide fixtures: an isolated FLEETSERVE_HOME shared by the session (exports and engines are reused
across tests; each export costs seconds), and helpers to find torch."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

HAS_TORCH = importlib.util.find_spec("torch") is not None and importlib.util.find_spec("transformers") is not None
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="model export needs torch + transformers (export extra)")


@pytest.fixture(scope="session", autouse=True)
def fleetserve_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One model store / engine cache per test session (CI sets FLEETSERVE_HOME to reuse exports)."""
    old = os.environ.get("FLEETSERVE_HOME")
    home = Path(old) if old else tmp_path_factory.mktemp("fleetserve-home")
    os.environ["FLEETSERVE_HOME"] = str(home)
    yield home
    if old is None:
        os.environ.pop("FLEETSERVE_HOME", None)
