from __future__ import annotations

import numpy as np
import onnxruntime as ort

from fleetserve.models.store import ModelStore
from fleetserve.models.tokenizer import TextTokenizer


def test_tiny_materializes_without_torch_and_runs() -> None:
    model = ModelStore().resolve("tiny")
    assert model.tokenizer_path is not None and model.meta is not None
    tok = TextTokenizer(model.tokenizer_path, model.meta.max_seq)
    enc = tok.encode(["cheap running shoes", "a much longer product review about wireless earbuds and batteries"])
    # Dynamic padding: as long as the longest text, not a fixed 128.
    assert enc.input_ids.shape[1] == int(enc.attention_mask[1].sum())
    assert enc.attention_mask[0].sum() < enc.attention_mask[1].sum()
    sess = ort.InferenceSession(str(model.onnx_path), providers=["CPUExecutionProvider"])
    hidden, emb = sess.run(None, enc.as_inputs())
    assert hidden.shape == (2, enc.input_ids.shape[1], model.meta.hidden_size)
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, rtol=1e-5)
    # Padding must not change a text's embedding (mask-aware pooling).
    alone = sess.run(None, tok.encode(["cheap running shoes"]).as_inputs())[1]
    np.testing.assert_allclose(alone[0], emb[0], atol=1e-6)


def test_truncation_is_flagged() -> None:
    model = ModelStore().resolve("tiny")
    assert model.tokenizer_path is not None
    tok = TextTokenizer(model.tokenizer_path, 16)
    enc = tok.encode(["short", "word " * 100])
    assert enc.input_ids.shape[1] == 16
    assert enc.truncated == [False, True]
