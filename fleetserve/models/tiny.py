"""``tiny``: a small encoder graph built with ``onnx.helper`` and a WordPiece tokenizer built with ``tokenizers``.

No torch, no downloads, milliseconds to build: it exercises every serving path (tokenization, dynamic
shapes, batching, pooling) at a cost small enough that gateway benchmarks measure the gateway, not the model.
Graph: token + token-type embeddings -> dense + tanh -> last_hidden_state; masked mean pool -> L2 normalise
-> sentence_embedding. Same input/output names as the exported BERT models.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import WordPiece

HIDDEN = 32
SEED = 1234
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def build_vocab() -> list[str]:
    corpus = resources.files("fleetserve").joinpath("data/corpus.txt").read_text(encoding="utf-8").lower()
    words = sorted(set(re.findall(r"[a-z]+", corpus)))
    chars = [chr(c) for c in range(ord("a"), ord("z") + 1)] + [str(d) for d in range(10)]
    punct = list(".,:;!?'\"-()/$%&+")
    # dict.fromkeys keeps the first occurrence: single letters are also corpus words.
    return list(dict.fromkeys(SPECIALS + chars + ["##" + c for c in chars] + punct + words))


def build_tokenizer() -> Tokenizer:
    vocab = {tok: i for i, tok in enumerate(build_vocab())}
    tok = Tokenizer(WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    tok.decoder = decoders.WordPiece()
    return tok


def build_graph(vocab_size: int, hidden: int = HIDDEN, seed: int = SEED) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.5, (vocab_size, hidden)).astype(np.float32), "word_emb"),
        numpy_helper.from_array(rng.normal(0, 0.5, (2, hidden)).astype(np.float32), "type_emb"),
        numpy_helper.from_array(rng.normal(0, 1 / np.sqrt(hidden), (hidden, hidden)).astype(np.float32), "w"),
        numpy_helper.from_array(np.zeros(hidden, np.float32), "b"),
        numpy_helper.from_array(np.array([1], np.int64), "axis1"),
        numpy_helper.from_array(np.array([-1], np.int64), "axis_last"),
        numpy_helper.from_array(np.array(1e-9, np.float32), "eps"),
    ]
    seq_in = ["batch", "seq"]
    nodes = [
        helper.make_node("Gather", ["word_emb", "input_ids"], ["we"]),
        helper.make_node("Gather", ["type_emb", "token_type_ids"], ["te"]),
        helper.make_node("Add", ["we", "te"], ["emb"]),
        helper.make_node("MatMul", ["emb", "w"], ["mm"]),
        helper.make_node("Add", ["mm", "b"], ["pre"]),
        helper.make_node("Tanh", ["pre"], ["last_hidden_state"]),
        helper.make_node("Cast", ["attention_mask"], ["maskf"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["maskf", "axis_last"], ["mask3"]),
        helper.make_node("Mul", ["last_hidden_state", "mask3"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "axis1"], ["summed"], keepdims=0),
        helper.make_node("ReduceSum", ["mask3", "axis1"], ["count"], keepdims=0),
        helper.make_node("Max", ["count", "eps"], ["count_safe"]),
        helper.make_node("Div", ["summed", "count_safe"], ["pooled"]),
        helper.make_node("LpNormalization", ["pooled"], ["sentence_embedding"], axis=1, p=2),
    ]
    graph = helper.make_graph(
        nodes,
        "fleetserve_tiny",
        [helper.make_tensor_value_info(n, TensorProto.INT64, seq_in)
         for n in ("input_ids", "attention_mask", "token_type_ids")],
        [
            helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "seq", hidden]),
            helper.make_tensor_value_info("sentence_embedding", TensorProto.FLOAT, ["batch", hidden]),
        ],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="fleetserve")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def materialize_tiny(directory: Path) -> None:
    tok = build_tokenizer()
    tok.save(str(directory / "tokenizer.json"))
    onnx.save(build_graph(tok.get_vocab_size()), str(directory / "model.onnx"))
