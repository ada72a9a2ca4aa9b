"""Tests for the KServe v2 codec: JSON and binary tensors, validation errors, limits, and fuzzing."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fleetserve.engine.base import TensorSpec
from fleetserve.errors import FleetserveError, InvalidInput, PayloadTooLarge
from fleetserve.replica.codec import (
    DATATYPES,
    CodecLimits,
    InferRequest,
    RequestedOutput,
    decode_infer_request,
    deserialize_bytes,
    encode_infer_response,
    tensor_to_raw,
)
from tests.support.fake_models import FakeModel, make_math_model, make_text_model
from tests.support.kserve_strategies import JSON_VALUES, MODELS, objects, requests

LIMITS = CodecLimits(max_elements_per_tensor=1000, max_total_bytes=64 << 10, max_json_bytes=64 << 10)
NUMERIC = [d for d in DATATYPES if d != "BYTES"]


def decode(model: FakeModel, doc: object, binary: bytes | None = None, limits: CodecLimits = LIMITS) -> InferRequest:
    header = json.dumps(doc).encode()
    if binary is None:
        return decode_infer_request(header, None, inputs=model.inputs, outputs=model.outputs, limits=limits)
    return decode_infer_request(
        header + binary, str(len(header)), inputs=model.inputs, outputs=model.outputs, limits=limits
    )


def math_doc(**extra: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "inputs": [
            {"name": "x", "datatype": "FP32", "shape": [2, 3], "data": [[1, 2, 3], [4, 5.5, 6]]},
            {"name": "ids", "datatype": "INT64", "shape": [2, 2], "data": [1, 2, 3, 4]},
        ]
    }
    doc.update(extra)
    return doc


def one_tensor_model(datatype: str, shape: tuple[int, ...] = (-1,)) -> FakeModel:
    return FakeModel(
        name="one",
        inputs=[TensorSpec("t", datatype, shape)],
        outputs=[TensorSpec("t", datatype, shape)],
        transform=lambda t: t,
    )


def test_json_nested_and_flat_data_decode_to_the_specs_dtype_and_shape() -> None:
    request = decode(make_math_model(), math_doc())
    np.testing.assert_array_equal(request.inputs["x"], np.array([[1, 2, 3], [4, 5.5, 6]], dtype=np.float32))
    assert request.inputs["x"].dtype == np.float32
    np.testing.assert_array_equal(request.inputs["ids"], np.array([[1, 2], [3, 4]]))
    assert request.inputs["ids"].dtype == np.int64
    assert request.outputs == (RequestedOutput("doubled", False), RequestedOutput("id_sum", False))
    assert (request.id, request.priority, request.timeout_s) == (None, None, None)


def test_request_id_priority_and_timeout_in_microseconds() -> None:
    request = decode(make_math_model(), math_doc(id="req-7", parameters={"priority": 3, "timeout": 250_000}))
    assert (request.id, request.priority, request.timeout_s) == ("req-7", 3, 0.25)
    zero = decode(make_math_model(), math_doc(parameters={"priority": 0, "timeout": 0, "custom": "ignored"}))
    assert (zero.priority, zero.timeout_s) == (None, None)


def test_outputs_filter_and_binary_flags() -> None:
    model = make_math_model()
    request = decode(model, math_doc(outputs=[{"name": "id_sum", "parameters": {"binary_data": True}}]))
    assert request.outputs == (RequestedOutput("id_sum", True),)
    request = decode(model, math_doc(parameters={"binary_data_output": True}, outputs=[{"name": "doubled"}]))
    assert request.outputs == (RequestedOutput("doubled", True),)
    request = decode(model, math_doc(parameters={"binary_data_output": True}))
    assert request.outputs == (RequestedOutput("doubled", True), RequestedOutput("id_sum", True))


@pytest.mark.parametrize("datatype", NUMERIC)
def test_binary_tensor_round_trip_for_every_numeric_datatype(datatype: str) -> None:
    rng = np.random.default_rng(7)
    array = (rng.integers(0, 2, size=(2, 5)) if datatype == "BOOL" else rng.integers(0, 100, size=(2, 5))).astype(
        DATATYPES[datatype]
    )
    raw = tensor_to_raw(array, datatype)
    doc = {
        "inputs": [{"name": "t", "datatype": datatype, "shape": [2, 5], "parameters": {"binary_data_size": len(raw)}}]
    }
    decoded = decode(one_tensor_model(datatype, (-1, 5)), doc, raw).inputs["t"]
    assert decoded.dtype == DATATYPES[datatype]
    np.testing.assert_array_equal(decoded, array)


def test_binary_and_json_inputs_mix_and_bytes_are_length_prefixed() -> None:
    model = make_text_model()
    raw = tensor_to_raw(np.array([b"ab", b"", "caf\u00e9"], dtype=object), "BYTES")
    assert raw == b"\x02\x00\x00\x00ab\x00\x00\x00\x00\x05\x00\x00\x00caf\xc3\xa9"
    doc = {
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [3], "parameters": {"binary_data_size": len(raw)}}]
    }
    assert decode(model, doc, raw).inputs["text"].tolist() == [b"ab", b"", "caf\u00e9".encode()]
    doc = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": ["x", "\u00e9"]}]}
    assert decode(model, doc).inputs["text"].tolist() == [b"x", "\u00e9".encode()]


def _math_input(index: int, **changes: Any) -> dict[str, Any]:
    doc = math_doc()
    doc["inputs"][index].update(changes)
    return doc


def _math_input_without(index: int, key: str) -> dict[str, Any]:
    doc = math_doc()
    doc["inputs"][index].pop(key)
    return doc


BAD_DOCS: list[tuple[object, str]] = [
    ([1, 2], "must be a JSON object"),
    ({}, "'inputs' must be an array"),
    ({"inputs": {}}, "'inputs' must be an array"),
    ({"inputs": [3]}, "each input must be a JSON object"),
    (math_doc(id=5), "'id' must be a string"),
    (math_doc(parameters=[]), "'parameters' must be a JSON object"),
    (math_doc(parameters={"priority": -1}), "'priority' must be a non-negative integer"),
    (math_doc(parameters={"priority": True}), "'priority' must be a non-negative integer"),
    (math_doc(parameters={"timeout": 1.5}), "'timeout' must be a non-negative integer"),
    (math_doc(parameters={"binary_data_output": 1}), "'binary_data_output' must be true or false"),
    ({"inputs": [math_doc()["inputs"][0]]}, "missing inputs ['ids']"),
    ({"inputs": [*math_doc()["inputs"], math_doc()["inputs"][0]]}, "input 'x' appears more than once"),
    (_math_input(0, name="y"), "unknown input 'y'; the model's inputs are ['ids', 'x']"),
    (_math_input(0, name=7), "non-empty string 'name'"),
    (_math_input(0, datatype="FP64"), "input 'x' has datatype 'FP64'; the model expects FP32"),
    (_math_input(0, shape=[6]), "input 'x' has shape [6]; the model expects [-1, 3]"),
    (_math_input(0, shape=[3, 2]), "input 'x' has shape [3, 2]; the model expects [-1, 3]"),
    (_math_input(1, shape=[-2, 2]), "has a negative dimension"),
    (_math_input(1, shape=[2.0, 2]), "'shape' must be a list of integers"),
    (_math_input(1, shape=[True, 4]), "'shape' must be a list of integers"),
    (_math_input(1, shape="2,2"), "'shape' must be a list of integers"),
    (_math_input(1, data=[1, 2, 3]), "input 'ids' has 3 elements but shape [2, 2] needs 4"),
    (_math_input(1, data=[[1, 2], [3]]), "ragged"),
    (_math_input(1, data=[[1, 2], 3, 4]), "ragged"),
    (_math_input(1, data=[[[1]], [[2]], [[3]], [[4]]]), "nested deeper than its shape"),
    (_math_input(0, data=[1, 2, 3, 4, 5, "6"]), "FP32 data must be numbers, got ['str']"),
    (_math_input(0, data=[1, 2, 3, 4, 5, None]), "FP32 data must be numbers, got ['NoneType']"),
    (_math_input(0, data=[1, 2, 3, 4, 5, {}]), "FP32 data must be numbers, got ['dict']"),
    (_math_input(1, data=[1, 2, 3, 4.5]), "INT64 data must be integers, got ['float']"),
    (_math_input(1, data=[1, 2, 3, True]), "INT64 data must be integers, got ['bool']"),
    (_math_input(1, data=[1, 2, 3, 2**64]), "out of range for INT64"),
    (_math_input(1, data="1234"), "'data' must be an array"),
    (_math_input_without(1, "data"), "neither 'data' nor 'binary_data_size'"),
    (_math_input(1, parameters={"binary_data_size": 32}), "both 'data' and 'binary_data_size'"),
    (_math_input(1, parameters={"shared_memory_region": "r"}), "shared memory extension is not supported"),
    (_math_input(1, parameters=3), "'parameters' must be a JSON object"),
    (math_doc(outputs={}), "'outputs' must be an array"),
    (math_doc(outputs=[{"name": "nope"}]), "unknown outputs ['nope']"),
    (math_doc(outputs=[{"name": "doubled"}, {"name": "doubled"}]), "requested more than once"),
    (math_doc(outputs=[{}]), "string 'name'"),
    (math_doc(outputs=[{"name": "doubled", "parameters": {"classification": 3}}]), "classification extension"),
    (math_doc(outputs=[{"name": "doubled", "parameters": {"binary_data": "yes"}}]), "'binary_data' must be true"),
]


@pytest.mark.parametrize(("doc", "message"), BAD_DOCS)
def test_malformed_json_requests_name_the_problem(doc: object, message: str) -> None:
    with pytest.raises(InvalidInput) as info:
        decode(make_math_model(), doc)
    assert message in info.value.message


@pytest.mark.parametrize(
    ("datatype", "data", "message"),
    [
        ("UINT8", [256], "out of range for UINT8"),
        ("UINT64", [-1], "out of range for UINT64"),
        ("INT8", [-129], "out of range for INT8"),
        ("BOOL", [1], "BOOL data must be true/false, got ['int']"),
        ("BYTES", [1], "BYTES data must be strings, got ['int']"),
        ("BYTES", ["\ud800"], "not valid Unicode"),
        ("FP16", [10**400], "out of range for FP16"),
    ],
)
def test_element_values_are_checked_per_datatype(datatype: str, data: list[Any], message: str) -> None:
    doc = {"inputs": [{"name": "t", "datatype": datatype, "shape": [len(data)], "data": data}]}
    with pytest.raises(InvalidInput, match=message.replace("[", r"\[").replace("]", r"\]")):
        decode(one_tensor_model(datatype), doc)


def test_values_beyond_the_float_range_become_infinity() -> None:
    doc = {"inputs": [{"name": "t", "datatype": "FP16", "shape": [2], "data": [1e300, -1e300]}]}
    assert decode(one_tensor_model("FP16"), doc).inputs["t"].tolist() == [np.inf, -np.inf]


@pytest.mark.parametrize(
    ("body", "header_length", "message"),
    [
        (b"{not json", None, "not valid JSON"),
        (b"\xff\xfe", None, "not valid JSON"),
        (b"[" * 30_000 + b"]" * 30_000, None, "nested too deeply"),
        (b'{"inputs": [], "id": ' + b"1" * 5000 + b"}", None, "not valid JSON"),
        (b"{}", "abc", "Inference-Header-Content-Length must be an integer"),
        (b"{}", "-1", "Inference-Header-Content-Length must be an integer"),
        (b"{}", "3", "Inference-Header-Content-Length must be an integer"),
        (b"{}", "9" * 40, "Inference-Header-Content-Length must be an integer"),
    ],
)
def test_malformed_bodies_and_headers(body: bytes, header_length: str | None, message: str) -> None:
    model = make_math_model()
    with pytest.raises(InvalidInput, match=message):
        decode_infer_request(body, header_length, inputs=model.inputs, outputs=model.outputs, limits=LIMITS)


def _binary_doc(datatype: str, shape: list[int], size: object) -> dict[str, Any]:
    return {"inputs": [{"name": "t", "datatype": datatype, "shape": shape, "parameters": {"binary_data_size": size}}]}


@pytest.mark.parametrize(
    ("datatype", "shape", "size", "binary", "message"),
    [
        ("FP32", [2], 8, b"\x00" * 12, "12 bytes of binary data but the inputs declare 8"),
        ("FP32", [2], 8, b"\x00" * 4, "'binary_data_size' runs past the end of the body"),
        ("FP32", [2], 4, b"\x00" * 4, "4 bytes of binary data but shape [2] of FP32 needs 8"),
        ("FP32", [2], -8, b"\x00" * 8, "'binary_data_size' must be a non-negative integer"),
        ("FP32", [2], "8", b"\x00" * 8, "'binary_data_size' must be a non-negative integer"),
        ("BOOL", [2], 2, b"\x01\x02", "BOOL bytes must be 0 or 1"),
        ("BYTES", [2], 6, b"\x01\x00\x00\x00a\x00", "BYTES data ends after 1 of 2 elements"),
        ("BYTES", [1], 6, b"\x09\x00\x00\x00ab", "claims 9 bytes past the data's end"),
        ("BYTES", [1], 6, b"\x01\x00\x00\x00ab", "1 bytes left over after 1 BYTES elements"),
    ],
)
def test_malformed_binary_tensors(datatype: str, shape: list[int], size: object, binary: bytes, message: str) -> None:
    with pytest.raises(InvalidInput, match=message.replace("[", r"\[").replace("]", r"\]")):
        decode(one_tensor_model(datatype), _binary_doc(datatype, shape, size), binary)


def test_limits_raise_payload_too_large_before_decoding() -> None:
    model = one_tensor_model("FP32")
    with pytest.raises(PayloadTooLarge, match="1001 elements; the limit is 1000"):
        decode(model, {"inputs": [{"name": "t", "datatype": "FP32", "shape": [1001], "data": []}]})
    small = CodecLimits(max_elements_per_tensor=1000, max_total_bytes=100, max_json_bytes=1 << 20)
    with pytest.raises(PayloadTooLarge, match="exceed 100 bytes"):
        decode(model, {"inputs": [{"name": "t", "datatype": "FP32", "shape": [26], "data": []}]}, limits=small)
    with pytest.raises(PayloadTooLarge, match="exceed 100 bytes"):
        decode(
            one_tensor_model("BYTES"),
            {"inputs": [{"name": "t", "datatype": "BYTES", "shape": [1], "data": ["x" * 101]}]},
            limits=small,
        )
    tiny_json = CodecLimits(max_json_bytes=10)
    with pytest.raises(PayloadTooLarge, match="JSON request header has"):
        decode(model, {"inputs": []}, limits=tiny_json)


def test_two_tensors_share_the_total_byte_budget() -> None:
    model = make_math_model()
    doc = math_doc()
    limits = CodecLimits(max_total_bytes=24 + 31)  # x needs 24 bytes, ids 32
    with pytest.raises(PayloadTooLarge):
        decode(model, doc, limits=limits)
    assert decode(model, doc, limits=CodecLimits(max_total_bytes=24 + 32)).inputs["ids"].size == 4


@pytest.mark.parametrize("value", [0, -1, 1.5, True])
def test_codec_limits_reject_non_positive_or_non_integer_values(value: object) -> None:
    with pytest.raises(ValueError, match="max_total_bytes must be a positive integer"):
        CodecLimits(max_total_bytes=value)  # type: ignore[arg-type]


def test_encode_json_and_binary_outputs_with_header_length() -> None:
    model = make_math_model()
    request = InferRequest(
        inputs={}, outputs=(RequestedOutput("id_sum", False), RequestedOutput("doubled", True)), id="abc"
    )
    doubled = np.arange(6, dtype=np.float32).reshape(2, 3)
    body, header_length = encode_infer_response(
        model_name="math",
        model_version="1",
        request=request,
        results={"doubled": doubled, "id_sum": np.array([3, 7])},
        outputs=model.outputs,
    )
    assert header_length is not None
    header = json.loads(body[:header_length])
    assert header["id"] == "abc" and header["model_name"] == "math" and header["model_version"] == "1"
    assert header["outputs"][0] == {"name": "id_sum", "datatype": "INT64", "shape": [2], "data": [3, 7]}
    assert header["outputs"][1] == {
        "name": "doubled",
        "datatype": "FP32",
        "shape": [2, 3],
        "parameters": {"binary_data_size": 24},
    }
    np.testing.assert_array_equal(np.frombuffer(body[header_length:], dtype=np.float32).reshape(2, 3), doubled)


def test_encode_casts_to_the_declared_datatype_and_reports_problems() -> None:
    model = make_text_model()
    request = InferRequest(inputs={}, outputs=(RequestedOutput("length", False), RequestedOutput("upper", False)))
    body, header_length = encode_infer_response(
        model_name="text",
        model_version="1",
        request=request,
        results={"length": np.array([2.0]), "upper": np.array([b"\xc3\xa9"], dtype=object)},
        outputs=model.outputs,
    )
    assert header_length is None
    outputs = json.loads(body)["outputs"]
    assert outputs[0]["data"] == [2] and outputs[1]["data"] == ["\u00e9"]
    with pytest.raises(InvalidInput, match="request it with binary_data"):
        encode_infer_response(
            model_name="text",
            model_version="1",
            request=request,
            results={"length": np.array([1]), "upper": np.array([b"\xff"], dtype=object)},
            outputs=model.outputs,
        )
    with pytest.raises(FleetserveError, match="returned no output 'upper'") as info:
        encode_infer_response(
            model_name="text",
            model_version="1",
            request=request,
            results={"length": np.array([1])},
            outputs=model.outputs,
        )
    assert info.value.http_status == 500


@given(st.lists(st.binary(max_size=40), max_size=20))
def test_bytes_serialization_round_trips(items: list[bytes]) -> None:
    raw = tensor_to_raw(objects(items), "BYTES")
    assert deserialize_bytes("t", memoryview(raw), len(items)).tolist() == items


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(NUMERIC).flatmap(
        lambda dt: st.tuples(
            st.just(dt),
            hnp.arrays(
                DATATYPES[dt],
                hnp.array_shapes(min_dims=2, max_dims=2, max_side=6),
                elements={"allow_nan": False} if dt.startswith("FP") else None,
            ),
        )
    )
)
def test_json_and_binary_decoding_agree_with_the_array(case: tuple[str, np.ndarray]) -> None:
    datatype, array = case
    model = one_tensor_model(datatype, (-1, -1))
    shape = list(array.shape)
    as_json = {"inputs": [{"name": "t", "datatype": datatype, "shape": shape, "data": array.tolist()}]}
    np.testing.assert_array_equal(decode(model, as_json).inputs["t"], array)
    raw = tensor_to_raw(array, datatype)
    np.testing.assert_array_equal(decode(model, _binary_doc(datatype, shape, len(raw)), raw).inputs["t"], array)


@settings(max_examples=200, deadline=None)
@given(doc=JSON_VALUES, which=st.sampled_from(sorted(MODELS)))
def test_arbitrary_json_is_rejected_with_a_client_error(doc: object, which: str) -> None:
    model = MODELS[which]
    try:
        decoded = decode_infer_request(json.dumps(doc).encode(), None, inputs=model.inputs, outputs=model.outputs,
                                       limits=LIMITS)
    except (InvalidInput, PayloadTooLarge) as exc:
        assert str(exc), "a client error names the problem"
        return
    # Random JSON that happens to be a valid request decodes to exactly the model's inputs.
    assert sorted(decoded.inputs) == sorted(spec.name for spec in model.inputs)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(request=requests(), header_delta=st.sampled_from([None, 0, 0, 0, -1, 1]))
def test_plausible_requests_decode_to_the_models_specs_or_are_rejected_with_a_client_error(
    request: tuple[FakeModel, dict[str, Any], bytes], header_delta: int | None
) -> None:
    model, doc, binary = request
    header = json.dumps(doc).encode()
    body, header_length = (header, None) if header_delta is None else (header + binary, str(len(header) + header_delta))
    try:
        decoded = decode_infer_request(body, header_length, inputs=model.inputs, outputs=model.outputs, limits=LIMITS)
    except (InvalidInput, PayloadTooLarge):
        return
    for spec in model.inputs:
        array = decoded.inputs[spec.name]
        assert array.dtype == DATATYPES[spec.datatype]
        assert len(array.shape) == len(spec.shape)
        assert all(want in (-1, got) for want, got in zip(spec.shape, array.shape, strict=True))
