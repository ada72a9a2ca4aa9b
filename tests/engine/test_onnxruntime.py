"""The default engine backend (ONNX Runtime) on small graphs built here: build, quantize, load, run, and the
one-line errors, checked against numpy rather than against another run of ONNX Runtime."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from fleetserve.engine.base import BuildSpec, EngineError, Precision, ShapeProfile
from fleetserve.engine.onnxruntime import (
    INDEX_LIMITS,
    OnnxRuntimeBackend,
    OrtEngine,
    _bert_shape,
    index_limits,
    load_onnx,
    threads_per_instance,
)
from fleetserve.models.tiny import HIDDEN, build_graph

VOCAB = 60
PROFILE = ShapeProfile(max_batch=4, max_seq=16, seq_buckets=(8, 16), batch_buckets=(1, 2, 4))


@pytest.fixture(scope="module")
def tiny_onnx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ort") / "tiny.onnx"
    onnx.save(build_graph(VOCAB), str(path))
    return path


def _spec(path: Path, precision: Precision = Precision.FP32, device: str = "cpu", **options: str) -> BuildSpec:
    return BuildSpec("tiny", path, precision, PROFILE, device=device, options=options)


def _inputs(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, VOCAB, size=(3, 7), dtype=np.int64)
    mask = np.ones_like(ids)
    mask[1, 4:] = 0
    mask[2, 2:] = 0
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": rng.integers(0, 2, ids.shape, dtype=np.int64)}


def _reference(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The tiny graph computed with numpy from its own weights."""
    w = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    hidden = np.tanh((w["word_emb"][inputs["input_ids"]] + w["type_emb"][inputs["token_type_ids"]]) @ w["w"] + w["b"])
    mask = inputs["attention_mask"][..., None].astype(np.float32)
    pooled = (hidden * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), 1e-9)
    return {"last_hidden_state": hidden, "sentence_embedding": pooled / np.linalg.norm(pooled, axis=1, keepdims=True)}


@pytest.fixture(scope="module")
def fp32_artifact(tiny_onnx: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fp32")
    OnnxRuntimeBackend().build(_spec(tiny_onnx), out)
    return out


def test_load_onnx_errors_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(EngineError, match="ONNX file not found"):
        load_onnx(tmp_path / "missing.onnx")
    corrupt = tmp_path / "corrupt.onnx"
    corrupt.write_bytes(b"not a protobuf at all")
    with pytest.raises(EngineError, match="is not a valid ONNX model") as info:
        load_onnx(corrupt)
    assert "\n" not in str(info.value)


def test_supported_precisions_per_device() -> None:
    backend = OnnxRuntimeBackend()
    assert [p for p in Precision if backend.supports(p, "cpu")] == [Precision.FP32, Precision.INT8]
    assert backend.supports(Precision.FP16, "cuda") and not backend.supports(Precision.FP16, "cpu")


def test_an_unsupported_precision_is_refused_before_any_work(tiny_onnx: Path, tmp_path: Path) -> None:
    with pytest.raises(EngineError, match=r"does not support fp16 on cpu; use fp32 or int8"):
        OnnxRuntimeBackend().build(_spec(tiny_onnx, Precision.FP16), tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_fp32_build_of_a_non_bert_graph_writes_the_model_and_its_index_limits(fp32_artifact: Path) -> None:
    assert sorted(p.name for p in fp32_artifact.iterdir()) == [INDEX_LIMITS, "model.onnx"]
    assert json.loads((fp32_artifact / INDEX_LIMITS).read_text()) == {"input_ids": VOCAB, "token_type_ids": 2}


def test_fp32_build_report_says_what_it_did(tiny_onnx: Path, tmp_path: Path) -> None:
    report = OnnxRuntimeBackend().build(_spec(tiny_onnx), tmp_path)
    assert (report.backend, report.precision, report.device) == ("onnxruntime", "fp32", "cpu")
    assert report.method == "graph optimization" and report.fusions == {}
    assert any("not a BERT-style graph" in note for note in report.notes)


def test_engine_runs_the_graph_as_numpy_does(tiny_onnx: Path, fp32_artifact: Path) -> None:
    engine = OnnxRuntimeBackend().load(fp32_artifact, PROFILE, threads=1)
    inputs = _inputs()
    expected = _reference(onnx.load(str(tiny_onnx)), inputs)
    got = engine.instance().infer(inputs)
    assert sorted(got) == ["last_hidden_state", "sentence_embedding"]
    for name, array in expected.items():
        np.testing.assert_allclose(got[name], array, rtol=1e-5, atol=1e-6)


def test_engine_returns_only_the_outputs_asked_for(fp32_artifact: Path) -> None:
    engine = OnnxRuntimeBackend().load(fp32_artifact, PROFILE, threads=1)
    got = engine.instance().infer(_inputs(), outputs=["sentence_embedding"])
    assert list(got) == ["sentence_embedding"] and got["sentence_embedding"].shape == (3, HIDDEN)


def test_engine_describes_its_tensors_with_dynamic_dims_and_id_limits(fp32_artifact: Path) -> None:
    engine = OnnxRuntimeBackend().load(fp32_artifact, PROFILE, threads=1)
    assert [(s.name, s.datatype, s.shape, s.value_limit) for s in engine.inputs] == [
        ("input_ids", "INT64", (-1, -1), VOCAB),
        ("attention_mask", "INT64", (-1, -1), None),
        ("token_type_ids", "INT64", (-1, -1), 2),
    ]
    assert [(s.name, s.datatype, s.shape) for s in engine.outputs] == [
        ("last_hidden_state", "FP32", (-1, -1, HIDDEN)),
        ("sentence_embedding", "FP32", (-1, HIDDEN)),
    ]


def test_each_instance_has_its_own_session_with_the_threads_asked_for(fp32_artifact: Path) -> None:
    engine = OrtEngine(fp32_artifact / "model.onnx", PROFILE, threads=2)
    first, second = engine.instance(), engine.instance()
    assert first._session is not second._session
    for instance in (first, second):
        options = instance._session.get_session_options()
        assert (options.intra_op_num_threads, options.inter_op_num_threads) == (2, 1)
    np.testing.assert_array_equal(first.infer(_inputs(3))["sentence_embedding"],
                                  second.infer(_inputs(3))["sentence_embedding"])
    engine.close()
    assert engine._instances == []


def test_load_finds_the_index_limits_when_an_older_artifact_lacks_them(fp32_artifact: Path, tmp_path: Path) -> None:
    (tmp_path / "model.onnx").write_bytes((fp32_artifact / "model.onnx").read_bytes())
    engine = OnnxRuntimeBackend().load(tmp_path, PROFILE, threads=1)
    assert {s.name: s.value_limit for s in engine.inputs}["input_ids"] == VOCAB


def test_a_corrupt_artifact_is_an_engine_error(tmp_path: Path) -> None:
    (tmp_path / "model.onnx").write_bytes(b"corrupt")
    (tmp_path / INDEX_LIMITS).write_text("{}")
    with pytest.raises(EngineError, match="cannot load engine"):
        OnnxRuntimeBackend().load(tmp_path, PROFILE)


def test_int8_dynamic_quantizes_the_matmul_and_stays_close(tiny_onnx: Path, fp32_artifact: Path,
                                                            tmp_path: Path) -> None:
    report = OnnxRuntimeBackend().build(_spec(tiny_onnx, Precision.INT8), tmp_path)
    assert "int8 dynamic per-channel" in report.method
    ops = {node.op_type for node in onnx.load(str(tmp_path / "model.onnx")).graph.node}
    assert ops & {"MatMulInteger", "DynamicQuantizeMatMul"}, ops
    assert not (tmp_path / "optimized.onnx").exists()
    inputs = _inputs(1)
    int8 = OnnxRuntimeBackend().load(tmp_path, PROFILE, threads=1).instance().infer(inputs)["sentence_embedding"]
    fp32 = OnnxRuntimeBackend().load(fp32_artifact, PROFILE, threads=1).instance().infer(inputs)["sentence_embedding"]
    cosine = (int8 * fp32).sum(axis=1)  # both are unit vectors
    assert cosine.min() > 0.99 and not np.array_equal(int8, fp32)


def test_an_unknown_int8_method_is_refused(tiny_onnx: Path, tmp_path: Path) -> None:
    with pytest.raises(EngineError, match="unknown int8_method 'magic'; use dynamic or static"):
        OnnxRuntimeBackend().build(_spec(tiny_onnx, Precision.INT8, int8_method="magic"), tmp_path)


@pytest.mark.parametrize(("hidden", "expected"), [(384, (6, 384)), (768, (12, 768)), (128, (4, 128))])
def test_bert_shape_from_the_word_embeddings(hidden: int, expected: tuple[int, int]) -> None:
    table = numpy_helper.from_array(np.zeros((10, hidden), np.float32), "embeddings.word_embeddings.weight")
    graph = helper.make_graph([], "g", [], [], [table])
    assert _bert_shape(helper.make_model(graph)) == expected


def test_no_bert_shape_without_word_embeddings() -> None:
    assert _bert_shape(build_graph(VOCAB)) is None


def test_index_limits_follow_casts_and_fused_embedding_layers(tmp_path: Path) -> None:
    tables = [numpy_helper.from_array(np.zeros((n, 4), np.float32), name)
              for n, name in ((30, "words"), (2, "types"), (64, "positions"), (25, "smaller_words"))]
    nodes = [
        helper.make_node("Cast", ["input_ids"], ["ids32"], to=TensorProto.INT32),
        helper.make_node("EmbedLayerNormalization", ["ids32", "token_type_ids", "words", "positions", "types"],
                         ["embedded"], domain="com.microsoft"),
        helper.make_node("Gather", ["smaller_words", "input_ids"], ["again"]),
        helper.make_node("Gather", ["words", "not_an_input"], ["ignored"]),
    ]
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT64, ["b", "s"]) for n in ("input_ids", "token_type_ids")]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("embedded", TensorProto.FLOAT, None)],
                              tables)
    path = tmp_path / "fused.onnx"
    onnx.save(helper.make_model(graph), str(path))
    # The smaller of two tables indexed by the same input wins.
    assert index_limits(path) == {"input_ids": 25, "token_type_ids": 2}


@pytest.mark.parametrize(("instances", "cores", "expected"), [(1, 8, 8), (3, 8, 2), (16, 2, 1), (0, 4, 4)])
def test_threads_per_instance_split_the_cores(instances: int, cores: int, expected: int) -> None:
    assert threads_per_instance(instances, cores) == expected
