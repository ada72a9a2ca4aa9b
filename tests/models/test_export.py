"""The exported MiniLM graph must match PyTorch (the real all-MiniLM-L6-v2 weights) on mixed-length batches."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from fleetserve.models.store import ModelStore
from fleetserve.models.tokenizer import TextTokenizer
from tests.support.markers import needs_torch

TEXTS = [
    "wireless earbuds",
    "The seller responded quickly and the espresso machine came well packed, five stars.",
    "Payment declined twice, then approved on a different card with a new shipping address. " * 6,
]


@needs_torch
def test_minilm_export_matches_pytorch() -> None:
    import torch

    from fleetserve.models.torch_models import load_torch_model

    stored = ModelStore().resolve("minilm")
    assert stored.meta is not None and stored.tokenizer_path is not None
    enc = TextTokenizer(stored.tokenizer_path, stored.meta.max_seq).encode(TEXTS)
    sess = ort.InferenceSession(str(stored.onnx_path), providers=["CPUExecutionProvider"])
    hidden, emb = sess.run(None, enc.as_inputs())
    model = load_torch_model("minilm")
    with torch.no_grad():
        t_hidden, t_emb = model(*(torch.from_numpy(v) for v in enc.as_inputs().values()))
    assert np.abs(emb - t_emb.numpy()).max() <= 1e-5
    mask = enc.attention_mask.astype(bool)
    assert np.abs(hidden[mask] - t_hidden.numpy()[mask]).max() <= 1e-3
    # Real weights, not random ones: related texts are closer than unrelated ones.
    more = TextTokenizer(stored.tokenizer_path, 256).encode(
        ["bluetooth headphones", "wireless earbuds", "tax law of medieval france"]
    )
    e = sess.run(["sentence_embedding"], more.as_inputs())[0]
    assert e[0] @ e[1] > e[1] @ e[2] + 0.2


def test_unknown_model_lists_valid_names() -> None:
    from fleetserve.errors import ModelNotFound

    with pytest.raises(ModelNotFound, match="minilm, bert-base, bert-large, tiny"):
        ModelStore().resolve("gpt-17")


@needs_torch
@pytest.mark.slow
def test_bert_base_exports_with_the_bert_base_shape() -> None:
    stored = ModelStore().resolve("bert-base")
    assert stored.meta is not None and stored.meta.hidden_size == 768 and stored.tokenizer_path is not None
    sess = ort.InferenceSession(str(stored.onnx_path), providers=["CPUExecutionProvider"])
    enc = TextTokenizer(stored.tokenizer_path, 512).encode(TEXTS[:2])
    hidden, emb = sess.run(None, enc.as_inputs())
    assert hidden.shape == (*enc.input_ids.shape, 768) and emb.shape == (2, 768)
    layers = {n.name.split("/")[3] for n in __import__("onnx").load(str(stored.onnx_path)).graph.node
              if n.name.startswith("/bert/encoder/layer.")}
    assert len(layers) == 12
