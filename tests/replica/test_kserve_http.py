"""Tests for the KServe v2 REST routes on a real aiohttp test server with fake served models."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator

import numpy as np
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from fleetserve.errors import InvalidInput, Overloaded, RequestExpired
from fleetserve.replica.codec import HEADER_LENGTH, CodecLimits
from fleetserve.replica.kserve_http import add_kserve_routes
from fleetserve.replica.model import ModelRepository
from fleetserve.wire import TIMEOUT_HEADER
from tests.support.fake_models import FakeModel

MAX_BODY = 256 << 10


async def _client(repo: ModelRepository, limits: CodecLimits, max_body: int = MAX_BODY) -> TestClient:
    app = web.Application(client_max_size=max_body)
    add_kserve_routes(app, repo, limits)
    client = TestClient(TestServer(app))
    await client.start_server()
    return client


@pytest.fixture
async def client(repo: ModelRepository, limits: CodecLimits) -> AsyncIterator[TestClient]:
    client = await _client(repo, limits)
    yield client
    await client.close()


MATH_REQUEST = {
    "id": "r-1",
    "inputs": [
        {"name": "x", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]},
        {"name": "ids", "datatype": "INT64", "shape": [1, 2], "data": [[5, 6]]},
    ],
    "parameters": {"priority": 2, "timeout": 1_500_000},
}


async def test_server_metadata_and_health(client: TestClient, repo: ModelRepository) -> None:
    response = await client.get("/v2")
    assert response.status == 200
    assert await response.json() == {
        "name": "fleetserve",
        "version": repo.info.version,
        "extensions": ["binary_tensor_data"],
    }
    assert (await client.get("/v2/health/live")).status == 200
    assert (await client.get("/v2/health/ready")).status == 200


async def test_draining_server_is_live_but_not_ready(client: TestClient, repo: ModelRepository) -> None:
    repo.draining = True
    assert (await client.get("/v2/health/live")).status == 200
    response = await client.get("/v2/health/ready")
    assert response.status == 503
    assert response.headers["Retry-After"] == "1"
    assert await response.json() == {"error": "the server is draining"}


async def test_unready_model_makes_server_unready(client: TestClient, math_model: FakeModel) -> None:
    math_model.ready = False
    assert (await client.get("/v2/health/ready")).status == 503
    response = await client.get("/v2/models/math/ready")
    assert response.status == 503
    assert "model 'math' is not ready" in (await response.json())["error"]
    assert (await client.get("/v2/models/text/ready")).status == 200


async def test_model_metadata_mirrors_triton(client: TestClient) -> None:
    for path in ("/v2/models/math", "/v2/models/math/versions/1"):
        response = await client.get(path)
        assert response.status == 200
        assert await response.json() == {
            "name": "math",
            "versions": ["1"],
            "platform": "fake_numpy",
            "inputs": [
                {"name": "x", "datatype": "FP32", "shape": [-1, 3]},
                {"name": "ids", "datatype": "INT64", "shape": [-1, -1]},
            ],
            "outputs": [
                {"name": "doubled", "datatype": "FP32", "shape": [-1, 3]},
                {"name": "id_sum", "datatype": "INT64", "shape": [-1]},
            ],
        }


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("/v2/models/nope", "unknown model 'nope'; this server serves ['math', 'text']"),
        ("/v2/models/math/versions/2", "model 'math' has no version '2'"),
        ("/v2/models/nope/ready", "unknown model 'nope'"),
    ],
)
async def test_unknown_models_and_versions_are_404(client: TestClient, path: str, message: str) -> None:
    response = await client.get(path)
    assert response.status == 404
    assert message in (await response.json())["error"]


async def test_json_inference_passes_options_and_echoes_id(client: TestClient, math_model: FakeModel) -> None:
    response = await client.post("/v2/models/math/versions/1/infer", json=MATH_REQUEST)
    assert response.status == 200
    assert response.content_type == "application/json"
    body = await response.json()
    assert body == {
        "model_name": "math",
        "model_version": "1",
        "id": "r-1",
        "outputs": [
            {"name": "doubled", "datatype": "FP32", "shape": [1, 3], "data": [2.0, 4.0, 6.0]},
            {"name": "id_sum", "datatype": "INT64", "shape": [1], "data": [11]},
        ],
    }
    (call,) = math_model.calls
    assert (call.priority, call.timeout_s, call.deadline) == (2, 1.5, None)


async def test_a_forwarded_deadline_reaches_the_model(client: TestClient, math_model: FakeModel) -> None:
    before = time.monotonic()
    response = await client.post("/v2/models/math/infer", json=MATH_REQUEST, headers={TIMEOUT_HEADER: "250"})
    assert response.status == 200
    (call,) = math_model.calls
    assert call.deadline is not None and before + 0.25 <= call.deadline <= time.monotonic() + 0.25


async def test_a_malformed_forwarded_deadline_is_a_400_naming_the_header(
    client: TestClient, math_model: FakeModel
) -> None:
    response = await client.post("/v2/models/math/infer", json=MATH_REQUEST, headers={TIMEOUT_HEADER: "soon"})
    assert response.status == 400
    assert TIMEOUT_HEADER in (await response.json())["error"]
    assert math_model.calls == []


async def test_binary_inference_round_trip(client: TestClient) -> None:
    texts = [b"hello", b"", b"\xffraw"]
    raw = b"".join(len(t).to_bytes(4, "little") + t for t in texts)
    header = json.dumps(
        {
            "inputs": [
                {"name": "text", "datatype": "BYTES", "shape": [3], "parameters": {"binary_data_size": len(raw)}}
            ],
            "outputs": [{"name": "upper", "parameters": {"binary_data": True}}, {"name": "length"}],
        }
    ).encode()
    response = await client.post("/v2/models/text/infer", data=header + raw, headers={HEADER_LENGTH: str(len(header))})
    assert response.status == 200
    assert response.content_type == "application/octet-stream"
    body = await response.read()
    header_length = int(response.headers[HEADER_LENGTH])
    outputs = json.loads(body[:header_length])["outputs"]
    assert outputs[1] == {"name": "length", "datatype": "INT32", "shape": [3], "data": [5, 0, 4]}
    size = outputs[0]["parameters"]["binary_data_size"]
    expected = b"".join(len(t).to_bytes(4, "little") + t.upper() for t in texts)
    assert body[header_length : header_length + size] == expected


async def test_malformed_request_is_400_naming_the_problem(client: TestClient) -> None:
    response = await client.post("/v2/models/math/infer", data=b"{oops")
    assert response.status == 400
    assert "not valid JSON" in (await response.json())["error"]
    bad = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}
    response = await client.post("/v2/models/math/infer", json=bad)
    assert response.status == 400
    assert (await response.json()) == {"error": "input 'x' has shape [1, 4]; the model expects [-1, 3]"}


async def test_unknown_model_inference_is_404(client: TestClient) -> None:
    response = await client.post("/v2/models/nope/infer", json=MATH_REQUEST)
    assert response.status == 404


@pytest.mark.parametrize(
    ("error", "status", "retry_after"),
    [
        (Overloaded("queue full", retry_after_s=1.2), 503, "2"),
        (Overloaded("queue full", retry_after_s=0.01), 503, "1"),
        (RequestExpired("waited too long"), 504, None),
        (InvalidInput("batch too large"), 400, None),
    ],
)
async def test_model_errors_map_to_status_and_retry_after(
    client: TestClient, math_model: FakeModel, error: Exception, status: int, retry_after: str | None
) -> None:
    math_model.error = error
    response = await client.post("/v2/models/math/infer", json=MATH_REQUEST)
    assert response.status == status
    assert response.headers.get("Retry-After") == retry_after
    assert (await response.json()) == {"error": str(error)}


async def test_unexpected_errors_are_500_without_traceback(
    client: TestClient, math_model: FakeModel, caplog: pytest.LogCaptureFixture
) -> None:
    math_model.error = RuntimeError("secret detail")
    with caplog.at_level(logging.ERROR, logger="fleetserve.replica.kserve_http"):
        response = await client.post("/v2/models/math/infer", json=MATH_REQUEST)
    assert response.status == 500
    text = await response.text()
    assert json.loads(text) == {"error": "internal error"}
    assert "secret detail" not in text and "Traceback" not in text
    assert any("secret detail" in (r.exc_text or "") or r.exc_info for r in caplog.records)


async def test_body_over_client_max_size_is_a_json_413(client: TestClient) -> None:
    response = await client.post("/v2/models/math/infer", data=b"x" * (MAX_BODY + 1))
    assert response.status == 413
    assert "Maximum request body size" in (await response.json())["error"]


async def test_payload_limits_are_413(client: TestClient) -> None:
    doc = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [10_000, 3], "data": []}]}
    response = await client.post("/v2/models/math/infer", json=doc)
    assert response.status == 413
    assert "30000 elements; the limit is 10000" in (await response.json())["error"]


async def test_large_bodies_decode_off_the_event_loop_with_the_same_result(repo: ModelRepository) -> None:
    rows = 120_000  # 1.4 MB of FP32, above the offload threshold
    x = np.arange(rows * 3, dtype=np.float32).reshape(rows, 3)
    header = json.dumps(
        {
            "inputs": [
                {"name": "x", "datatype": "FP32", "shape": [rows, 3], "parameters": {"binary_data_size": x.nbytes}},
                {"name": "ids", "datatype": "INT64", "shape": [1, 1], "data": [1]},
            ],
            "outputs": [{"name": "doubled", "parameters": {"binary_data": True}}],
        }
    ).encode()
    limits = CodecLimits(max_elements_per_tensor=1 << 20, max_total_bytes=8 << 20)
    client = await _client(repo, limits, max_body=8 << 20)
    try:
        response = await client.post(
            "/v2/models/math/infer", data=header + x.tobytes(), headers={HEADER_LENGTH: str(len(header))}
        )
        assert response.status == 200
        body = await response.read()
        start = int(response.headers[HEADER_LENGTH])
        np.testing.assert_array_equal(np.frombuffer(body[start:], dtype=np.float32).reshape(rows, 3), x * 2)
    finally:
        await client.close()
