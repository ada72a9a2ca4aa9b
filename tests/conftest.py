"""Suite-wide fixtures: an isolated FLEETSERVE_HOME shared by the session (exports and engines are reused
across tests; each export costs seconds)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session", autouse=True)
def fleetserve_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One model store / engine cache per test session (CI sets FLEETSERVE_HOME to reuse exports)."""
    old = os.environ.get("FLEETSERVE_HOME")
    home = Path(old) if old else tmp_path_factory.mktemp("fleetserve-home")
    os.environ["FLEETSERVE_HOME"] = str(home)
    yield home
    if old is None:
        os.environ.pop("FLEETSERVE_HOME", None)
