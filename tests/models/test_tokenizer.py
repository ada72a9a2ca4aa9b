"""TextTokenizer packing: the arrays equal what the Rust encodings hold, padded with zeros, whatever the
template's token types."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer
from tokenizers.processors import TemplateProcessing

from fleetserve.models.store import ModelStore
from fleetserve.models.tokenizer import PARALLELISM_ENV, TextTokenizer

TEXTS = ["red running shoes", "a", "the quick brown fox jumps over the lazy dog " * 3]


@pytest.fixture
def tokenizer_path() -> Path:
    path = ModelStore().resolve("tiny").tokenizer_path
    assert path is not None
    return path


def expected(tok: Tokenizer, texts: list[str]) -> dict[str, np.ndarray]:
    """The encodings padded by hand, field by field, as the engine's inputs."""
    encs = tok.encode_batch(texts)
    seq = max(len(e.ids) for e in encs)
    out = {name: np.zeros((len(texts), seq), dtype=np.int64) for name in ("input_ids", "attention_mask",
                                                                          "token_type_ids")}
    for i, e in enumerate(encs):
        out["input_ids"][i, : len(e.ids)] = e.ids
        out["attention_mask"][i, : len(e.ids)] = e.attention_mask
        out["token_type_ids"][i, : len(e.ids)] = e.type_ids
    return out


def reference(path: Path, max_length: int, template: TemplateProcessing | None = None) -> Tokenizer:
    tok = Tokenizer.from_file(str(path))
    tok.no_padding()
    tok.enable_truncation(max_length)
    if template is not None:
        tok.post_processor = template
    return tok


@pytest.mark.parametrize("texts", [TEXTS, TEXTS[:1], TEXTS[2:]])
def test_packed_arrays_are_the_encodings_padded_with_zeros(tokenizer_path: Path, texts: list[str]) -> None:
    packed = TextTokenizer(tokenizer_path, 16).encode(texts)
    for name, want in expected(reference(tokenizer_path, 16), texts).items():
        got = packed.as_inputs()[name]
        np.testing.assert_array_equal(got, want, err_msg=name)
        assert got.dtype == np.int64
    assert packed.truncated == [len(t) > 60 for t in texts]


def test_a_template_with_mixed_token_types_is_read_type_by_type(tokenizer_path: Path, tmp_path: Path) -> None:
    mixed = TemplateProcessing(single="[CLS]:0 $A:1 [SEP]:1", special_tokens=[("[CLS]", 101), ("[SEP]", 102)])
    saved = tmp_path / "tokenizer.json"
    reference(tokenizer_path, 16, mixed).save(str(saved))
    packed = TextTokenizer(saved, 16).encode(TEXTS)
    want = expected(reference(saved, 16), TEXTS)
    np.testing.assert_array_equal(packed.token_type_ids, want["token_type_ids"])
    assert packed.token_type_ids[0, 1] == 1 and packed.token_type_ids[1, -1] == 0  # type 1, then padding


def test_the_librarys_thread_pool_is_off_unless_the_user_chose(tokenizer_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PARALLELISM_ENV, raising=False)
    TextTokenizer(tokenizer_path, 32)
    assert os.environ[PARALLELISM_ENV] == "false"
    monkeypatch.setenv(PARALLELISM_ENV, "true")
    TextTokenizer(tokenizer_path, 32)
    assert os.environ[PARALLELISM_ENV] == "true"
