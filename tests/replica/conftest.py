"""Fakes for the KServe front-end tests: served models computing outputs with numpy, and request fuzzers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from hypothesis import strategies as st

from fleetserve.engine.base import TensorSpec
from fleetserve.replica.codec import DATATYPES, CodecLimits, tensor_to_raw
from fleetserve.replica.model import ModelRepository

Transform = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


@dataclass
class InferCall:
    inputs: dict[str, np.ndarray]
    priority: int | None
    timeout_s: float | None


@dataclass
class FakeModel:
    """A ServedModel whose ``infer`` applies ``transform``; can be made unready, failing or held on a gate."""

    name: str
    inputs: Sequence[TensorSpec]
    outputs: Sequence[TensorSpec]
    transform: Transform
    version: str = "1"
    platform: str = "fake_numpy"
    max_batch_size: int = 8
    ready: bool = True
    error: Exception | None = None
    gate: asyncio.Event | None = None  # when set, infer waits for it: lets a test hold requests in flight
    calls: list[InferCall] = field(default_factory=list)

    def is_ready(self) -> bool:
        return self.ready

    async def infer(
        self, inputs: dict[str, np.ndarray], *, priority: int | None, timeout_s: float | None,
        outputs: Sequence[str] | None = None,
    ) -> dict[str, np.ndarray]:
        self.calls.append(InferCall(inputs, priority, timeout_s))
        if self.gate is not None:
            await self.gate.wait()
        if self.error is not None:
            raise self.error
        return self.transform(inputs)


def make_math_model() -> FakeModel:
    """``doubled = 2 * x`` (FP32) and ``id_sum = ids.sum(axis=1)`` (INT64)."""
    return FakeModel(
        name="math",
        inputs=[TensorSpec("x", "FP32", (-1, 3)), TensorSpec("ids", "INT64", (-1, -1))],
        outputs=[TensorSpec("doubled", "FP32", (-1, 3)), TensorSpec("id_sum", "INT64", (-1,))],
        transform=lambda t: {"doubled": t["x"] * 2, "id_sum": t["ids"].sum(axis=1)},
    )


def make_text_model() -> FakeModel:
    """``upper`` = upper-cased BYTES ``text``, ``length`` = byte length of each element (INT32)."""

    def transform(t: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        items = t["text"].ravel().tolist()
        upper = np.array([s.upper() for s in items], dtype=object).reshape(t["text"].shape)
        length = np.array([len(s) for s in items], dtype=np.int32).reshape(t["text"].shape)
        return {"upper": upper, "length": length}

    return FakeModel(
        name="text",
        inputs=[TensorSpec("text", "BYTES", (-1,))],
        outputs=[TensorSpec("upper", "BYTES", (-1,)), TensorSpec("length", "INT32", (-1,))],
        transform=transform,
    )


@pytest.fixture
def math_model() -> FakeModel:
    return make_math_model()


@pytest.fixture
def text_model() -> FakeModel:
    return make_text_model()


@pytest.fixture
def repo(math_model: FakeModel, text_model: FakeModel) -> ModelRepository:
    return ModelRepository([math_model, text_model])


@pytest.fixture
def limits() -> CodecLimits:
    return CodecLimits(max_elements_per_tensor=10_000, max_total_bytes=1 << 20, max_json_bytes=1 << 20)


# Hypothesis strategies for fuzzing the codec: arbitrary JSON, and mostly valid requests for the fakes.
MODELS = {"math": make_math_model(), "text": make_text_model()}
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda children: st.lists(children, max_size=6) | st.dictionaries(st.text(max_size=8), children, max_size=6),
    max_leaves=40,
)
ELEMENTS = {
    "FP32": st.floats(width=32),
    "FP16": st.floats(width=16),
    "INT64": st.integers(-(2**63), 2**63 - 1),
    "BOOL": st.booleans(),
    "BYTES": st.text(max_size=4),
}
ANY_ELEMENT = st.integers(-(2**70), 2**70) | st.floats() | st.booleans() | st.text(max_size=3) | st.none()


def objects(items: list[Any]) -> np.ndarray:
    array = np.empty(len(items), dtype=object)
    array[:] = items
    return array


JUNK: st.SearchStrategy[Any] = (
    st.none() | st.booleans() | st.integers() | st.text(max_size=3) | st.lists(st.integers(), max_size=2) | st.just({})
)


def mostly(valid: st.SearchStrategy[Any], junk: st.SearchStrategy[Any] = JUNK) -> st.SearchStrategy[Any]:
    """``valid`` 19 times in 20, ``junk`` otherwise: deep paths get reached and every check gets hit."""
    # 7 rather than 0: hypothesis favours the bounds of a range, which would make junk far too common.
    return st.integers(0, 19).flatmap(lambda i: junk if i == 7 else valid)


@st.composite
def tensor(draw: st.DrawFn, spec: TensorSpec, binary: list[bytes]) -> dict[str, Any]:
    """A mostly valid input for ``spec``; binary ones append their bytes to ``binary``."""
    dims = [draw(st.integers(0, 3)) if d == -1 else d for d in spec.shape]
    datatype = draw(mostly(st.just(spec.datatype), st.sampled_from(sorted(ELEMENTS))))
    entry = {"name": draw(mostly(st.just(spec.name))), "datatype": draw(mostly(st.just(datatype)))}
    entry["shape"] = draw(mostly(st.just(dims), st.lists(st.integers(-2, 4), max_size=3) | JUNK))
    count = int(np.prod(dims))
    if draw(st.booleans()):
        if datatype == "BYTES":
            items = draw(st.lists(st.binary(max_size=5), min_size=count, max_size=count))
            raw = tensor_to_raw(objects(items), "BYTES")
        else:
            size = count * DATATYPES[datatype].itemsize
            raw = draw(mostly(st.binary(min_size=size, max_size=size), st.binary(max_size=9)))
        binary.append(raw)
        entry["parameters"] = {"binary_data_size": draw(mostly(st.just(len(raw)) | st.integers(-1, 40)))}
    else:
        element = draw(mostly(st.just(ELEMENTS[datatype]), st.just(ELEMENTS[datatype] | ANY_ELEMENT)))
        flat = draw(st.lists(element, min_size=count, max_size=count))
        entry["data"] = draw(mostly(st.just(objects(flat).reshape(dims).tolist())))
    if draw(st.integers(0, 19)) == 7:
        del entry[draw(st.sampled_from(sorted(entry)))]
    return entry


@st.composite
def requests(draw: st.DrawFn) -> tuple[FakeModel, dict[str, Any], bytes]:
    """A mostly valid request for one of the fake models: its JSON document and its binary tail."""
    model = MODELS[draw(st.sampled_from(sorted(MODELS)))]
    specs = draw(st.permutations(model.inputs))
    if draw(st.integers(0, 9)) == 7:
        specs.append(draw(st.sampled_from([*model.inputs, TensorSpec("y", "FP32", (-1,))])))
    binary: list[bytes] = []
    doc: dict[str, Any] = {"inputs": draw(mostly(st.just([draw(tensor(s, binary)) for s in specs])))}
    if draw(st.booleans()):
        doc["id"] = draw(mostly(st.text(max_size=4)))
    if draw(st.booleans()):
        options = {
            "priority": st.integers(-1, 5),
            "timeout": st.integers(-1, 10**7),
            "binary_data_output": st.booleans(),
        }
        doc["parameters"] = draw(mostly(st.fixed_dictionaries({}, optional={k: mostly(v) for k, v in options.items()})))
    if draw(st.booleans()):
        output = st.fixed_dictionaries(
            {"name": mostly(st.sampled_from([*(s.name for s in model.outputs), "nope"]))},
            optional={"parameters": st.fixed_dictionaries({}, optional={"binary_data": mostly(st.booleans())})},
        )
        doc["outputs"] = draw(mostly(st.lists(output, max_size=3)))
    return model, doc, b"".join(binary)
