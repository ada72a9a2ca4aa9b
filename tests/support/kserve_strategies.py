"""Hypothesis strategies that fuzz the KServe codec: arbitrary JSON, and mostly valid requests for the fakes."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st

from fleetserve.engine.base import TensorSpec
from fleetserve.replica.codec import DATATYPES, tensor_to_raw
from tests.support.fake_models import FakeModel, make_math_model, make_text_model

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
