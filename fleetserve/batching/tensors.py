"""Tensor side of batching: check a request against the engine's inputs, pad and stack requests into
one batch, and cut the batch's outputs back per request.

Dimension 0 of every tensor is the row (batch) dimension. An input whose dimension 1 is variable
(``-1`` in its :class:`TensorSpec`, e.g. ``input_ids [-1, -1]``) is a *sequence input*: a request's
sequence length is its own dim-1 size, and a batch pads every sequence input with 0 up to the batch's
sequence bucket (``attention_mask`` 0 keeps the padded positions out of attention and pooling). An
output whose dim 1 is variable and equals the padded length (e.g. ``last_hidden_state``) is cut back
to each request's own length; other outputs (e.g. ``sentence_embedding``) are only split by rows.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from fleetserve.engine.base import EngineInstance, TensorSpec
from fleetserve.errors import InvalidInput
from fleetserve.wire import DATATYPES

# The numeric KServe v2 datatypes (BYTES cannot be padded) and their numpy types, from the wire contract.
_DTYPES: dict[str, type[np.generic]] = {
    name: np.dtype(code).type for name, code in DATATYPES.items() if name != "BYTES"
}


@dataclass(frozen=True)
class Request:
    """A validated request: arrays cast to the engine's dtypes, its row count and sequence length.

    ``seq`` is 0 for a model without sequence inputs.
    """

    arrays: Mapping[str, np.ndarray]
    rows: int
    seq: int


def _shape(spec: TensorSpec) -> str:
    return "[" + ", ".join(map(str, spec.shape)) + "]"


class TensorLayout:
    """What the batcher needs to know about an engine's tensors, and the operations on them."""

    def __init__(
        self, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec], *, max_batch: int, max_seq: int
    ) -> None:
        self._inputs = {spec.name: spec for spec in inputs}
        self._dtypes: dict[str, np.dtype[np.generic]] = {}
        for spec in inputs:
            if spec.datatype not in _DTYPES:
                raise ValueError(f"input {spec.name!r} has datatype {spec.datatype}, which the batcher cannot pad")
            if len(spec.shape) == 0 or spec.shape[0] != -1:
                raise ValueError(f"input {spec.name!r} {_shape(spec)} needs a variable dimension 0 to batch")
            if any(d == -1 for d in spec.shape[2:]):
                raise ValueError(f"input {spec.name!r} {_shape(spec)} has a variable dimension past 1")
            self._dtypes[spec.name] = np.dtype(_DTYPES[spec.datatype])
        self.sequence_inputs = tuple(s.name for s in inputs if len(s.shape) >= 2 and s.shape[1] == -1)
        self._cut_outputs = frozenset(s.name for s in outputs if len(s.shape) >= 2 and s.shape[1] == -1)
        self._max_batch = max_batch
        self._max_seq = max_seq

    @property
    def has_sequence(self) -> bool:
        return bool(self.sequence_inputs)

    def validate(self, inputs: Mapping[str, object]) -> Request:
        """Check names, ranks, fixed dims, dtypes and limits; raise ``InvalidInput`` naming the problem."""
        if not isinstance(inputs, Mapping):
            raise InvalidInput("inputs must map each input name to an array")
        expected = ", ".join(self._inputs)
        for name in inputs:
            if name not in self._inputs:
                raise InvalidInput(f"unknown input {name!r}; the model takes {expected}")
        arrays: dict[str, np.ndarray] = {}
        for name, spec in self._inputs.items():
            if name not in inputs:
                raise InvalidInput(f"missing input {name!r}; the model takes {expected}")
            arrays[name] = self._check(spec, inputs[name])
        first = next(iter(self._inputs))
        rows = arrays[first].shape[0]
        for name, array in arrays.items():
            if array.shape[0] != rows:
                raise InvalidInput(f"input {name!r} has {array.shape[0]} rows but {first!r} has {rows}")
        if rows > self._max_batch:
            raise InvalidInput(f"input {first!r} has {rows} rows; at most {self._max_batch} per request")
        seq = 0
        if self.sequence_inputs:
            lead = self.sequence_inputs[0]
            seq = arrays[lead].shape[1]
            for name in self.sequence_inputs:
                if arrays[name].shape[1] != seq:
                    raise InvalidInput(
                        f"input {name!r} has sequence length {arrays[name].shape[1]} but {lead!r} has {seq}"
                    )
            if seq > self._max_seq:
                raise InvalidInput(f"input {lead!r} has sequence length {seq}; the maximum is {self._max_seq}")
        return Request(arrays, rows, seq)

    def _check(self, spec: TensorSpec, value: object) -> np.ndarray:
        array = value if type(value) is np.ndarray else self._as_array(spec, value)
        shape = array.shape
        if len(shape) != len(spec.shape):
            raise InvalidInput(
                f"input {spec.name!r} has rank {array.ndim} (shape {list(shape)}); "
                f"expected rank {len(spec.shape)} {_shape(spec)}"
            )
        for axis, (got, want) in enumerate(zip(shape, spec.shape, strict=True)):
            if got == 0:
                raise InvalidInput(f"input {spec.name!r} has an empty dimension {axis} (shape {list(shape)})")
            if want != -1 and got != want:
                raise InvalidInput(f"input {spec.name!r} has size {got} in dimension {axis}; expected {want}")
        target = self._dtypes[spec.name]
        same_kind, safe = _cast_rule(array.dtype, target)
        if not same_kind:
            raise InvalidInput(f"input {spec.name!r} has dtype {array.dtype}, which cannot be cast to {spec.datatype}")
        if spec.value_limit is not None and not _within(array, spec.value_limit):
            # An out-of-range index would fail the whole batch inside the engine, other requests with it.
            raise InvalidInput(f"input {spec.name!r} has values outside 0..{spec.value_limit - 1}")
        if array.dtype == target and array.flags.c_contiguous:
            return array
        if not safe:
            # A narrowing integer cast must not silently wrap token ids around.
            cast = np.ascontiguousarray(array, dtype=target)
            if not np.array_equal(cast, array):
                raise InvalidInput(f"input {spec.name!r} has values outside the {spec.datatype} range")
            return cast
        return np.ascontiguousarray(array, dtype=target)

    @staticmethod
    def _as_array(spec: TensorSpec, value: object) -> np.ndarray:
        try:
            return np.asarray(value)
        except (ValueError, TypeError) as exc:
            raise InvalidInput(f"input {spec.name!r} is not a rectangular numeric array: {exc}") from None

    def collate(self, requests: Sequence[Request], seq: int) -> dict[str, np.ndarray]:
        """Stack requests row-wise; sequence inputs are zero-padded to ``seq`` columns."""
        if any(r.seq > seq for r in requests):
            raise ValueError(f"a request is longer than the batch's sequence length {seq}")
        total = sum(r.rows for r in requests)
        feeds: dict[str, np.ndarray] = {}
        for name, spec in self._inputs.items():
            if name in self.sequence_inputs:
                batch = np.zeros((total, seq, *spec.shape[2:]), dtype=self._dtypes[name])
                start = 0
                for r in requests:
                    batch[start : start + r.rows, : r.seq] = r.arrays[name]
                    start += r.rows
                feeds[name] = batch
            else:
                feeds[name] = np.concatenate([r.arrays[name] for r in requests], axis=0)
        return feeds

    def split(
        self, outputs: Mapping[str, np.ndarray], requests: Sequence[Request], seq: int, *, copy: bool = True
    ) -> list[dict[str, np.ndarray]]:
        """Cut a batch's outputs back into one dict per request (rows, and own sequence length); ``copy=False``
        gives views, for a caller that is done with them before the engine's next call."""
        total = sum(r.rows for r in requests)
        arrays = {name: np.asarray(value) for name, value in outputs.items()}
        for name, array in arrays.items():
            if array.ndim == 0 or array.shape[0] != total:
                raise RuntimeError(f"engine output {name!r} has shape {list(array.shape)}; expected {total} rows")
        cut = {
            name: name in self._cut_outputs and array.ndim >= 2 and array.shape[1] == seq
            for name, array in arrays.items()
        }
        results: list[dict[str, np.ndarray]] = []
        start = 0
        for r in requests:
            part = {name: array[start : start + r.rows, : r.seq] if cut[name] else array[start : start + r.rows]
                    for name, array in arrays.items()}
            # Copies, not views, by default: an engine may reuse its output buffers for the next batch.
            results.append({name: view.copy() for name, view in part.items()} if copy else part)
            start += r.rows
        return results

    def warm(self, instance: EngineInstance, shapes: Sequence[tuple[int, int]]) -> None:
        """Run ``instance`` once on an all-zero batch of every ``(rows, seq)`` in ``shapes``; splitting checks
        the engine's outputs have the promised rows before real traffic arrives."""
        for rows, seq in shapes:
            request = self.dummy(rows, seq)
            self.split(instance.infer(self.collate([request], seq)), [request], seq)

    def dummy(self, rows: int, seq: int) -> Request:
        """An all-zero request of ``rows`` x ``seq``, for warming an engine up on that shape."""
        arrays = {
            name: np.zeros(
                (rows, seq, *spec.shape[2:]) if name in self.sequence_inputs else (rows, *spec.shape[1:]),
                dtype=self._dtypes[name],
            )
            for name, spec in self._inputs.items()
        }
        return Request(arrays, rows, seq if self.sequence_inputs else 0)


def warmup_batch_sizes(batch_buckets: Sequence[int], max_batch: int, preferred: Sequence[int] = ()) -> tuple[int, ...]:
    """The batch sizes to warm an engine on: its batch buckets up to ``max_batch``, ``max_batch`` itself and
    the ``preferred`` sizes a batcher aims for."""
    return tuple(sorted({b for b in batch_buckets if b <= max_batch} | {max_batch} | set(preferred)))


@functools.cache
def _cast_rule(source: np.dtype[np.generic], target: np.dtype[np.generic]) -> tuple[bool, bool]:
    """(an input of dtype ``source`` is accepted for ``target``, casting it cannot change a value): numeric
    kinds only, ``same_kind``; integer narrowings are then checked value by value."""
    accepted = source.kind in "biuf" and bool(np.can_cast(source, target, casting="same_kind"))
    return accepted, target.kind not in "iu" or bool(np.can_cast(source, target, casting="safe"))


def _within(array: np.ndarray, limit: int) -> bool:
    """Whether every value of a non-empty ``array`` lies in ``0..limit-1``. Signed integers are read as
    unsigned ones of the same width, so one ``max`` also catches negative values (they read as huge)."""
    kind = array.dtype.kind
    if kind == "i":
        return int(array.view(f"u{array.dtype.itemsize}").max()) < limit
    if kind in "ub":
        return int(array.max()) < limit
    return bool(array.min() >= 0) and bool(array.max() < limit)
