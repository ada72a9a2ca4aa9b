"""TensorLayout: request validation, zero-padding collation and per-request output splitting."""

from __future__ import annotations

import numpy as np
import pytest

from fleetserve.batching.tensors import Request, TensorLayout
from fleetserve.engine.base import TensorSpec
from fleetserve.errors import InvalidInput

INPUTS = (
    TensorSpec("input_ids", "INT64", (-1, -1)),
    TensorSpec("attention_mask", "INT64", (-1, -1)),
)
OUTPUTS = (
    TensorSpec("last_hidden_state", "FP32", (-1, -1, 3)),
    TensorSpec("sentence_embedding", "FP32", (-1, 3)),
)


def layout(inputs: tuple[TensorSpec, ...] = INPUTS) -> TensorLayout:
    return TensorLayout(inputs, OUTPUTS, max_batch=4, max_seq=16)


def pair(rows: int, seq: int, start: int = 1) -> dict[str, np.ndarray]:
    ids = np.arange(start, start + rows * seq, dtype=np.int64).reshape(rows, seq)
    return {"input_ids": ids, "attention_mask": np.ones((rows, seq), dtype=np.int64)}


def test_sequence_inputs_are_the_variable_dim1_ones() -> None:
    mixed = (*INPUTS, TensorSpec("lang", "INT32", (-1, 1)))
    assert layout(mixed).sequence_inputs == ("input_ids", "attention_mask")


def test_a_valid_request_reports_rows_and_length_and_casts() -> None:
    request = layout().validate({"input_ids": np.ones((2, 5), dtype=np.int32), "attention_mask": [[1] * 5] * 2})
    assert (request.rows, request.seq) == (2, 5)
    assert all(a.dtype == np.int64 and a.flags.c_contiguous for a in request.arrays.values())


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ({"input_ids": np.ones((1, 2), np.int64)}, "missing input 'attention_mask'"),
        ({**pair(1, 2), "extra": np.ones((1, 2))}, "unknown input 'extra'"),
        ({**pair(1, 2), "input_ids": np.ones(2, np.int64)}, "input 'input_ids' has rank 1"),
        ({**pair(1, 2), "attention_mask": np.ones((1, 2), np.float32)}, "'attention_mask' has dtype float32"),
        ({**pair(1, 2), "input_ids": np.array([["a", "b"]])}, "'input_ids' has dtype <U1"),
        ({**pair(1, 2), "input_ids": [[1, 2], [3]]}, "'input_ids' is not a rectangular numeric array"),
        ({**pair(1, 2), "attention_mask": np.ones((2, 2), np.int64)}, "'attention_mask' has 2 rows but"),
        ({**pair(1, 2), "attention_mask": np.ones((1, 3), np.int64)}, "'attention_mask' has sequence length 3"),
        (pair(5, 2), "has 5 rows; at most 4 per request"),
        (pair(1, 17), "has sequence length 17; the maximum is 16"),
        (pair(1, 0), "'input_ids' has an empty dimension 1"),
        (pair(0, 2), "'input_ids' has an empty dimension 0"),
    ],
)
def test_bad_requests_name_the_tensor_and_the_problem(inputs: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        layout().validate(inputs)


def test_non_mapping_inputs_are_rejected() -> None:
    with pytest.raises(InvalidInput, match="inputs must map"):
        layout().validate([1, 2])  # type: ignore[arg-type]


def test_fixed_dimensions_must_match() -> None:
    fixed = (TensorSpec("features", "FP32", (-1, 3)),)
    with pytest.raises(InvalidInput, match="'features' has size 4 in dimension 1; expected 3"):
        layout(fixed).validate({"features": np.zeros((1, 4), np.float32)})


def test_narrowing_integer_casts_must_not_wrap() -> None:
    narrow = (TensorSpec("input_ids", "INT32", (-1, -1)),)
    assert layout(narrow).validate({"input_ids": np.full((1, 2), 7, np.int64)}).arrays["input_ids"].dtype == np.int32
    with pytest.raises(InvalidInput, match="'input_ids' has values outside the INT32 range"):
        layout(narrow).validate({"input_ids": np.full((1, 2), 2**40, np.int64)})



@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.int8, np.uint16])
@pytest.mark.parametrize(("value", "accepted"), [(0, True), (9, True), (10, False), (-1, False), (-128, False)])
def test_token_ids_must_lie_below_the_limit_whatever_their_dtype(dtype: type, value: int, accepted: bool) -> None:
    limited = (TensorSpec("input_ids", "INT64", (-1, -1), value_limit=10),)
    if value < 0 and np.dtype(dtype).kind == "u":
        pytest.skip("no negative values in an unsigned array")
    ids = np.array([[1, value, 2]], dtype=dtype)
    if accepted:
        assert layout(limited).validate({"input_ids": ids}).arrays["input_ids"].tolist() == [[1, value, 2]]
    else:
        with pytest.raises(InvalidInput, match=r"'input_ids' has values outside 0\.\.9"):
            layout(limited).validate({"input_ids": ids})


@pytest.mark.parametrize(("value", "accepted"), [(9.0, True), (10.0, False), (-1.0, False), (np.nan, False)])
def test_float_inputs_with_a_limit_are_checked_too(value: float, accepted: bool) -> None:
    limited = (TensorSpec("ids", "FP32", (-1, -1), value_limit=10),)
    ids = np.array([[1.0, value]], dtype=np.float32)
    if accepted:
        assert layout(limited).validate({"ids": ids}).rows == 1
    else:
        with pytest.raises(InvalidInput, match=r"'ids' has values outside 0\.\.9"):
            layout(limited).validate({"ids": ids})


def test_an_input_already_in_the_engine_dtype_is_not_copied() -> None:
    ids, mask = pair(1, 3)["input_ids"], pair(1, 3)["attention_mask"]
    arrays = layout().validate({"input_ids": ids, "attention_mask": mask}).arrays
    assert arrays["input_ids"] is ids and arrays["attention_mask"] is mask

@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (TensorSpec("x", "BYTES", (-1, -1)), "datatype BYTES"),
        (TensorSpec("x", "INT64", (1, -1)), "needs a variable dimension 0"),
        (TensorSpec("x", "INT64", ()), "needs a variable dimension 0"),
        (TensorSpec("x", "FP32", (-1, 4, -1)), "variable dimension past 1"),
    ],
)
def test_unbatchable_engine_inputs_are_refused(spec: TensorSpec, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        layout((spec,))


def test_collate_pads_sequence_inputs_with_zeros_and_stacks_rows() -> None:
    lay = layout()
    short = lay.validate(pair(1, 2, start=1))
    long = lay.validate(pair(2, 4, start=100))
    feeds = lay.collate([short, long], 8)
    assert feeds["input_ids"].shape == (3, 8)
    np.testing.assert_array_equal(feeds["input_ids"][0], [1, 2, 0, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(feeds["input_ids"][1:, :4], long.arrays["input_ids"])
    np.testing.assert_array_equal(feeds["attention_mask"].sum(axis=1), [2, 4, 4])
    assert not feeds["input_ids"][1:, 4:].any()


def test_collate_refuses_a_length_shorter_than_a_request() -> None:
    lay = layout()
    with pytest.raises(ValueError, match="longer than the batch"):
        lay.collate([lay.validate(pair(1, 5))], 4)


def test_collate_concatenates_non_sequence_inputs() -> None:
    lay = layout((TensorSpec("features", "FP32", (-1, 2)),))
    a = lay.validate({"features": np.ones((1, 2), np.float32)})
    b = lay.validate({"features": np.full((2, 2), 2.0, np.float32)})
    assert (a.seq, b.seq) == (0, 0)
    np.testing.assert_array_equal(lay.collate([a, b], 0)["features"][:, 0], [1, 2, 2])


def test_split_cuts_sequence_outputs_to_each_requests_length() -> None:
    lay = layout()
    requests = [lay.validate(pair(1, 2)), lay.validate(pair(2, 5))]
    hidden = np.arange(3 * 8 * 3, dtype=np.float32).reshape(3, 8, 3)
    pooled = np.arange(9, dtype=np.float32).reshape(3, 3)
    first, second = lay.split({"last_hidden_state": hidden, "sentence_embedding": pooled}, requests, 8)
    np.testing.assert_array_equal(first["last_hidden_state"], hidden[0:1, :2])
    np.testing.assert_array_equal(second["last_hidden_state"], hidden[1:3, :5])
    np.testing.assert_array_equal(second["sentence_embedding"], pooled[1:3])
    hidden[:] = -1  # an engine reusing its output buffer must not change answers already given
    assert (first["last_hidden_state"] >= 0).all()


def test_split_without_copies_gives_views_of_the_engine_outputs() -> None:
    lay = layout()
    requests = [lay.validate(pair(1, 2)), lay.validate(pair(2, 5))]
    hidden = np.zeros((3, 8, 3), np.float32)
    first, second = lay.split({"last_hidden_state": hidden}, requests, 8, copy=False)
    assert first["last_hidden_state"].shape == (1, 2, 3) and second["last_hidden_state"].shape == (2, 5, 3)
    hidden[:] = 7
    assert (first["last_hidden_state"] == 7).all() and (second["last_hidden_state"] == 7).all()


def test_split_rejects_outputs_with_the_wrong_number_of_rows() -> None:
    lay = layout()
    with pytest.raises(RuntimeError, match="engine output 'sentence_embedding' has shape \\[2, 3\\]; expected 1"):
        lay.split({"sentence_embedding": np.zeros((2, 3), np.float32)}, [lay.validate(pair(1, 2))], 8)


def test_dummy_request_has_the_asked_shape() -> None:
    request = layout().dummy(4, 16)
    assert isinstance(request, Request)
    assert (request.rows, request.seq) == (4, 16)
    assert {a.shape for a in request.arrays.values()} == {(4, 16)}


def test_index_inputs_outside_their_table_are_refused() -> None:
    specs = [TensorSpec("input_ids", "INT64", (-1, -1), value_limit=100)]
    layout = TensorLayout(specs, [TensorSpec("out", "FP32", (-1, 4))], max_batch=4, max_seq=8)
    assert layout.validate({"input_ids": np.array([[0, 99]])}).rows == 1
    for bad in ([[5, 100]], [[-1, 3]]):
        with pytest.raises(InvalidInput, match=r"outside 0\.\.99"):
            layout.validate({"input_ids": np.array(bad)})
