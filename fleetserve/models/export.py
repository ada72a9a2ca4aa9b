"""Export the zoo's PyTorch models to ONNX with dynamic batch and sequence axes.

Uses the TorchScript exporter (``dynamo=False``, opset 17) on an eager-attention model: that graph shape is
what ONNX Runtime's transformer optimizer recognises, so Attention / SkipLayerNorm / BiasGelu fusions apply.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from fleetserve.errors import MissingDependency

INPUT_NAMES = ["input_ids", "attention_mask", "token_type_ids"]
OUTPUT_NAMES = ["last_hidden_state", "sentence_embedding"]
OPSET = 17


def export_onnx(name: str, dest: Path) -> None:
    try:
        import torch
    except ImportError:
        raise MissingDependency(
            f"exporting {name!r} to ONNX (once per machine) needs torch: pip install 'fleetserve[export]'"
        ) from None
    from fleetserve.models.torch_models import load_torch_model

    model = load_torch_model(name)
    ids = torch.ones((2, 16), dtype=torch.int64)
    with torch.no_grad():
        torch.onnx.export(
            model,
            (ids, torch.ones_like(ids), torch.zeros_like(ids)),
            str(dest),
            input_names=INPUT_NAMES,
            output_names=OUTPUT_NAMES,
            dynamic_axes={
                "input_ids": {0: "batch", 1: "seq"},
                "attention_mask": {0: "batch", 1: "seq"},
                "token_type_ids": {0: "batch", 1: "seq"},
                "last_hidden_state": {0: "batch", 1: "seq"},
                "sentence_embedding": {0: "batch"},
            },
            opset_version=OPSET,
            dynamo=False,
        )


def materialize_minilm(directory: Path) -> None:
    from fleetserve.models.weights import minilm_dir

    weights = minilm_dir()  # before torch: a missing package is the first thing to say
    export_onnx("minilm", directory / "model.onnx")
    shutil.copy(weights / "tokenizer.json", directory / "tokenizer.json")


def materialize_bert_base(directory: Path) -> None:
    _materialize_seeded("bert-base", directory)


def materialize_bert_large(directory: Path) -> None:
    _materialize_seeded("bert-large", directory)


def _materialize_seeded(name: str, directory: Path) -> None:
    from fleetserve.models.weights import minilm_dir

    export_onnx(name, directory / "model.onnx")
    # BERT-base and -large use the same uncased WordPiece vocabulary (30522 tokens) as MiniLM.
    shutil.copy(minilm_dir() / "tokenizer.json", directory / "tokenizer.json")
