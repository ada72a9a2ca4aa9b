"""Decode and encode KServe v2 / Open Inference Protocol tensors; pure functions, no transport.

Covers the REST inference request and response of the Open Inference Protocol
(https://github.com/kserve/open-inference-protocol) and its *binary tensor data* extension as Triton
defines it: a JSON header of ``Inference-Header-Content-Length`` bytes, then the raw little-endian bytes
of each tensor that declares ``parameters.binary_data_size``, in order; raw BYTES elements each carry a
4-byte little-endian length prefix. The gRPC front end reuses the tensor-level functions.

Malformed requests raise :class:`~fleetserve.errors.InvalidInput` naming the problem; requests beyond
:class:`CodecLimits` raise :class:`~fleetserve.errors.PayloadTooLarge`. Numeric tensors are converted by
numpy in C loops; only BYTES elements, separate Python objects anyway, are touched one by one.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np

from fleetserve import wire
from fleetserve.engine.base import TensorSpec
from fleetserve.errors import FleetserveError, InvalidInput, PayloadTooLarge

# v2 datatype -> numpy dtype, from the wire contract's table (little-endian, the wire order of raw tensors).
DATATYPES: dict[str, np.dtype] = {name: np.dtype(code) for name, code in wire.DATATYPES.items()}
# Python element types a JSON array (or typed gRPC contents) may hold for each datatype.
_ELEMENT_TYPES: dict[str, frozenset[type]] = {name: frozenset({int}) for name in DATATYPES}
_ELEMENT_TYPES |= {name: frozenset({int, float}) for name in ("FP16", "FP32", "FP64")}
_ELEMENT_TYPES |= {"BOOL": frozenset({bool}), "BYTES": frozenset({str, bytes})}
_LENGTH = struct.Struct("<I")
HEADER_LENGTH = wire.BINARY_HEADER_LENGTH


@dataclass(frozen=True)
class CodecLimits:
    """Bounds on one inference request, checked before any tensor memory is allocated."""

    max_elements_per_tensor: int = 1 << 24
    max_total_bytes: int = 64 << 20  # decoded bytes of all input tensors of one request
    max_json_bytes: int = 16 << 20  # the JSON part of a request body

    def __post_init__(self) -> None:
        for field_name in ("max_elements_per_tensor", "max_total_bytes", "max_json_bytes"):
            value = getattr(self, field_name)
            if type(value) is not int or value < 1:
                raise ValueError(f"CodecLimits.{field_name} must be a positive integer, got {value!r}")


@dataclass(frozen=True)
class RequestedOutput:
    name: str
    binary: bool


@dataclass
class InferRequest:
    """A decoded request: validated input arrays and the outputs to return, in order."""

    inputs: dict[str, np.ndarray]
    outputs: tuple[RequestedOutput, ...]
    id: str | None = None
    priority: int | None = None
    timeout_s: float | None = None


@dataclass(frozen=True)
class TensorHeader:
    """An input's name, datatype and shape after checking them against the model."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    count: int


class InputCollector:
    """Checks a request's input tensors against the model's specs and the limits, one at a time."""

    def __init__(self, specs: Sequence[TensorSpec], limits: CodecLimits) -> None:
        self._specs = {s.name: s for s in specs}
        self._limits = limits
        self._seen: set[str] = set()
        self._bytes = 0
        self.arrays: dict[str, np.ndarray] = {}

    def header(self, name: object, datatype: object, shape: object) -> TensorHeader:
        if not isinstance(name, str) or not name:
            raise InvalidInput("every input needs a non-empty string 'name'")
        spec = self._specs.get(name)
        if spec is None:
            raise InvalidInput(f"unknown input {name!r}; the model's inputs are {sorted(self._specs)}")
        if name in self._seen:
            raise InvalidInput(f"input {name!r} appears more than once")
        self._seen.add(name)
        if datatype != spec.datatype:
            raise InvalidInput(f"input {name!r} has datatype {datatype!r}; the model expects {spec.datatype}")
        if datatype not in DATATYPES:
            raise InvalidInput(f"input {name!r}: datatype {datatype} is not supported by this server")
        dims = _check_shape(name, shape)
        if len(dims) != len(spec.shape) or any(w not in (-1, d) for w, d in zip(spec.shape, dims, strict=True)):
            raise InvalidInput(f"input {name!r} has shape {list(dims)}; the model expects {list(spec.shape)}")
        count, limit = math.prod(dims), self._limits.max_elements_per_tensor
        if count > limit:
            raise PayloadTooLarge(f"input {name!r} has {count} elements; the limit is {limit}")
        if spec.datatype != "BYTES":
            self._account(count * DATATYPES[spec.datatype].itemsize)
        return TensorHeader(name, spec.datatype, dims, count)

    def add(self, header: TensorHeader, array: np.ndarray) -> None:
        if header.datatype == "BYTES":
            self._account(sum(map(len, array.ravel().tolist())))
        self.arrays[header.name] = array

    def finish(self) -> dict[str, np.ndarray]:
        missing = sorted(set(self._specs) - self._seen)
        if missing:
            raise InvalidInput(f"missing inputs {missing}; the model needs {sorted(self._specs)}")
        return self.arrays

    def _account(self, nbytes: int) -> None:
        self._bytes += nbytes
        if self._bytes > self._limits.max_total_bytes:
            raise PayloadTooLarge(f"the request's input tensors exceed {self._limits.max_total_bytes} bytes")


def _check_shape(name: str, shape: object) -> tuple[int, ...]:
    if not isinstance(shape, list | tuple) or any(type(d) is not int for d in shape):
        raise InvalidInput(f"input {name!r}: 'shape' must be a list of integers")
    if any(d < 0 for d in shape):
        raise InvalidInput(f"input {name!r}: shape {list(shape)} has a negative dimension")
    return tuple(shape)


def values_to_array(header: TensorHeader, data: object) -> np.ndarray:
    """Elements given as a (possibly nested, row-major) list: JSON ``data`` or typed gRPC contents."""
    name, datatype = header.name, header.datatype
    if not isinstance(data, list):
        raise InvalidInput(f"input {name!r}: 'data' must be an array")
    try:
        # dtype=object discovers the nesting without converting elements, so a long string cannot make
        # numpy allocate a huge fixed-width string array; ragged rows stay behind as list elements.
        nested = np.array(data, dtype=object)
    except (ValueError, TypeError) as e:
        raise InvalidInput(f"input {name!r}: 'data' is not a regular nested array ({e})") from None
    if nested.ndim > max(len(header.shape), 1):
        raise InvalidInput(f"input {name!r}: 'data' is nested deeper than its shape {list(header.shape)}")
    flat = nested.ravel().tolist()
    kinds = set(map(type, flat))
    allowed = _ELEMENT_TYPES[datatype]
    if not kinds <= allowed:
        if list in kinds:
            raise InvalidInput(f"input {name!r}: nested 'data' arrays are ragged")
        got = sorted(t.__name__ for t in kinds - allowed)
        words = {"BOOL": "true/false", "BYTES": "strings"}.get(datatype, "numbers" if "FP" in datatype else "integers")
        raise InvalidInput(f"input {name!r}: {datatype} data must be {words}, got {got}")
    if len(flat) != header.count:
        raise InvalidInput(
            f"input {name!r} has {len(flat)} elements but shape {list(header.shape)} needs {header.count}"
        )
    if datatype == "BYTES":
        array = np.empty(len(flat), dtype=object)
        try:
            array[:] = [s.encode("utf-8") if isinstance(s, str) else s for s in flat]
        except UnicodeEncodeError:
            raise InvalidInput(f"input {name!r}: a string is not valid Unicode") from None
        return array.reshape(header.shape)
    try:
        with np.errstate(over="ignore"):  # floats beyond FP16/FP32 range become inf, as IEEE casts do
            return np.array(flat, dtype=DATATYPES[datatype]).reshape(header.shape)
    except OverflowError:
        raise InvalidInput(f"input {name!r}: a value is out of range for {datatype}") from None


def raw_to_array(header: TensorHeader, raw: bytes | memoryview) -> np.ndarray:
    """Elements given as raw bytes. The result may be a read-only view on ``raw``."""
    if header.datatype == "BYTES":
        return deserialize_bytes(header.name, memoryview(raw), header.count).reshape(header.shape)
    dtype = DATATYPES[header.datatype]
    expected = header.count * dtype.itemsize
    if len(raw) != expected:
        raise InvalidInput(
            f"input {header.name!r} has {len(raw)} bytes of binary data but shape {list(header.shape)} "
            f"of {header.datatype} needs {expected}"
        )
    array = np.frombuffer(raw, dtype=dtype)
    if header.datatype == "BOOL" and array.size and array.view(np.uint8).max() > 1:
        raise InvalidInput(f"input {header.name!r}: BOOL bytes must be 0 or 1")
    return array.reshape(header.shape)


def deserialize_bytes(name: str, raw: memoryview, count: int) -> np.ndarray:
    """``count`` length-prefixed elements that must fill ``raw`` exactly."""
    out = np.empty(count, dtype=object)
    offset, size = 0, len(raw)
    for i in range(count):
        if offset + _LENGTH.size > size:
            raise InvalidInput(f"input {name!r}: BYTES data ends after {i} of {count} elements")
        (length,) = _LENGTH.unpack_from(raw, offset)
        offset += _LENGTH.size
        if offset + length > size:
            raise InvalidInput(f"input {name!r}: BYTES element {i} claims {length} bytes past the data's end")
        out[i] = bytes(raw[offset : offset + length])
        offset += length
    if offset != size:
        raise InvalidInput(f"input {name!r}: {size - offset} bytes left over after {count} BYTES elements")
    return out


def tensor_to_raw(array: np.ndarray, datatype: str) -> bytes:
    """The binary form of a tensor: little-endian elements, or length-prefixed BYTES elements."""
    if datatype != "BYTES":
        return np.ascontiguousarray(array, dtype=DATATYPES[datatype]).tobytes()
    items = [x if isinstance(x, bytes) else str(x).encode("utf-8") for x in array.ravel().tolist()]
    return b"".join(chain.from_iterable(zip(map(_LENGTH.pack, map(len, items)), items, strict=True)))


def request_options(parameters: Mapping[str, object]) -> tuple[int | None, float | None]:
    """``priority`` and ``timeout`` (microseconds, as in Triton) from request parameters; 0 means unset."""
    values: list[int | None] = []
    for key in ("priority", "timeout"):
        value = parameters.get(key, 0)
        if type(value) is not int or value < 0:
            raise InvalidInput(f"parameter {key!r} must be a non-negative integer, got {value!r}")
        values.append(value or None)
    priority, timeout_us = values
    return priority, None if timeout_us is None else timeout_us / 1e6


def resolve_outputs(
    requested: Sequence[RequestedOutput] | None, specs: Sequence[TensorSpec], default_binary: bool
) -> tuple[RequestedOutput, ...]:
    """The outputs to return: those requested (checked), or every model output."""
    if requested is None:
        return tuple(RequestedOutput(s.name, default_binary) for s in specs)
    known = {s.name for s in specs}
    names = [r.name for r in requested]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise InvalidInput(f"unknown outputs {unknown}; the model's outputs are {sorted(known)}")
    if len(set(names)) != len(names):
        raise InvalidInput(f"an output is requested more than once: {names}")
    return tuple(requested)


def decode_infer_request(
    body: bytes,
    header_length: str | None,
    *,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    limits: CodecLimits,
) -> InferRequest:
    """Decode a REST inference request body (``header_length``: the binary extension's header, or None)."""
    doc, binary = _split_body(body, header_length, limits)
    request_id = doc.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidInput("'id' must be a string")
    params = _object(doc.get("parameters", {}), "'parameters'")
    default_binary = params.get("binary_data_output", False)
    if not isinstance(default_binary, bool):
        raise InvalidInput("parameter 'binary_data_output' must be true or false")
    priority, timeout_s = request_options(params)

    entries = doc.get("inputs")
    if not isinstance(entries, list):
        raise InvalidInput("'inputs' must be an array of tensors")
    collector = InputCollector(inputs, limits)
    offset = 0
    for entry in entries:
        tensor = _object(entry, "each input")
        header = collector.header(tensor.get("name"), tensor.get("datatype"), tensor.get("shape"))
        tensor_params = _object(tensor.get("parameters", {}), f"input {header.name!r} 'parameters'")
        if "shared_memory_region" in tensor_params:
            raise InvalidInput(f"input {header.name!r}: the shared memory extension is not supported")
        size = tensor_params.get("binary_data_size")
        if size is None:
            if "data" not in tensor:
                raise InvalidInput(f"input {header.name!r} has neither 'data' nor 'binary_data_size'")
            collector.add(header, values_to_array(header, tensor["data"]))
            continue
        if "data" in tensor:
            raise InvalidInput(f"input {header.name!r} has both 'data' and 'binary_data_size'")
        if type(size) is not int or size < 0:
            raise InvalidInput(f"input {header.name!r}: 'binary_data_size' must be a non-negative integer")
        if offset + size > len(binary):
            raise InvalidInput(f"input {header.name!r}: 'binary_data_size' runs past the end of the body")
        collector.add(header, raw_to_array(header, binary[offset : offset + size]))
        offset += size
    if offset != len(binary):
        raise InvalidInput(f"the body has {len(binary)} bytes of binary data but the inputs declare {offset}")
    return InferRequest(
        inputs=collector.finish(),
        outputs=resolve_outputs(_requested_outputs(doc.get("outputs"), default_binary), outputs, default_binary),
        id=request_id,
        priority=priority,
        timeout_s=timeout_s,
    )


def _split_body(body: bytes, header_length: str | None, limits: CodecLimits) -> tuple[dict, memoryview]:
    size = len(body)
    if header_length is not None:
        text = header_length.strip()
        if not (text.isascii() and text.isdigit()) or len(text) > 19 or int(text) > size:
            raise InvalidInput(f"{HEADER_LENGTH} must be an integer between 0 and the body size {size}")
        size = int(text)
    if size > limits.max_json_bytes:
        raise PayloadTooLarge(f"the JSON request header has {size} bytes; the limit is {limits.max_json_bytes}")
    try:
        doc = json.loads(body[:size])
    except RecursionError:
        raise InvalidInput("the request JSON is nested too deeply") from None
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError
        raise InvalidInput(f"the request body is not valid JSON: {e}") from None
    return _object(doc, "the request body"), memoryview(body)[size:]


def _object(value: object, what: str) -> dict:
    if not isinstance(value, dict):
        raise InvalidInput(f"{what} must be a JSON object")
    return value


def _requested_outputs(entries: object, default_binary: bool) -> list[RequestedOutput] | None:
    if entries is None:
        return None
    if not isinstance(entries, list):
        raise InvalidInput("'outputs' must be an array")
    requested = []
    for entry in entries:
        tensor = _object(entry, "each requested output")
        name = tensor.get("name")
        if not isinstance(name, str):
            raise InvalidInput("every requested output needs a string 'name'")
        params = _object(tensor.get("parameters", {}), f"output {name!r} 'parameters'")
        if params.get("classification"):
            raise InvalidInput(f"output {name!r}: the classification extension is not supported")
        if "shared_memory_region" in params:
            raise InvalidInput(f"output {name!r}: the shared memory extension is not supported")
        binary = params.get("binary_data", default_binary)
        if not isinstance(binary, bool):
            raise InvalidInput(f"output {name!r}: 'binary_data' must be true or false")
        requested.append(RequestedOutput(name, binary))
    return requested


def output_array(results: Mapping[str, np.ndarray], name: str, datatype: str) -> np.ndarray:
    if name not in results:
        raise FleetserveError(f"the model returned no output {name!r}")
    return np.asarray(results[name], dtype=DATATYPES[datatype])


def _json_values(array: np.ndarray, name: str, datatype: str) -> list:
    values = array.ravel().tolist()
    if datatype != "BYTES":
        return values
    try:
        return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in values]
    except UnicodeDecodeError:
        raise InvalidInput(f"output {name!r} is not UTF-8 text; request it with binary_data") from None


def encode_infer_response(
    *,
    model_name: str,
    model_version: str,
    request: InferRequest,
    results: Mapping[str, np.ndarray],
    outputs: Sequence[TensorSpec],
) -> tuple[bytes, int | None]:
    """The REST response body and, when any output is binary, the JSON header's length."""
    datatypes = {s.name: s.datatype for s in outputs}
    entries: list[dict[str, object]] = []
    chunks: list[bytes] = []
    for wanted in request.outputs:
        datatype = datatypes[wanted.name]
        array = output_array(results, wanted.name, datatype)
        entry: dict[str, object] = {"name": wanted.name, "datatype": datatype, "shape": list(array.shape)}
        if wanted.binary:
            raw = tensor_to_raw(array, datatype)
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            entry["data"] = _json_values(array, wanted.name, datatype)
        entries.append(entry)
    doc: dict[str, object] = {"model_name": model_name, "model_version": model_version, "outputs": entries}
    if request.id is not None:
        doc["id"] = request.id
    header = json.dumps(doc, separators=(",", ":")).encode("utf-8")
    if not chunks:
        return header, None
    return b"".join([header, *chunks]), len(header)
