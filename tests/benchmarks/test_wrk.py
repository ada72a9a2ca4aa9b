"""``benchmarks/_wrk.py`` drives a real ``wrk`` against a local HTTP server: every body of the pool is posted, and
``gpu_server.py --client wrk`` turns wrk's result into the report keys its tables read."""

from __future__ import annotations

import http.server
import importlib
import json
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

pytestmark = pytest.mark.skipif(shutil.which("wrk") is None, reason="needs wrk (make setup installs it)")


class _Recorder(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: ClassVar[list[tuple[str, bytes]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.seen.append((self.path, body))
        status = 503 if b"refuse" in body else 200
        self.send_response(status)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, format: str, *args: object) -> None:
        return


class _Server(http.server.ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        """wrk resets its connections when it stops: nothing to report."""


@pytest.fixture
def server() -> Iterator[str]:
    _Recorder.seen = []
    httpd = _Server(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_every_body_of_the_pool_is_posted_and_errors_are_counted(server: str, tmp_path: Path) -> None:
    wrk = importlib.import_module("_wrk")
    bodies = [json.dumps({"texts": [f"text {i}"]}).encode() for i in range(5)] + [b'{"texts": ["refuse"]}']
    script = tmp_path / "load.lua"
    script.write_text(wrk.script("/inference", bodies))
    result = wrk.run(server + "/inference", script, connections=2, duration_s=1, threads=2)
    assert result["requests"] >= len(bodies)
    assert {body for _, body in _Recorder.seen} == set(bodies)
    assert {path for path, _ in _Recorder.seen} == {"/inference"}
    refused = sum(body == bodies[-1] for _, body in _Recorder.seen)
    assert 0 < result["status_errors"] <= refused and result["socket_errors"] == 0
    assert 0 < result["p50_us"] <= result["p99_us"] <= result["max_us"]
    with pytest.raises(ValueError, match="terminator"):
        wrk.script("/x", [b'"]==]"'])


def test_gpu_server_client_wrk_reports_in_the_generators_keys(server: str, tmp_path: Path) -> None:
    gs = importlib.import_module("gpu_server")
    cfg, _ = gs.parse_args(["--workload", "texts", "--client", "wrk", "--duration", "1", "--home", str(tmp_path),
                            "--out", str(tmp_path)])
    cfg = gs.replace(cfg, warmup_s=1.0, work=tmp_path)
    command, report = gs.wrk_bench(cfg, server, concurrency=4, threads=2)
    assert isinstance(report, dict), report
    assert command[:3] == ["wrk", "-t2", "-c4"] and command[-1] == server + "/inference"
    assert report["errors"] == 0 and report["ok"] > 0 and report["achieved_rps"] > 0
    assert 0 < report["latency_s"]["p50"] <= report["latency_s"]["p99"]
    texts = {json.loads(body)["texts"][0] for _, body in _Recorder.seen}
    assert len(texts) > 50  # the workload's pool, not one body
    with pytest.raises(ValueError, match="JSON bodies"):
        gs.parse_args(["--workload", "v2-binary", "--client", "wrk"])
