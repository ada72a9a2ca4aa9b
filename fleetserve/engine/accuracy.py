"""Accuracy report: a reduced-precision engine against the FP32 reference on held-out texts.

Compares the sentence embedding (or, for models without one, each row's flattened first output) by cosine
similarity and reports mean and minimum; builds fail below a threshold (default mean 0.99).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

RunFn = Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]


def _rows(outputs: Mapping[str, np.ndarray], output: str | None) -> np.ndarray:
    arr = outputs[output] if output and output in outputs else next(iter(outputs.values()))
    return np.asarray(arr, dtype=np.float64).reshape(arr.shape[0], -1)


def cosine_report(
    reference: RunFn,
    candidate: RunFn,
    batches: Sequence[Mapping[str, np.ndarray]],
    output: str | None = "sentence_embedding",
) -> dict[str, float]:
    sims = []
    for batch in batches:
        a = _rows(reference(batch), output)
        b = _rows(candidate(batch), output)
        denom = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
        sims.append(np.sum(a * b, axis=1) / np.maximum(denom, 1e-12))
    allsims = np.concatenate(sims)
    return {
        "mean_cosine": float(allsims.mean()),
        "min_cosine": float(allsims.min()),
        "texts": float(allsims.size),
    }
