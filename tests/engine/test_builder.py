from __future__ import annotations

import json
import shutil
import threading
import time

import numpy as np
import pytest

from fleetserve.engine.base import EngineError, Precision, batch_ladder
from fleetserve.engine.builder import build, engine_cache
from fleetserve.engine.calibration import calibration_texts
from fleetserve.engine.config import EngineConfig
from fleetserve.engine.ort_static import quantized_activations
from fleetserve.models.store import ModelStore
from fleetserve.models.tokenizer import TextTokenizer
from tests.support.markers import needs_torch


def _encode(model: str, texts: list[str]) -> dict[str, np.ndarray]:
    stored = ModelStore().resolve(model)
    assert stored.tokenizer_path is not None
    return TextTokenizer(stored.tokenizer_path, 128).encode(texts).as_inputs()


def test_build_then_cache_hit_fast() -> None:
    cfg = EngineConfig(model="tiny", precision=Precision.FP32)
    first = build(cfg, quiet=True)
    t0 = time.perf_counter()
    second = build(cfg, quiet=True)
    assert second.cache_hit and second.key == first.key
    assert time.perf_counter() - t0 < 1.0


def test_seq_buckets_shape_the_engine_and_its_cache_key() -> None:
    default = EngineConfig(model="tiny", max_seq=128)
    fine = EngineConfig(model="tiny", max_seq=128, seq_buckets=(48, 96))
    assert default.profile(512).seq_buckets == (16, 32, 64, 128)
    assert fine.profile(512).seq_buckets == (48, 96, 128)  # max-seq is always a bucket
    assert build(fine, quiet=True).key != build(default, quiet=True).key


def test_gpu_batch_buckets_default_to_a_ladder_of_eights_and_share_the_cached_artifact() -> None:
    assert batch_ladder(128) == (1, 2, 4, *range(8, 129, 8))
    assert batch_ladder(3) == (1, 2, 3) and batch_ladder(12) == (1, 2, 4, 8, 12)
    default = EngineConfig(model="tiny", max_batch=40)
    chosen = EngineConfig(model="tiny", max_batch=40, batch_buckets=(1, 16))
    assert EngineConfig(model="tiny", max_batch=40, device="cuda").profile(512).batch_buckets == (
        1, 2, 4, 8, 16, 24, 32, 40)
    assert default.profile(512).batch_buckets == (1, 2, 4, 8, 16, 32, 40)  # CPU: warm-up sizes only
    assert chosen.profile(512).batch_buckets == (1, 16, 40)  # max-batch is always a bucket
    # Graph backends capture at load, so the batch sizes are not part of the build.
    assert build(chosen, quiet=True).key == build(default, quiet=True).key
    with pytest.raises(ValueError, match="reach past max_batch"):
        EngineConfig(model="tiny", max_batch=8, batch_buckets=(16,))


def test_int8_build_reports_accuracy_and_differs_in_key() -> None:
    fp32 = build(EngineConfig(model="tiny"), quiet=True)
    int8 = build(EngineConfig(model="tiny", precision=Precision.INT8), quiet=True)
    assert int8.key != fp32.key
    acc = int8.report["accuracy"]
    assert isinstance(acc, dict) and 0.99 <= acc["mean_cosine"] <= 1.0 and acc["min_cosine"] <= acc["mean_cosine"]
    assert "dynamic" in str(int8.report["method"])


def test_accuracy_gate_refuses_to_cache() -> None:
    cfg = EngineConfig(model="tiny", precision=Precision.INT8, accuracy_threshold=1.0, max_batch=7)
    with pytest.raises(EngineError, match="not accurate enough"):
        build(cfg, quiet=True)
    assert not any(str(e.meta.get("profile", "")).startswith("b7-") for e in engine_cache(cfg).entries())


def test_corrupt_cached_engine_is_rebuilt() -> None:
    cfg = EngineConfig(model="tiny", max_batch=5)
    built = build(cfg, quiet=True)
    (built.entry.directory / "model.onnx").write_bytes(b"corrupt")
    again = build(cfg, quiet=True)
    assert not again.cache_hit
    engine = again.load()
    out = engine.instance().infer(_encode("tiny", ["hello world"]))
    assert out["sentence_embedding"].shape == (1, 32)


def test_unsupported_precision_is_a_clear_error() -> None:
    with pytest.raises(EngineError, match="does not support fp16 on cpu"):
        build(EngineConfig(model="tiny", precision=Precision.FP16), quiet=True)


def test_instances_run_concurrently_and_agree() -> None:
    engine = build(EngineConfig(model="tiny"), quiet=True).load(threads=1)
    feed = _encode("tiny", ["cheap running shoes", "best coffee grinder under 50 dollars"])
    expected = engine.instance().infer(feed)["sentence_embedding"]
    results: list[np.ndarray] = []
    instances = [engine.instance() for _ in range(3)]

    def work(inst: object) -> None:
        for _ in range(20):
            results.append(inst.infer(feed)["sentence_embedding"])  # type: ignore[attr-defined]

    threads = [threading.Thread(target=work, args=(i,)) for i in instances]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 60
    for r in results:
        np.testing.assert_allclose(r, expected, atol=1e-6)


def test_calibration_default_excludes_held_out() -> None:
    from fleetserve.engine.calibration import held_out_texts

    assert not set(calibration_texts()) & set(held_out_texts())


@needs_torch
def test_minilm_fusions_and_int8_accuracy() -> None:
    fp32 = build(EngineConfig(model="minilm"), quiet=True)
    fusions = fp32.report["fusions"]
    assert isinstance(fusions, dict)
    for op in ("Attention", "SkipLayerNormalization", "BiasGelu", "EmbedLayerNormalization"):
        assert fusions.get(op, 0) >= 1, f"{op} fusion missing: {fusions}"
    # Token-id bounds are read through the fused embedding's int32 casts, once, at build time.
    limits = json.loads((fp32.entry.directory / "index_limits.json").read_text())
    assert limits == {"input_ids": 30522, "token_type_ids": 2}
    int8 = build(EngineConfig(model="minilm", precision=Precision.INT8), quiet=True)
    acc = int8.report["accuracy"]
    assert isinstance(acc, dict) and acc["mean_cosine"] >= 0.99


@needs_torch
def test_static_int8_that_quantizes_no_activation_fails_instead_of_caching_an_fp32_engine() -> None:
    with pytest.raises(EngineError, match="static int8 quantized no activation"):
        build(EngineConfig(model="minilm", precision=Precision.INT8, int8_method="static"), quiet=True)


def test_static_int8_of_an_unfused_graph_quantizes_its_activations() -> None:
    built = build(EngineConfig(model="tiny", precision=Precision.INT8, int8_method="static"), quiet=True)
    assert built.report["method"] == "int8 static QDQ, calibrated on unlabelled text"
    assert quantized_activations(built.entry.directory / "model.onnx") > 0


def test_model_path_build(tmp_path: object) -> None:
    stored = ModelStore().resolve("tiny")
    dest = tmp_path / "mine.onnx"  # type: ignore[operator]
    shutil.copy(stored.onnx_path, dest)
    built = build(EngineConfig(model=str(dest)), quiet=True)
    assert built.model.name == "mine"
    assert built.load().instance().infer(_encode("tiny", ["x"]))["sentence_embedding"].shape == (1, 32)


def test_an_exported_model_directory_keeps_its_name_and_finds_the_engine_built_from_it(tmp_path: object) -> None:
    """The image's layout: an exported model copied to a read-only folder; the init container builds from
    its path into the shared cache and the replica, given the same path, loads that engine."""
    stored = ModelStore().resolve("tiny")
    baked = tmp_path / "opt" / "tiny"  # type: ignore[operator]
    shutil.copytree(stored.directory, baked)
    first = build(EngineConfig(model=str(baked / "model.onnx"), precision=Precision.INT8), quiet=True)
    again = build(EngineConfig(model=str(baked / "model.onnx"), precision=Precision.INT8), quiet=True)
    assert first.model.name == "tiny" and first.model.tokenizer_path == baked / "tokenizer.json"
    assert again.cache_hit and again.key == first.key
