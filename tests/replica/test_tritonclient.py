"""NVIDIA's tritonclient (HTTP and gRPC), unmodified, against the KServe front ends on real 127.0.0.1 ports.

The servers run on their own event loop in a background thread, the way a replica process runs them;
the clients are tritonclient's synchronous ones in the test thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from aiohttp import web

from fleetserve.replica.codec import CodecLimits
from fleetserve.replica.grpc_server import GrpcServerConfig, GrpcServerHandle, start_grpc_server
from fleetserve.replica.kserve_http import add_kserve_routes
from fleetserve.replica.model import ModelRepository
from tests.support.fake_models import FakeModel, make_math_model, make_text_model

httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402


@dataclass
class Servers:
    http_url: str
    grpc_url: str
    repo: ModelRepository
    math: FakeModel
    text: FakeModel


@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    math, text = make_math_model(), make_text_model()
    repo = ModelRepository([math, text])
    limits = CodecLimits()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="kserve-test-server", daemon=True)
    thread.start()

    async def start() -> tuple[web.AppRunner, int, GrpcServerHandle]:
        app = web.Application(client_max_size=limits.max_json_bytes + limits.max_total_bytes)
        add_kserve_routes(app, repo, limits)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        grpc_handle = await start_grpc_server(repo, GrpcServerConfig(host="127.0.0.1", port=0), limits)
        return runner, runner.addresses[0][1], grpc_handle

    runner, http_port, grpc_handle = asyncio.run_coroutine_threadsafe(start(), loop).result(30)

    async def stop() -> None:
        await grpc_handle.stop(0)
        await runner.cleanup()

    try:
        yield Servers(f"127.0.0.1:{http_port}", f"127.0.0.1:{grpc_handle.port}", repo, math, text)
    finally:
        asyncio.run_coroutine_threadsafe(stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@pytest.fixture(params=["http", "grpc"])
def client(request: pytest.FixtureRequest, servers: Servers) -> Iterator[Any]:
    if request.param == "http":
        client = httpclient.InferenceServerClient(url=servers.http_url)
    else:
        client = grpcclient.InferenceServerClient(url=servers.grpc_url)
    yield client
    client.close()


def _module(client: Any) -> Any:
    return httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient


def test_health(client: Any) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("math")
    assert client.is_model_ready("text", "1")


def test_draining_server_reports_not_ready(client: Any, servers: Servers) -> None:
    servers.repo.draining = True
    try:
        assert client.is_server_live()
        assert not client.is_server_ready()
    finally:
        servers.repo.draining = False


def test_metadata(client: Any) -> None:
    grpc = _module(client) is grpcclient
    kwargs = {"as_json": True} if grpc else {}
    server = client.get_server_metadata(**kwargs)
    assert server["name"] == "fleetserve" and server["extensions"] == ["binary_tensor_data"]
    model = client.get_model_metadata("math", "1", **kwargs)
    assert model["name"] == "math" and model["versions"] == ["1"] and model["platform"] == "fake_numpy"
    # protobuf's JSON form writes int64 as strings; tritonclient passes that through.
    shapes = [[int(d) for d in t["shape"]] for t in model["inputs"]]
    assert [(t["name"], t["datatype"]) for t in model["inputs"]] == [("x", "FP32"), ("ids", "INT64")]
    assert shapes == [[-1, 3], [-1, -1]]


@pytest.mark.parametrize("binary", [True, False])
def test_numeric_inference(client: Any, servers: Servers, binary: bool) -> None:
    module = _module(client)
    x = np.array([[1.5, 2, 3], [4, 5, 6]], dtype=np.float32)
    ids = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.int64)
    inputs = [module.InferInput("x", list(x.shape), "FP32"), module.InferInput("ids", list(ids.shape), "INT64")]
    if module is httpclient:
        inputs[0].set_data_from_numpy(x, binary_data=binary)
        inputs[1].set_data_from_numpy(ids, binary_data=binary)
        outputs = [module.InferRequestedOutput(n, binary_data=binary) for n in ("doubled", "id_sum")]
    else:
        inputs[0].set_data_from_numpy(x)
        inputs[1].set_data_from_numpy(ids)
        outputs = [module.InferRequestedOutput(n) for n in ("doubled", "id_sum")]
    result = client.infer("math", inputs, outputs=outputs, request_id="t-1", priority=5, timeout=3_000_000)
    np.testing.assert_array_equal(result.as_numpy("doubled"), x * 2)
    np.testing.assert_array_equal(result.as_numpy("id_sum"), [6, 15])
    assert result.get_response(**({"as_json": True} if module is grpcclient else {}))["id"] == "t-1"
    call = servers.math.calls[-1]
    assert (call.priority, call.timeout_s) == (5, 3.0)


def test_default_outputs_come_back_binary_over_http(servers: Servers) -> None:
    client = httpclient.InferenceServerClient(url=servers.http_url)
    try:
        x, ids = np.ones((1, 3), dtype=np.float32), np.ones((1, 1), dtype=np.int64)
        inputs = [httpclient.InferInput("x", [1, 3], "FP32"), httpclient.InferInput("ids", [1, 1], "INT64")]
        inputs[0].set_data_from_numpy(x)
        inputs[1].set_data_from_numpy(ids)
        result = client.infer("math", inputs)  # no outputs listed: tritonclient asks for binary_data_output
        assert all("binary_data_size" in o["parameters"] for o in result.get_response()["outputs"])
        np.testing.assert_array_equal(result.as_numpy("doubled"), x * 2)
    finally:
        client.close()


def test_bytes_inference(client: Any) -> None:
    module = _module(client)
    text = np.array([b"hello", b"", "caf\u00e9".encode()], dtype=object)
    (tensor,) = inputs = [module.InferInput("text", [3], "BYTES")]
    tensor.set_data_from_numpy(text)
    result = client.infer("text", inputs)
    assert result.as_numpy("upper").tolist() == [b"HELLO", b"", "CAF\u00e9".encode()]
    np.testing.assert_array_equal(result.as_numpy("length"), [5, 0, 5])


def test_errors_reach_the_client_with_their_message(client: Any) -> None:
    module = _module(client)
    with pytest.raises(InferenceServerException, match="unknown model 'nope'"):
        client.get_model_metadata("nope")
    tensor = module.InferInput("x", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 4), dtype=np.float32))
    with pytest.raises(InferenceServerException, match=r"input 'x' has shape \[1, 4\]; the model expects \[-1, 3\]"):
        client.infer("math", [tensor])
