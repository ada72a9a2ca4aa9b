"""Native TensorRT backend: its pure logic here; builds and runs only where TensorRT and a GPU exist."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

from fleetserve.engine.base import BuildSpec, EngineError, Precision, ShapeProfile
from fleetserve.engine.tensorrt import TensorRTBackend, TensorRTOptions, profile_shapes, token_limits

HAS_TRT = importlib.util.find_spec("tensorrt") is not None
needs_trt = pytest.mark.skipif(not HAS_TRT, reason="TensorRT is not installed on any machine we have")


def test_one_profile_per_sequence_bucket() -> None:
    profile = ShapeProfile(max_batch=16, max_seq=128, seq_buckets=(32, 128), batch_buckets=(1, 16))
    assert profile_shapes(profile) == [
        (32, (1, 32), (16, 32), (16, 32)),
        (128, (1, 128), (16, 128), (16, 128)),
    ]


def test_options_validate() -> None:
    assert TensorRTOptions.from_options({"trt_workspace_mib": "1024", "tokenizer": "x"}).workspace_mib == 1024
    with pytest.raises(EngineError, match="trt_optimization_level"):
        TensorRTOptions.from_options({"trt_optimization_level": "9"})
    with pytest.raises(EngineError, match="invalid TensorRT option"):
        TensorRTOptions.from_options({"trt_workspace_mib": "lots"})


def test_token_limits_come_from_the_embedding_tables() -> None:
    inits = [
        helper.make_tensor("embeddings.word_embeddings.weight", TensorProto.FLOAT, [50, 4], [0.0] * 200),
        helper.make_tensor("embeddings.token_type_embeddings.weight", TensorProto.FLOAT, [2, 4], [0.0] * 8),
    ]
    graph = helper.make_graph([], "g", [], [], initializer=inits)
    assert token_limits(helper.make_model(graph)) == {"attention_mask": 2, "input_ids": 50, "token_type_ids": 2}


def test_capabilities() -> None:
    backend = TensorRTBackend()
    assert backend.supports(Precision.INT8, "cuda") and backend.supports(Precision.FP16, "cuda:1")
    assert not backend.supports(Precision.FP8, "cuda") and not backend.supports(Precision.FP32, "cpu")
    if not HAS_TRT:
        assert not TensorRTBackend.available()


def test_build_refuses_unsupported_precision_before_touching_tensorrt(tmp_path: Path) -> None:
    spec = BuildSpec("m", tmp_path / "m.onnx", Precision.BF16, ShapeProfile(), "cuda")
    with pytest.raises(EngineError, match="does not support bf16"):
        TensorRTBackend().build(spec, tmp_path)


@needs_trt
@pytest.mark.parametrize("precision", [Precision.FP32, Precision.FP16, Precision.INT8])
def test_build_and_run_minilm_against_onnxruntime(tmp_path: Path, precision: Precision) -> None:
    import onnxruntime as ort

    from fleetserve.engine.calibration import calibration_texts, held_out_texts
    from fleetserve.models.store import ModelStore
    from fleetserve.models.tokenizer import TextTokenizer

    if not TensorRTBackend.available():
        pytest.skip("TensorRT is installed but no CUDA GPU is visible")
    model = ModelStore().resolve("minilm")
    assert model.tokenizer_path is not None
    profile = ShapeProfile(max_batch=8, max_seq=64, seq_buckets=(32, 64), batch_buckets=(1, 8))
    spec = BuildSpec("minilm", model.onnx_path, precision, profile, "cuda", tuple(calibration_texts()),
                     {"tokenizer": str(model.tokenizer_path)})
    backend = TensorRTBackend()
    backend.build(spec, tmp_path)
    engine = backend.load(tmp_path, profile)
    inst = engine.instance()
    feed = TextTokenizer(model.tokenizer_path, 64).encode(held_out_texts()[:5]).as_inputs()
    got = inst.infer(feed)
    ref = ort.InferenceSession(str(model.onnx_path)).run(["sentence_embedding"], feed)[0]
    assert got["last_hidden_state"].shape[:2] == feed["input_ids"].shape
    cos = (got["sentence_embedding"] * ref).sum(1) / (
        np.linalg.norm(got["sentence_embedding"], axis=1) * np.linalg.norm(ref, axis=1))
    assert cos.min() > 0.98
    engine.close()
