"""The GPU engines' host-side staging, on plain numpy buffers (no GPU needed)."""

from __future__ import annotations

import numpy as np

from fleetserve.engine.gpu_io import INPUT_NAMES, stage_packed


def test_stage_packed_lays_the_inputs_back_to_back_each_padded_to_the_bucket() -> None:
    flat = np.full(3 * 4 * 5, 7, dtype=np.int64)  # stale values from an earlier, larger call
    inputs = {name: np.full((2, 3), i + 1, dtype=np.int64) for i, name in enumerate(INPUT_NAMES)}
    stage_packed(flat, inputs, 4, 5)
    for i in range(len(INPUT_NAMES)):
        block = flat[i * 20:(i + 1) * 20].reshape(4, 5)
        assert (block[:2, :3] == i + 1).all()
        assert (block[:2, 3:] == 0).all() and (block[2:] == 0).all()
    stage_packed(flat, inputs, 2, 3)  # an exact fit: no padding, the three blocks of six first
    assert flat[:18].tolist() == [1] * 6 + [2] * 6 + [3] * 6
