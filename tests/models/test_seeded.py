"""The seeded zoo models: BERT-base and BERT-large shapes (MLPerf's BERT-Large), reproducible weights."""

from __future__ import annotations

import importlib.util

import pytest

from fleetserve.models.zoo import get_zoo_model

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch (export extra) missing")


def test_bert_large_is_in_the_zoo_with_its_shape() -> None:
    zoo = get_zoo_model("bert-large")
    assert (zoo.hidden_size, zoo.max_seq, zoo.needs_torch) == (1024, 512, True)


@needs_torch
@pytest.mark.slow
def test_bert_large_builds_24_layers_of_1024_with_the_same_weights_each_time() -> None:
    from fleetserve.models.torch_models import load_torch_model

    a, b = load_torch_model("bert-large"), load_torch_model("bert-large")
    config = a.bert.config
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads, config.intermediate_size) == (
        24, 1024, 16, 4096)
    assert sum(p.numel() for p in a.parameters()) > 330_000_000
    first = next(iter(a.parameters()))
    assert bool((first == next(iter(b.parameters()))).all())
