"""Real NGINX and HAProxy processes in front of real `fleetserve serve` replicas on 127.0.0.1."""

from __future__ import annotations

import json
import re
import signal
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from fleetserve.deploy.local import HaproxyProcess, NginxProcess, ProxyProcess, free_port, free_port_block
from tests.support.httpthread import serving
from tests.support.procs import Proc, replica
from tests.support.waiting import until_sync

BODY = json.dumps({"texts": ["a short query"]}).encode()
_COUNT = re.compile(r'^fleetserve_requests_total\{(?=[^}]*code="200")[^}]*\} ([0-9.e+]+)$', re.M)


def served(proc: Proc) -> int:
    """Successful inference requests this replica has answered, from its /metrics."""
    with urllib.request.urlopen(f"{proc.url}/metrics", timeout=5) as r:
        return int(sum(float(v) for v in _COUNT.findall(r.read().decode())))


def infer(url: str) -> int:
    request = urllib.request.Request(f"{url}/inference", data=BODY, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            assert "embeddings" in json.loads(r.read())
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code


def wait_lines(path: Path, n: int, timeout_s: float = 5.0) -> list[str]:
    """NGINX writes a request's log line after the response went out, so the last one may lag."""
    until_sync(lambda: len(path.read_text().splitlines()) >= n, timeout_s, what=f"{n} lines in {path}")
    return path.read_text().splitlines()


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[Proc, Proc]]:
    # One after the other: the first exports the model into a fresh FLEETSERVE_HOME, the second reuses it.
    with replica("tiny", grpc=False) as a, replica("tiny", grpc=False) as b:
        yield a, b


class _Overloaded(BaseHTTPRequestHandler):
    """Says it is ready, then answers every inference 503: an overloaded replica."""

    posts = 0

    def do_GET(self) -> None:
        self._answer(200)

    def do_POST(self) -> None:
        type(self).posts += 1
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._answer(503)

    def _answer(self, status: int) -> None:
        body = b'{"error": "overloaded"}' if status == 503 else b"{}"
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        """HAProxy closes its health-check connections with a reset, which is no error here."""


@pytest.fixture
def overloaded() -> Iterator[tuple[str, type[_Overloaded]]]:
    handler = type("Overloaded", (_Overloaded,), {"posts": 0})
    with serving(handler, _QuietServer) as url:
        yield url, handler


PROXIES = [pytest.param(NginxProcess, id="nginx"), pytest.param(HaproxyProcess, id="haproxy")]


def _start(kind: type[ProxyProcess], backends: list[tuple[str, float]], request: pytest.FixtureRequest,
           health_interval_s: float = 2.0) -> ProxyProcess:
    request.getfixturevalue("nginx_bin" if kind is NginxProcess else "haproxy_bin")  # skips when not installed
    return kind(backends, health_interval_s=health_interval_s).start()


@pytest.mark.parametrize("kind", PROXIES)
def test_requests_spread_over_both_replicas(kind: type[ProxyProcess], pair: tuple[Proc, Proc],
                                            request: pytest.FixtureRequest) -> None:
    a, b = pair
    before = served(a), served(b)
    proxy = _start(kind, [(a.url, 1.0), (b.url, 1.0)], request)
    try:
        statuses = [infer(proxy.url) for _ in range(20)]
    finally:
        proxy.stop()
    deltas = served(a) - before[0], served(b) - before[1]
    assert statuses == [200] * 20
    assert sum(deltas) == 20 and min(deltas) >= 5, deltas


def test_nginx_weights_and_access_log(pair: tuple[Proc, Proc], nginx_bin: str) -> None:
    a, b = pair
    before = served(a), served(b)
    with NginxProcess([(a.url, 3.0), (b.url, 1.0)]) as proxy:
        assert [infer(proxy.url) for _ in range(20)] == [200] * 20
        entries = [json.loads(line) for line in wait_lines(proxy.access_log_path, 20)]
    assert (served(a) - before[0], served(b) - before[1]) == (15, 5)  # one worker: smooth weighted round-robin
    assert len(entries) == 20
    assert {e["upstream_addr"] for e in entries} == {f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"}
    assert all(float(e["upstream_response_time"]) >= 0 and e["status"] == 200 for e in entries)


@pytest.mark.parametrize("kind", PROXIES)
def test_a_killed_replica_is_retried_around(kind: type[ProxyProcess], pair: tuple[Proc, Proc],
                                            request: pytest.FixtureRequest) -> None:
    survivor = pair[0]
    with replica("tiny", grpc=False) as victim:
        proxy = _start(kind, [(victim.url, 1.0), (survivor.url, 1.0)], request, health_interval_s=0.2)
        try:
            assert [infer(proxy.url) for _ in range(4)] == [200] * 4
            victim.popen.kill()
            victim.popen.wait(5)
            before = served(survivor)
            statuses = [infer(proxy.url) for _ in range(10)]
            log = wait_lines(proxy.access_log_path, 14) if isinstance(proxy, NginxProcess) else []
        finally:
            proxy.stop()
    assert statuses == [200] * 10
    assert served(survivor) - before == 10
    if kind is NginxProcess:
        retried = [json.loads(line) for line in log if ", " in json.loads(line)["upstream_addr"]]
        assert retried and all(e["upstream_status"].endswith("200") for e in retried)


@pytest.mark.parametrize("kind", PROXIES)
def test_an_overloaded_replica_503_is_retried_elsewhere(kind: type[ProxyProcess], pair: tuple[Proc, Proc],
                                                        overloaded: tuple[str, type[_Overloaded]],
                                                        request: pytest.FixtureRequest) -> None:
    url, handler = overloaded
    proxy = _start(kind, [(url, 1.0), (pair[0].url, 1.0)], request)
    try:
        statuses = [infer(proxy.url) for _ in range(10)]
    finally:
        proxy.stop()
    assert statuses == [200] * 10
    assert handler.posts >= 1  # the 503s happened and were hidden from the client


def _server_states(proxy: ProxyProcess) -> dict[str, str]:
    with urllib.request.urlopen(f"{proxy.url}/haproxy/metrics", timeout=5) as r:
        text = r.read().decode()
    return dict(re.findall(r'^haproxy_server_status\{proxy="fleetserve_replicas",server="([^"]+)",'
                           r'state="([A-Z]+)"\} 1$', text, re.M))


def test_haproxy_health_checks_take_a_draining_replica_out(pair: tuple[Proc, Proc], haproxy_bin: str) -> None:
    with replica("tiny", "--drain-grace-s", "2.5", grpc=False) as draining, \
            HaproxyProcess([(draining.url, 1.0), (pair[0].url, 1.0)], health_interval_s=0.1) as proxy:
        assert _server_states(proxy) == {"replica-1": "UP", "replica-2": "UP"}
        draining.signal(signal.SIGTERM)
        # Within the replica's 2.5 s drain grace: it must leave the rotation before it stops serving.
        until_sync(lambda: _server_states(proxy)["replica-1"] == "DOWN", 2, what="HAProxy marks replica-1 DOWN")
        assert draining.popen.poll() is None  # still serving: it left the rotation before it stopped
        before = served(draining)
        assert [infer(proxy.url) for _ in range(6)] == [200] * 6
        assert served(draining) == before


@pytest.mark.parametrize("kind", PROXIES)
def test_an_oversized_body_is_refused_before_it_is_read(kind: type[ProxyProcess], pair: tuple[Proc, Proc],
                                                         request: pytest.FixtureRequest) -> None:
    proxy = _start(kind, [(pair[0].url, 1.0)], request)
    try:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as conn:
            conn.sendall(b"POST /inference HTTP/1.1\r\nHost: fleetserve\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % (proxy.config.max_body_bytes + 1))
            status_line = conn.makefile("rb").readline()
    finally:
        proxy.stop()
    assert status_line.split()[1] == b"413", status_line


def test_free_ports_lie_below_the_ephemeral_range_and_are_not_handed_out_twice() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    singles = [free_port() for _ in range(200)]
    base = free_port_block(4)
    handed = [*singles, *range(base, base + 4)]
    assert len(set(handed)) == len(handed) and max(handed) < low
