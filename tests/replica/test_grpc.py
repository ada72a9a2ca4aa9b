"""Tests for the KServe v2 gRPC service: in-process server on 127.0.0.1, the generated code, the schema."""

from __future__ import annotations

import re
import time
import tomllib
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace

import grpc
import grpc.aio
import numpy as np
import pytest
from google.protobuf.descriptor import Descriptor

from fleetserve.batching.observer import NullObserver
from fleetserve.errors import Overloaded
from fleetserve.replica.codec import CodecLimits, tensor_to_raw
from fleetserve.replica.grpc_server import GrpcServerConfig, GrpcServerHandle, start_grpc_server
from fleetserve.replica.load import LoadMeter, LoadReporter
from fleetserve.replica.model import ModelRepository
from fleetserve.replica.proto import generate
from fleetserve.replica.proto import grpc_service_pb2 as pb
from fleetserve.replica.proto import grpc_service_pb2_grpc as pb_grpc
from fleetserve.wire import GPU_UTILIZATION, LOAD_REPORT_HEADER, LoadReport, parse_load_report
from tests.support.fake_models import FakeModel


async def _start(repo: ModelRepository, limits: CodecLimits, **config: int) -> GrpcServerHandle:
    return await start_grpc_server(repo, GrpcServerConfig(host="127.0.0.1", port=0, **config), limits)


@pytest.fixture
async def server(repo: ModelRepository, limits: CodecLimits) -> AsyncIterator[GrpcServerHandle]:
    handle = await _start(repo, limits)
    yield handle
    await handle.stop(0)


@pytest.fixture
async def stub(server: GrpcServerHandle) -> AsyncIterator[pb_grpc.GRPCInferenceServiceStub]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        yield pb_grpc.GRPCInferenceServiceStub(channel)


def math_request(raw: bool = True) -> pb.ModelInferRequest:
    x = np.array([[1, 2, 3]], dtype=np.float32)
    ids = np.array([[5, 6]], dtype=np.int64)
    request = pb.ModelInferRequest(model_name="math", id="g-1")
    x_in = request.inputs.add(name="x", datatype="FP32", shape=[1, 3])
    ids_in = request.inputs.add(name="ids", datatype="INT64", shape=[1, 2])
    if raw:
        request.raw_input_contents.extend([x.tobytes(), ids.tobytes()])
    else:
        x_in.contents.fp32_contents.extend([1, 2, 3])
        ids_in.contents.int64_contents.extend([5, 6])
    return request


def outputs(response: pb.ModelInferResponse) -> dict[str, np.ndarray]:
    dtypes = {"FP32": np.float32, "INT64": np.int64, "INT32": np.int32}
    return {
        o.name: np.frombuffer(raw, dtype=dtypes[o.datatype]).reshape(list(o.shape))
        for o, raw in zip(response.outputs, response.raw_output_contents, strict=True)
        if o.datatype != "BYTES"
    }


async def test_health_and_metadata(stub: pb_grpc.GRPCInferenceServiceStub, repo: ModelRepository) -> None:
    assert (await stub.ServerLive(pb.ServerLiveRequest())).live
    assert (await stub.ServerReady(pb.ServerReadyRequest())).ready
    assert (await stub.ModelReady(pb.ModelReadyRequest(name="math"))).ready
    meta = await stub.ServerMetadata(pb.ServerMetadataRequest())
    assert (meta.name, meta.version, list(meta.extensions)) == ("fleetserve", repo.info.version, ["binary_tensor_data"])
    model = await stub.ModelMetadata(pb.ModelMetadataRequest(name="math", version="1"))
    assert (model.name, list(model.versions), model.platform) == ("math", ["1"], "fake_numpy")
    assert [(t.name, t.datatype, list(t.shape)) for t in model.inputs] == [
        ("x", "FP32", [-1, 3]),
        ("ids", "INT64", [-1, -1]),
    ]
    assert [t.name for t in model.outputs] == ["doubled", "id_sum"]
    repo.draining = True
    assert not (await stub.ServerReady(pb.ServerReadyRequest())).ready


async def test_unknown_model_is_not_found(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.ModelMetadata(pb.ModelMetadataRequest(name="nope"))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert "unknown model 'nope'" in (info.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.ModelReady(pb.ModelReadyRequest(name="math", version="9"))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize("raw", [True, False])
async def test_infer_with_raw_or_typed_contents(
    stub: pb_grpc.GRPCInferenceServiceStub, math_model: FakeModel, raw: bool
) -> None:
    request = math_request(raw)
    request.parameters["priority"].uint64_param = 4
    request.parameters["timeout"].int64_param = 2_000_000
    response = await stub.ModelInfer(request)
    assert (response.model_name, response.model_version, response.id) == ("math", "1", "g-1")
    result = outputs(response)
    np.testing.assert_array_equal(result["doubled"], [[2, 4, 6]])
    np.testing.assert_array_equal(result["id_sum"], [11])
    (call,) = math_model.calls
    assert (call.priority, call.timeout_s, call.deadline) == (4, 2.0, None)


async def test_the_calls_deadline_reaches_the_model(
    stub: pb_grpc.GRPCInferenceServiceStub, math_model: FakeModel
) -> None:
    before = time.monotonic()
    await stub.ModelInfer(math_request(True), timeout=30)
    (call,) = math_model.calls
    # The deadline travels as grpc-timeout (rounded up to its unit) and gRPC's core reads its own clock:
    # on a loaded box the model's deadline came out 0.1 s past the client's; the bound allows half a second.
    assert call.deadline is not None and before + 29 < call.deadline <= time.monotonic() + 30.5


async def test_requested_outputs_and_bytes(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    request = pb.ModelInferRequest(model_name="text")
    request.inputs.add(name="text", datatype="BYTES", shape=[2]).contents.bytes_contents.extend([b"ab", b"xyz"])
    request.outputs.add(name="upper")
    response = await stub.ModelInfer(request)
    assert [o.name for o in response.outputs] == ["upper"]
    assert response.raw_output_contents[0] == tensor_to_raw(np.array([b"AB", b"XYZ"], dtype=object), "BYTES")


def _bad_requests() -> list[tuple[pb.ModelInferRequest, str]]:
    cases = []
    short = math_request()
    del short.raw_input_contents[1]
    cases.append((short, "raw_input_contents has 1 entries for 2 inputs"))
    both = math_request()
    both.inputs[0].contents.fp32_contents.append(1)
    cases.append((both, "has both contents and raw_input_contents"))
    wrong_field = math_request(raw=False)
    wrong_field.inputs[1].contents.fp32_contents.append(1)
    cases.append((wrong_field, "INT64 elements belong in contents.int64_contents"))
    bad_shape = math_request()
    bad_shape.inputs[0].shape[1] = 4
    cases.append((bad_shape, "input 'x' has shape [1, 4]; the model expects [-1, 3]"))
    short_raw = math_request()
    short_raw.raw_input_contents[0] = b"\x00" * 4
    cases.append((short_raw, "4 bytes of binary data but shape [1, 3] of FP32 needs 12"))
    classify = math_request()
    classify.outputs.add(name="doubled").parameters["classification"].int64_param = 2
    cases.append((classify, "classification extension is not supported"))
    unknown_output = math_request()
    unknown_output.outputs.add(name="nope")
    cases.append((unknown_output, "unknown outputs ['nope']"))
    negative = math_request()
    negative.parameters["timeout"].int64_param = -5
    cases.append((negative, "'timeout' must be a non-negative integer"))
    no_data = pb.ModelInferRequest(model_name="math")
    no_data.inputs.add(name="x", datatype="FP32", shape=[1, 3])
    no_data.inputs.add(name="ids", datatype="INT64", shape=[1, 1]).contents.int64_contents.append(1)
    cases.append((no_data, "input 'x' has 0 elements but shape [1, 3] needs 3"))
    return cases


@pytest.mark.parametrize(("request_", "message"), _bad_requests())
async def test_invalid_requests_are_invalid_argument(
    stub: pb_grpc.GRPCInferenceServiceStub, request_: pb.ModelInferRequest, message: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.ModelInfer(request_)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in (info.value.details() or "")


async def test_overload_is_unavailable_with_retry_after(
    stub: pb_grpc.GRPCInferenceServiceStub, math_model: FakeModel
) -> None:
    math_model.error = Overloaded("queue full", retry_after_s=2.5)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.ModelInfer(math_request())
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert info.value.details() == "queue full"
    assert ("retry-after", "3") in tuple(info.value.trailing_metadata() or ())


async def test_unexpected_errors_are_internal_without_details(
    stub: pb_grpc.GRPCInferenceServiceStub, math_model: FakeModel
) -> None:
    math_model.error = KeyError("secret detail")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.ModelInfer(math_request())
    assert info.value.code() == grpc.StatusCode.INTERNAL
    assert info.value.details() == "internal error"


async def test_message_size_is_bounded(repo: ModelRepository, limits: CodecLimits) -> None:
    handle = await _start(repo, limits, max_message_bytes=1 << 16)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{handle.port}") as channel:
            request = math_request()
            request.raw_input_contents[0] = b"\x00" * (1 << 17)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request)
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        await handle.stop(0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"host": ""}, "host must not be empty"),
        ({"port": 70000}, "port must be in 0..65535"),
        ({"max_message_bytes": 10}, "max_message_bytes must be at least"),
        ({"max_concurrent_rpcs": 0}, "max_concurrent_rpcs must be positive"),
    ],
)
def test_config_validation(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GrpcServerConfig(**kwargs)  # type: ignore[arg-type]


def test_ipv6_hosts_are_bracketed() -> None:
    assert GrpcServerConfig(host="::1", port=5).address() == "[::1]:5"


def test_checked_in_generated_code_is_up_to_date(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools")
    generate.generate(tmp_path)  # refuses any grpcio-tools but the pinned one: a newer one raises the floors
    for name in generate.GENERATED:
        assert (tmp_path / name).read_text() == (generate.PROTO_DIR / name).read_text(), (
            f"{name} is stale: run python -m fleetserve.replica.proto.generate"
        )


def _fields(descriptor: Descriptor) -> list[tuple[object, ...]]:
    return [
        (
            f.name,
            f.number,
            f.type,
            f.is_repeated,
            f.message_type.full_name if f.message_type else None,
            f.containing_oneof.name if f.containing_oneof else None,
        )
        for f in descriptor.fields
    ]


def test_schema_matches_the_published_protocol_as_tritonclient_ships_it() -> None:
    published = pytest.importorskip("tritonclient.grpc.service_pb2")
    ours = pb.DESCRIPTOR
    assert ours.package == published.DESCRIPTOR.package == "inference"

    def walk(mine: Descriptor, theirs: Descriptor) -> None:
        assert _fields(mine) == _fields(theirs), mine.full_name
        for nested in mine.nested_types:
            walk(nested, theirs.nested_types_by_name[nested.name])

    for name, message in ours.message_types_by_name.items():
        walk(message, published.DESCRIPTOR.message_types_by_name[name])
    service = ours.services_by_name["GRPCInferenceService"]
    their_service = published.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    for method in service.methods:
        theirs = their_service.methods_by_name[method.name]
        assert (method.input_type.full_name, method.output_type.full_name) == (
            theirs.input_type.full_name,
            theirs.output_type.full_name,
        )


def _declared_floors() -> dict[str, str]:
    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    floors = {}
    for requirement in pyproject["project"]["dependencies"]:
        match = re.fullmatch(r"(grpcio|protobuf)>=(\S+)", requirement)
        if match:
            floors[match.group(1)] = match.group(2)
    return floors


def test_generated_code_demands_no_more_than_the_declared_floors() -> None:
    checked_in = (generate.PROTO_DIR / "grpc_service_pb2_grpc.py").read_text()
    assert f"GRPC_GENERATED_VERSION = '{generate.GRPCIO_TOOLS_VERSION}'" in checked_in
    gencode = re.search(r"Protobuf Python Version: (\S+)", (generate.PROTO_DIR / "grpc_service_pb2.py").read_text())
    assert gencode is not None
    declared = _declared_floors()
    assert declared == {"grpcio": generate.GRPCIO_TOOLS_VERSION, "protobuf": gencode.group(1)}


def test_generate_refuses_another_grpcio_tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(generate, "version", lambda name: "1.99.0")
    with pytest.raises(RuntimeError, match=r"grpcio-tools 1\.99\.0 would raise the protobuf/grpcio floors"):
        generate.generate(tmp_path)
    assert list(tmp_path.iterdir()) == []


async def test_every_call_carries_the_load_report(repo: ModelRepository, limits: CodecLimits,
                                                  math_model: FakeModel) -> None:
    queue = SimpleNamespace(queue_depth=3, inflight=2)
    meter = LoadMeter(NullObserver(), instances=1)
    handle = await start_grpc_server(repo, GrpcServerConfig(host="127.0.0.1", port=0), limits,
                                     LoadReporter(queue, meter, lambda: {GPU_UTILIZATION: 0.5}))
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{handle.port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            call = stub.ModelInfer(math_request())
            await call
            report = parse_load_report(dict(await call.trailing_metadata())[LOAD_REPORT_HEADER])
            assert report == LoadReport(0.0, 3, 2, 0.5, False)
            queue.queue_depth = 7
            math_model.error = Overloaded("queue full", retry_after_s=2.0)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.ModelInfer(math_request())
            trailer = dict(info.value.trailing_metadata())
            assert trailer["retry-after"] == "2"
            failed = parse_load_report(trailer[LOAD_REPORT_HEADER])
            assert failed is not None and failed.queue_depth == 7
    finally:
        await handle.stop(0)
