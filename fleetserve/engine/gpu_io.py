"""Host side of the GPU engines: request validation, bucket choice and pinned staging buffers.

Shared by the ``torch-cuda`` and ``tensorrt`` instances. A request is checked on the host before it reaches
the GPU (an out-of-range token id would fault a gather kernel and take the whole CUDA context down), then
written into page-locked buffers allocated once at ``max_batch × max_seq`` and padded there to the
instance's bucket, so the upload is one asynchronous copy per input and no allocation happens per call.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from fleetserve.errors import InvalidInput

if TYPE_CHECKING:
    import torch

INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
HIDDEN, EMBEDDING = "last_hidden_state", "sentence_embedding"
OUTPUT_NAMES = (HIDDEN, EMBEDDING)


def bucket_for(buckets: Sequence[int], n: int, what: str) -> int:
    """Smallest bucket holding ``n``."""
    for b in buckets:
        if n <= b:
            return b
    raise InvalidInput(f"{what} {n} exceeds the engine's maximum {buckets[-1]}")


def check_inputs(
    inputs: Mapping[str, np.ndarray], limits: Mapping[str, int], max_batch: int, max_seq: int
) -> tuple[int, int]:
    """Validate names, shapes, integer types and value ranges (``limits[name]`` = exclusive upper bound).

    Returns (batch, seq).
    """
    missing = [n for n in INPUT_NAMES if n not in inputs]
    if missing:
        raise InvalidInput(f"missing input(s) {', '.join(missing)}; the model takes {', '.join(INPUT_NAMES)}")
    shape = np.shape(inputs["input_ids"])
    if len(shape) != 2 or 0 in shape:
        raise InvalidInput(f"input_ids must be a non-empty [batch, seq] matrix, got shape {list(shape)}")
    for name in INPUT_NAMES:
        arr = np.asarray(inputs[name])
        if arr.shape != shape:
            raise InvalidInput(f"{name} has shape {list(arr.shape)}, expected {list(shape)} like input_ids")
        if not np.issubdtype(arr.dtype, np.integer):
            raise InvalidInput(f"{name} must be integers, got {arr.dtype}")
        hi = limits.get(name)
        if hi is not None:
            lo_v, hi_v = int(arr.min()), int(arr.max())
            if lo_v < 0 or hi_v >= hi:
                raise InvalidInput(f"{name} values must be in [0, {hi - 1}], got [{lo_v}, {hi_v}]")
    b, s = int(shape[0]), int(shape[1])
    if s > max_seq:
        raise InvalidInput(f"sequence length {s} exceeds the engine's maximum {max_seq}")
    if b > max_batch:
        raise InvalidInput(f"batch {b} exceeds the engine's maximum {max_batch}")
    return b, s


def wanted_outputs(outputs: Sequence[str] | None) -> set[str]:
    want = set(outputs) if outputs is not None else set(OUTPUT_NAMES)
    unknown = want - set(OUTPUT_NAMES)
    if unknown:
        raise InvalidInput(f"unknown output(s) {', '.join(sorted(unknown))}; have {', '.join(OUTPUT_NAMES)}")
    return want


def pad_into(block: np.ndarray, arr: np.ndarray) -> None:
    """Write ``arr`` (b × s) into the top-left of ``block`` (rows × cols) and zero the rest of it."""
    b, s = arr.shape
    block[:b, :s] = arr
    block[:b, s:] = 0
    block[b:] = 0


def stage_packed(flat: np.ndarray, inputs: Mapping[str, np.ndarray], rows: int, cols: int) -> None:
    """Write the inputs back to back into ``flat``, each padded to a ``rows × cols`` block, in
    ``INPUT_NAMES`` order: the layout of one upload covering every input."""
    n = rows * cols
    for i, name in enumerate(INPUT_NAMES):
        pad_into(flat[i * n:(i + 1) * n].reshape(rows, cols), inputs[name])


class PinnedInputs:
    """Page-locked int64 buffers, one per input, each ``capacity`` elements; filled and padded in place."""

    def __init__(self, capacity: int) -> None:
        import torch

        self._host = {n: torch.empty(capacity, dtype=torch.int64, pin_memory=True) for n in INPUT_NAMES}
        self._np = {n: t.numpy() for n, t in self._host.items()}

    def stage(self, inputs: Mapping[str, np.ndarray], rows: int, cols: int) -> None:
        """Write ``inputs`` (b × s) into the top-left of a zeroed ``rows × cols`` block of each buffer."""
        for name in INPUT_NAMES:
            pad_into(self._np[name][: rows * cols].reshape(rows, cols), inputs[name])

    def upload(self, device: Mapping[str, torch.Tensor], count: int) -> None:
        """Asynchronously copy the first ``count`` staged elements of every input on the current stream."""
        for name in INPUT_NAMES:
            device[name][:count].copy_(self._host[name][:count], non_blocking=True)
