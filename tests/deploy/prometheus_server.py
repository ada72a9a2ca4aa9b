"""The real Prometheus server (Debian package ``prometheus``) for integration tests: started on a free
127.0.0.1 port with a given config and rule files, queried through its HTTP API, stopped at the end.

Waiting is always on an API condition with a deadline, never a fixed sleep.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from tests.support.procs import free_port

T = TypeVar("T")


class Prometheus:
    def __init__(self, url: str, process: subprocess.Popen[str]) -> None:
        self.url = url
        self.process = process

    def _get(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=10) as response:
            body = json.loads(response.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query's vector: ``[{"metric": {...}, "value": [t, "v"]}, ...]``."""
        data = self._get("/api/v1/query", {"query": promql})
        assert data["resultType"] == "vector", data
        result: list[dict[str, Any]] = data["result"]
        return result

    def value(self, promql: str) -> tuple[float, float] | None:
        """(timestamp, value) of a query that returns one series, None while it returns none."""
        result = self.query(promql)
        if not result:
            return None
        assert len(result) == 1, result
        t, v = result[0]["value"]
        return float(t), float(v)

    def alerts(self) -> list[dict[str, Any]]:
        alerts: list[dict[str, Any]] = self._get("/api/v1/alerts")["alerts"]
        return alerts

    def wait(self, condition: Callable[[], T | None], timeout_s: float, what: str) -> T:
        """Poll ``condition`` until it returns a truthy value (returned), failing with ``what`` past the deadline."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                raise AssertionError(f"prometheus exited with {self.process.returncode}")
            value = condition()
            if value:
                return value
            assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
            time.sleep(0.2)


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@contextlib.contextmanager
def running_prometheus(folder: Path, config: Mapping[str, Any], files: Mapping[str, str]) -> Iterator[Prometheus]:
    """Prometheus with ``config`` (written as prometheus.yml) and ``files`` (e.g. rules.yml) beside it."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("prometheus is not installed; `make setup` installs it")
    for name, text in files.items():
        (folder / name).write_text(text)
    (folder / "prometheus.yml").write_text(yaml.safe_dump(dict(config)))
    url = f"http://127.0.0.1:{free_port()}"
    log = (folder / "prometheus.log").open("w")
    process = subprocess.Popen(
        [binary, f"--config.file={folder / 'prometheus.yml'}", f"--storage.tsdb.path={folder / 'data'}",
         f"--web.listen-address={url.removeprefix('http://')}"],
        stdout=subprocess.DEVNULL, stderr=log, text=True)
    server = Prometheus(url, process)
    try:
        server.wait(lambda: _ready(url), 60, "prometheus ready")
        yield server
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
        log.close()
