"""Unlabelled text for INT8 calibration and for accuracy reports.

The package ships a small corpus of e-commerce style queries, product texts and reviews
(``fleetserve/data/corpus.txt``). Its first part is the default calibration set; the last ``HELD_OUT`` lines
are never used for calibration and serve as the held-out set of every accuracy report. A user's
``--calibration FILE`` (one text per line) replaces the calibration part only.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from fleetserve.engine.base import EngineError

HELD_OUT = 96


def _shipped_corpus() -> list[str]:
    text = resources.files("fleetserve").joinpath("data/corpus.txt").read_text(encoding="utf-8")
    return [line.strip() for line in text.splitlines() if line.strip()]


def held_out_texts() -> list[str]:
    return _shipped_corpus()[-HELD_OUT:]


def calibration_texts(path: Path | None = None, limit: int = 256) -> list[str]:
    if path is None:
        return _shipped_corpus()[:-HELD_OUT][:limit]
    try:
        raw = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise EngineError(f"cannot read calibration file {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise EngineError(f"calibration file {path} is not UTF-8 text") from None
    texts = [line.strip() for line in raw.splitlines() if line.strip()]
    if not texts:
        raise EngineError(f"calibration file {path} has no text (expected one text per line)")
    return texts[:limit]
