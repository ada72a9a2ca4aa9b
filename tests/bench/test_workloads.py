from __future__ import annotations

import json
import random

import numpy as np
import pytest

from fleetserve.bench.words import WORDS
from fleetserve.bench.workloads import (
    CLS_ID,
    HEADER_LENGTH,
    LONG_TOKENS,
    RANK_CANDIDATES,
    SEP_ID,
    SHORT_TOKENS,
    V2_INPUTS,
    Payload,
    WorkloadConfig,
    make_payloads,
    squad_tokens,
)


def pool(
    name: str, *, long_fraction: float = 0.1, size: int = 300, seed: int = 0, model: str = "minilm"
) -> list[Payload]:
    return make_payloads(WorkloadConfig(name, model, long_fraction, size), random.Random(seed))


def text_lengths(payloads: list[Payload]) -> np.ndarray:
    return np.array([len(json.loads(p.body)["texts"][0].split()) for p in payloads])


def test_words_are_distinct_lowercase_words() -> None:
    assert len(WORDS) == len(set(WORDS)) > 200
    assert all(w.isalpha() and w.islower() for w in WORDS)


def test_texts_follow_the_length_mix() -> None:
    payloads = pool("texts", long_fraction=0.2, size=2000)
    assert {p.path for p in payloads} == {"/inference"}
    lengths = text_lengths(payloads)
    long = lengths >= LONG_TOKENS[0]
    assert long.mean() == pytest.approx(0.2, abs=0.03)
    assert lengths[~long].min() >= SHORT_TOKENS[0] and lengths[~long].max() <= SHORT_TOKENS[1]
    assert lengths[long].max() <= LONG_TOKENS[1]
    assert set(" ".join(json.loads(p.body)["texts"][0] for p in payloads[:50]).split()) <= set(WORDS)


@pytest.mark.parametrize(("fraction", "expect_long"), [(0.0, False), (1.0, True)])
def test_long_fraction_extremes(fraction: float, expect_long: bool) -> None:
    assert ((text_lengths(pool("texts", long_fraction=fraction)) >= LONG_TOKENS[0]) == expect_long).all()


def test_rank_payload_is_well_formed() -> None:
    for p in pool("rank", size=20):
        body = json.loads(p.body)
        assert set(body) == {"query", "candidates", "top_k"}
        assert isinstance(body["query"], str) and body["query"]
        assert len(body["candidates"]) == RANK_CANDIDATES
        assert 1 <= body["top_k"] <= RANK_CANDIDATES


def test_rank_candidates_set_the_ranking_size() -> None:
    """The issue's ranking call is one query and 20 candidates: ``--candidates 20``."""
    payloads = make_payloads(WorkloadConfig("rank", candidates=20, pool_size=5), random.Random(0))
    assert {len(json.loads(p.body)["candidates"]) for p in payloads} == {20}


def check_tensors(tensors: dict[str, np.ndarray]) -> None:
    assert list(tensors) == list(V2_INPUTS)
    ids = tensors["input_ids"]
    assert ids.shape[0] == 1 and SHORT_TOKENS[0] <= ids.shape[1] <= LONG_TOKENS[1]
    assert ids[0, 0] == CLS_ID and ids[0, -1] == SEP_ID
    assert (tensors["attention_mask"] == 1).all() and (tensors["token_type_ids"] == 0).all()
    assert all(t.shape == ids.shape for t in tensors.values())


def test_v2_json_payload_is_well_formed() -> None:
    for p in pool("v2-json", size=20):
        assert p.path == "/v2/models/minilm/infer" and p.content_type == "application/json"
        inputs = json.loads(p.body)["inputs"]
        assert all(i["datatype"] == "INT64" for i in inputs)
        tensors = {i["name"]: np.array(i["data"], dtype=np.int64).reshape(i["shape"]) for i in inputs}
        check_tensors(tensors)


def parse_binary(p: Payload) -> dict[str, np.ndarray]:
    """Decode the KServe v2 binary tensor extension independently of the encoder."""
    header_len = int(dict(p.headers)[HEADER_LENGTH])
    header = json.loads(p.body[:header_len])
    tensors, at = {}, header_len
    for i in header["inputs"]:
        assert "data" not in i and i["datatype"] == "INT64"
        size = i["parameters"]["binary_data_size"]
        tensors[i["name"]] = np.frombuffer(p.body[at : at + size], dtype="<i8").reshape(i["shape"])
        at += size
    assert at == len(p.body), "binary sizes must add up to the body length"
    return tensors


def test_v2_binary_payload_parses_with_the_header_length() -> None:
    for p in pool("v2-binary", size=20):
        assert p.content_type == "application/octet-stream"
        check_tensors(parse_binary(p))


def test_model_name_is_escaped_into_the_path() -> None:
    assert pool("v2-json", size=1, model="team/bert base")[0].path == "/v2/models/team%2Fbert%20base/infer"


def test_payloads_are_seeded() -> None:
    assert pool("texts", seed=3) == pool("texts", seed=3)
    assert pool("texts", seed=3) != pool("texts", seed=4)


def multi_row_pool(name: str, **kwargs: object) -> list[Payload]:
    config = WorkloadConfig(name, "bert-base", 0.1, 10, **kwargs)  # type: ignore[arg-type]
    return make_payloads(config, random.Random(1))


@pytest.mark.parametrize("name", ["v2-json", "v2-binary"])
def test_v2_rows_and_tokens_shape_each_request(name: str) -> None:
    for p in multi_row_pool(name, rows=32, tokens=128):
        if name == "v2-binary":
            tensors = parse_binary(p)
        else:
            inputs = json.loads(p.body)["inputs"]
            tensors = {i["name"]: np.array(i["data"], dtype=np.int64).reshape(i["shape"]) for i in inputs}
        ids = tensors["input_ids"]
        assert ids.shape == (32, 128) and all(t.shape == ids.shape for t in tensors.values())
        assert (ids[:, 0] == CLS_ID).all() and (ids[:, -1] == SEP_ID).all()
        assert ((ids[:, 1:-1] >= 1000) & (ids[:, 1:-1] < 30000)).all()
        assert len({row.tobytes() for row in ids}) == 32, "rows are different sequences"


def test_v2_rows_without_tokens_share_one_mixed_length() -> None:
    lengths = {parse_binary(p)["input_ids"].shape for p in multi_row_pool("v2-binary", rows=4)}
    assert all(rows == 4 and SHORT_TOKENS[0] <= n <= LONG_TOKENS[1] for rows, n in lengths)
    assert len(lengths) > 1


@pytest.mark.parametrize(("name", "binary"), [("v2-json", False), ("v2-binary", True)])
def test_v2_outputs_are_requested_by_name(name: str, binary: bool) -> None:
    def json_part(p: Payload) -> dict[str, object]:
        return json.loads(p.body[: int(dict(p.headers).get(HEADER_LENGTH, len(p.body)))])

    asked = json_part(multi_row_pool(name, outputs=("sentence_embedding",))[0])
    assert asked["outputs"] == [{"name": "sentence_embedding", "parameters": {"binary_data": binary}}]
    assert "outputs" not in json_part(pool(name, size=1)[0])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "images"}, "unknown workload"),
        ({"model": ""}, "model"),
        ({"long_fraction": 1.5}, "long_fraction"),
        ({"pool_size": 0}, "pool_size"),
        ({"name": "v2-binary", "rows": 0}, "rows"),
        ({"name": "v2-binary", "tokens": 1}, "tokens"),
        ({"name": "v2-json", "outputs": ("",)}, "output names"),
        ({"name": "texts", "rows": 4}, "v2 workloads"),
        ({"name": "rank", "outputs": ("sentence_embedding",)}, "v2 workloads"),
        ({"name": "v2-binary", "lengths": "wiki"}, "unknown length mix"),
        ({"name": "texts", "lengths": "squad"}, "v2 workloads"),
        ({"name": "rank", "candidates": 0}, "candidates must be in"),
        ({"name": "texts", "candidates": 20}, "candidates apply to the rank workload"),
    ],
)
def test_workload_config_validation(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        WorkloadConfig(**kwargs)  # type: ignore[arg-type]


def test_squad_lengths_are_question_answering_features_up_to_384() -> None:
    lengths = np.array([squad_tokens(random.Random(i)) for i in range(4000)])
    assert lengths.min() >= 40 and lengths.max() == 384
    assert 150 < np.median(lengths) < 190 and 0.02 < (lengths == 384).mean() < 0.08
    config = WorkloadConfig("v2-binary", "bert-large", pool_size=64, lengths="squad")
    shapes = {parse_binary(p)["input_ids"].shape for p in make_payloads(config, random.Random(0))}
    assert len(shapes) > 10 and all(rows == 1 and 40 <= n <= 384 for rows, n in shapes)
