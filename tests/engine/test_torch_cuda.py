"""torch-cuda backend: the encoder against Hugging Face BERT and FP8 numerics on the CPU; graphs on a GPU.

The CPU tests check what decides correctness everywhere (weight layout, masking, pooling, calibration,
artifact format, input validation); the GPU tests (skipped without CUDA) check the Triton kernels against
their PyTorch reference, ``_scaled_mm`` against FP8 emulation, and whole builds with padding, buckets and
concurrent instances.
"""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

from fleetserve.engine.base import BuildSpec, EngineError, Precision, ShapeProfile
from fleetserve.errors import InvalidInput

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from fleetserve.engine.gpu_io import bucket_for, check_inputs  # noqa: E402
from fleetserve.engine.torch_cuda import (  # noqa: E402
    TorchCudaBackend,
    TorchCudaOptions,
    make_encoder,
    prepare_weights,
    read_artifact,
    write_artifact,
)
from fleetserve.engine.torch_encoder import Encoder, EncoderConfig, weights_from_hf  # noqa: E402
from fleetserve.engine.torch_fp8 import activation_scales, required_scales  # noqa: E402
from fleetserve.engine.torch_kernels import FP8, Fp8Scales, TorchKernels  # noqa: E402
from fleetserve.models.torch_models import SentenceEncoder  # noqa: E402

CUDA = torch.cuda.is_available()
gpu = pytest.mark.skipif(not CUDA, reason="needs an NVIDIA GPU with CUDA (runs on the H200 device machine)")
VOCAB = 30522  # the zoo tokenizer's vocabulary, so real text can be fed to the tiny model


def tiny_model(seed: int = 0) -> SentenceEncoder:
    torch.manual_seed(seed)
    cfg = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        max_position_embeddings=128,
    )
    return SentenceEncoder(transformers.BertModel(cfg, add_pooling_layer=False)).eval()


def random_batch(rng: np.random.Generator, b: int, s: int) -> dict[str, np.ndarray]:
    ids = rng.integers(1, VOCAB, size=(b, s), dtype=np.int64)
    mask = np.ones_like(ids)
    for row in range(b):
        mask[row, rng.integers(1, s + 1) :] = 0
    types = (rng.random((b, s)) < 0.3).astype(np.int64) * mask
    return {"input_ids": ids * mask, "attention_mask": mask, "token_type_ids": types}


def as_torch(batch: dict[str, np.ndarray], device: str = "cpu") -> list:
    return [torch.from_numpy(batch[n]).to(device) for n in ("input_ids", "attention_mask", "token_type_ids")]


def cosines(a, b) -> np.ndarray:
    return torch.nn.functional.cosine_similarity(a.float().cpu(), b.float().cpu()).numpy()


def test_encoder_matches_hugging_face_bert_with_padding() -> None:
    model = tiny_model()
    cfg = EncoderConfig.from_hf(model.bert.config)
    enc = Encoder(cfg, weights_from_hf(model.state_dict(), cfg), TorchKernels(), torch.float32)
    batch = random_batch(np.random.default_rng(1), 5, 24)
    with torch.no_grad():
        ref_hidden, ref_emb = model(*as_torch(batch))
        hidden, emb = enc.forward(*as_torch(batch))
    keep = torch.from_numpy(batch["attention_mask"]).bool()
    torch.testing.assert_close(hidden[keep], ref_hidden[keep], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(emb, ref_emb, atol=1e-5, rtol=1e-4)


def test_fully_padded_row_stays_finite() -> None:
    model = tiny_model()
    cfg = EncoderConfig.from_hf(model.bert.config)
    enc = Encoder(cfg, weights_from_hf(model.state_dict(), cfg), TorchKernels(), torch.float16)
    batch = random_batch(np.random.default_rng(2), 3, 16)
    batch["attention_mask"][1] = 0
    enc.w = {k: v.half() for k, v in enc.w.items()}
    with torch.no_grad():
        hidden, emb = enc.forward(*as_torch(batch))
    assert torch.isfinite(hidden).all() and torch.isfinite(emb).all()
    assert float(emb[1].abs().sum()) == 0.0


def test_config_rejects_unsupported_models() -> None:
    model = tiny_model()
    model.bert.config.hidden_act = "relu"
    with pytest.raises(ValueError, match="exact GELU"):
        EncoderConfig.from_hf(model.bert.config)
    with pytest.raises(ValueError, match="multiple of"):
        EncoderConfig(100, 65, 1, 4, 128, 64, 2, 1e-12)


def test_weights_from_hf_names_the_missing_weight() -> None:
    model = tiny_model()
    cfg = EncoderConfig.from_hf(model.bert.config)
    state = {k: v for k, v in model.state_dict().items() if "layer.1.output.dense.bias" not in k}
    with pytest.raises(ValueError, match=r"encoder\.layer\.1\.output\.dense\.bias"):
        weights_from_hf(state, cfg)


@pytest.mark.parametrize("tanh_gelu", [False, True], ids=["exact-gelu", "tanh-gelu"])
def test_fp8_calibrated_weights_stay_close_to_fp32(tanh_gelu: bool) -> None:
    model = tiny_model()
    rng = np.random.default_rng(3)
    calib = [{k: torch.from_numpy(v) for k, v in random_batch(rng, 8, 32).items()} for _ in range(4)]
    cfg, weights, scales = prepare_weights(model, Precision.FP8, TorchCudaOptions(), calib, torch.device("cpu"))
    assert scales is not None and sorted(scales) == sorted(required_scales(cfg))
    assert all(s > 0 for s in scales.values())
    assert weights["0.qkv_w"].dtype == FP8 and weights["0.qkv_ws"].dtype == torch.float32
    assert weights["emb.word"].dtype == torch.bfloat16
    meta = {"precision": "fp8", "config": cfg.to_json(), "act_scales": scales}
    enc = make_encoder(meta, weights, TorchKernels(tanh_gelu=tanh_gelu))
    held = random_batch(rng, 16, 32)
    with torch.no_grad():
        sims = cosines(model(*as_torch(held))[1], enc.forward(*as_torch(held))[1])
    assert sims.mean() > 0.99, sims


def test_activation_scales_apply_margin_and_floor() -> None:
    scales = activation_scales({"0.qkv": 448.0, "0.o": 0.0}, margin=2.0)
    assert scales["0.qkv"] == pytest.approx(2.0)
    assert 0 < scales["0.o"] < 1e-7
    with pytest.raises(ValueError, match="margin"):
        activation_scales({"a": 1.0}, margin=0.5)


def test_artifact_round_trip(tmp_path: Path) -> None:
    model = tiny_model()
    cfg, weights, scales = prepare_weights(model, Precision.BF16, TorchCudaOptions(gelu="exact"), [],
                                           torch.device("cpu"))
    assert scales is None and weights["0.ff1_w"].dtype == torch.bfloat16
    write_artifact(tmp_path, cfg, weights, Precision.BF16, scales, TorchCudaOptions(gelu="exact"), "cuda:0")
    meta = read_artifact(tmp_path)
    assert meta["precision"] == "bf16" and meta["gelu"] == "exact" and meta["device"] == "cuda:0"
    assert EncoderConfig(**meta["config"]) == cfg
    loaded = torch.load(tmp_path / "weights.pt", weights_only=True)
    assert torch.equal(loaded["1.qkv_w"], weights["1.qkv_w"])
    (tmp_path / "encoder.json").write_text(json.dumps({**meta, "format": 99}))
    with pytest.raises(EngineError, match="format 99"):
        read_artifact(tmp_path)


def test_options_parse_and_validate() -> None:
    opts = TorchCudaOptions.from_options({"gelu": "exact", "fp8_margin": "4", "fp8_fast_accum": "0", "tokenizer": "x"})
    assert opts == TorchCudaOptions(gelu="exact", fp8_margin=4.0, fp8_fast_accum=False)
    with pytest.raises(ValueError, match="gelu must be one of tanh, exact"):
        TorchCudaOptions.from_options({"gelu": "fast"})
    with pytest.raises(ValueError, match="fp8_margin must be a number"):
        TorchCudaOptions.from_options({"fp8_margin": "big"})
    with pytest.raises(ValueError, match="fp8_fast_accum"):
        TorchCudaOptions.from_options({"fp8_fast_accum": "maybe"})
    assert TorchCudaOptions().attention == "triton"
    assert TorchCudaOptions.from_options({"attention": "sdpa"}).attention == "sdpa"
    with pytest.raises(ValueError, match="attention must be one of sdpa, triton"):
        TorchCudaOptions.from_options({"attention": "flash"})


def test_check_inputs_names_each_problem() -> None:
    limits = {"input_ids": 100, "attention_mask": 2, "token_type_ids": 2}
    ok = {"input_ids": np.ones((2, 8), np.int64), "attention_mask": np.ones((2, 8), np.int64),
          "token_type_ids": np.zeros((2, 8), np.int64)}
    assert check_inputs(ok, limits, 4, 32) == (2, 8)
    cases = [
        ({k: v for k, v in ok.items() if k != "token_type_ids"}, "missing input"),
        ({**ok, "attention_mask": np.ones((2, 9), np.int64)}, "attention_mask has shape"),
        ({**ok, "input_ids": np.ones((2, 8), np.float32)}, "must be integers"),
        ({**ok, "input_ids": np.full((2, 8), 100, np.int64)}, r"input_ids values must be in \[0, 99\]"),
        ({**ok, "token_type_ids": np.full((2, 8), 2, np.int64)}, "token_type_ids values"),
        ({k: np.ones((2, 40), np.int64) for k in ok}, "sequence length 40 exceeds"),
        ({k: np.ones((5, 8), np.int64) for k in ok}, "batch 5 exceeds"),
        ({k: np.ones((8,), np.int64) for k in ok}, r"\[batch, seq\] matrix"),
    ]
    for bad, message in cases:
        with pytest.raises(InvalidInput, match=message):
            check_inputs(bad, limits, 4, 32)


def test_bucket_for() -> None:
    assert bucket_for((1, 8, 32), 1, "batch") == 1
    assert bucket_for((1, 8, 32), 9, "batch") == 32
    with pytest.raises(InvalidInput, match="batch 33 exceeds"):
        bucket_for((1, 8, 32), 33, "batch")


def test_backend_capabilities_without_a_gpu() -> None:
    backend = TorchCudaBackend()
    assert not backend.supports(Precision.FP16, "cpu")
    assert not backend.supports(Precision.INT8, "cuda")
    assert backend.supports(Precision.BF16, "cuda")
    assert isinstance(TorchCudaBackend.available(), bool)
    if not CUDA:
        assert not TorchCudaBackend.available()
        spec = BuildSpec("minilm", Path("x.onnx"), Precision.FP16, ShapeProfile(), "cpu")
        with pytest.raises(EngineError, match="does not support fp16 on cpu"):
            backend.build(spec, Path("unused"))


# ---------------------------------------------------------------------------------------------- GPU


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from fleetserve.models.weights import minilm_dir

    path = tmp_path_factory.mktemp("tiny-bert")
    tiny_model().bert.save_pretrained(str(path))
    shutil.copy(minilm_dir() / "tokenizer.json", path / "tokenizer.json")
    return path


PROFILE = ShapeProfile(max_batch=8, max_seq=64, seq_buckets=(16, 32, 64), batch_buckets=(1, 4, 8))


@gpu
def test_triton_kernels_match_reference() -> None:
    from fleetserve.engine.torch_kernels import TritonKernels

    tk, rk = TritonKernels(tanh_gelu=False), TorchKernels()
    g = torch.Generator(device="cuda").manual_seed(0)
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        x, r = (torch.randn(37, 384, device="cuda", generator=g).to(dtype) for _ in range(2))
        w, b = (torch.randn(384, device="cuda", generator=g).to(dtype) for _ in range(2))
        y1, q1 = tk.add_layernorm(x, r, w, b, 1e-12, 0.02)
        y2, q2 = rk.add_layernorm(x, r, w, b, 1e-12, 0.02)
        torch.testing.assert_close(y1.float(), y2.float(), atol=2e-2, rtol=1e-2)
        assert q1 is not None and q2 is not None
        assert_fp8_close(q1, q2)
        z = torch.randn(5, 3001, device="cuda", generator=g).to(dtype) * 3
        torch.testing.assert_close(tk.gelu(z, None).float(), rk.gelu(z, None).float(), atol=2e-2, rtol=1e-2)
        assert_fp8_close(tk.gelu(z, 0.01), rk.gelu(z, 0.01))
        assert_fp8_close(tk.quantize(z, 0.01), rk.quantize(z, 0.01))


@gpu
def test_every_tuning_choice_computes_the_same() -> None:
    """Autotuning checks only speed: each configuration of both fused FFN1 kernels is run here and checked."""
    import triton

    from fleetserve.engine import torch_triton as tt

    triton.set_allocator(lambda size, _a, _s: torch.empty(size, dtype=torch.int8, device="cuda"))
    for m in (300, 9000):
        xq, wq, scales, bias = fp8_problem(m, 1536, 384, seed=7)
        want = TorchKernels(tanh_gelu=True).fp8_linear_gelu(xq, wq, scales, bias, 0.01).float()
        out = torch.empty((m, 1536), dtype=FP8, device="cuda")
        args = (xq, wq, bias, out, m, 1536, 384, 1 << (m - 1).bit_length(), scales.product, 100.0)
        n_tiles = {id(c): triton.cdiv(m, c.kwargs["BM"]) * triton.cdiv(1536, c.kwargs["BN"])
                   for c in (*tt.fp8_gemm_gelu.configs, *tt.fp8_gemm_gelu_persistent.configs)}
        for cfg in tt.fp8_gemm_gelu.configs:
            out.view(torch.uint8).zero_()
            tt.fp8_gemm_gelu.fn[(n_tiles[id(cfg)],)](*args, TANH=True, **cfg.kwargs, num_warps=cfg.num_warps,
                                                     num_stages=cfg.num_stages)
            assert (out.float() - want).norm() / want.norm() < 3e-2, cfg
        for cfg in tt.fp8_gemm_gelu_persistent.configs:
            out.view(torch.uint8).zero_()
            tt.fp8_gemm_gelu_persistent.fn[(min(132, n_tiles[id(cfg)]),)](
                *args, TANH=True, PROGRAMS=132, **cfg.kwargs, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
            assert (out.float() - want).norm() / want.norm() < 3e-2, cfg


@gpu
def test_tanh_gelu_pass_matches_its_reference() -> None:
    """The hardware tanh (relative error about 2^-11) against PyTorch's tanh GELU, before and after the cast."""
    from fleetserve.engine.torch_kernels import TritonKernels

    tk, rk = TritonKernels(tanh_gelu=True), TorchKernels(tanh_gelu=True)
    z = torch.randn(7, 3072, device="cuda", generator=torch.Generator(device="cuda").manual_seed(4)) * 3
    for dtype in (torch.float16, torch.bfloat16):
        torch.testing.assert_close(tk.gelu(z.to(dtype), None).float(), rk.gelu(z.to(dtype), None).float(),
                                   atol=2e-2, rtol=1e-2)
        assert_fp8_close(tk.gelu(z.to(dtype), 0.01), rk.gelu(z.to(dtype), 0.01))


def assert_fp8_close(a, b) -> None:
    assert a.dtype == b.dtype == FP8
    fa, fb = a.float(), b.float()
    assert torch.isfinite(fa).all()
    # Multiplying by 1/scale instead of dividing may move a value across a rounding boundary: one e4m3 step.
    assert ((fa - fb).abs() <= fb.abs() * 0.125 + 2**-9).all()
    assert (fa != fb).float().mean() < 0.01


def fp8_problem(m: int, n: int, k: int, seed: int) -> tuple:
    from fleetserve.engine.torch_kernels import quantize_reference

    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, device="cuda", generator=g)
    w = torch.randn(n, k, device="cuda", generator=g) * 0.05
    bias = torch.randn(n, device="cuda", generator=g).bfloat16()
    xs, ws = 0.02, float(w.abs().max()) / 448
    scales = Fp8Scales(torch.tensor(xs, device="cuda"), torch.tensor(ws, device="cuda"), xs * ws)
    return quantize_reference(x, xs), quantize_reference(w, ws), scales, bias


@gpu
def test_scaled_mm_matches_fp8_emulation() -> None:
    from fleetserve.engine.torch_kernels import TritonKernels

    xq, wq, scales, bias = fp8_problem(100, 1152, 384, 1)
    got = TritonKernels().fp8_linear(xq, wq, scales, bias).float()
    want = TorchKernels().fp8_linear(xq, wq, scales, bias).float()
    assert (got - want).norm() / want.norm() < 1e-2


@gpu
# One tile per program below 8,192 rows, the persistent TMA kernel from there (9,000: a ragged last tile).
@pytest.mark.parametrize("shape", [(300, 1536, 384), (1, 3072, 768), (4096, 3072, 768), (9000, 1536, 384)])
def test_fused_fp8_ffn1_matches_reference(shape: tuple[int, int, int]) -> None:
    from fleetserve.engine.torch_kernels import TritonKernels

    xq, wq, scales, bias = fp8_problem(*shape, seed=2)
    got = TritonKernels(fused_ffn1=True).fp8_linear_gelu(xq, wq, scales, bias, 0.01)
    want = TorchKernels(tanh_gelu=True).fp8_linear_gelu(xq, wq, scales, bias, 0.01)
    assert got.shape == want.shape and got.dtype == FP8
    fa, fb = got.float(), want.float()
    assert torch.isfinite(fa).all()
    assert (fa - fb).norm() / fb.norm() < 3e-2


def attention_problem(b: int, s: int, heads: int, head_dim: int, dtype: torch.dtype,
                      seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A fused QKV output and a key bias with ragged padding; the last row fully padded when b > 1."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    qkv = (torch.randn(b * s, 3 * heads * head_dim, device="cuda", generator=g) * 2).to(dtype)
    lengths = torch.randint(1, s + 1, (b,), device="cuda", generator=g)
    mask = (torch.arange(s, device="cuda")[None, :] < lengths[:, None]).to(dtype)
    if b > 1:
        mask[-1] = 0
    return qkv, ((1.0 - mask) * -10000.0).contiguous()


@gpu
# BERT-base (12 × 64), MiniLM (12 × 32), BERT-Large at 384 tokens (16 × 64), the tiny test model (4 × 16);
# lengths that are not multiples of any tile; one head size (48) the kernel does not take (SDPA then).
@pytest.mark.parametrize("shape", [(4, 128, 12, 64), (3, 77, 12, 32), (2, 384, 16, 64), (5, 20, 4, 16),
                                   (2, 9, 2, 48)])
def test_fused_attention_matches_sdpa(shape: tuple[int, int, int, int]) -> None:
    from fleetserve.engine.torch_kernels import TritonKernels

    b, s, heads, head_dim = shape
    fused, ref = TritonKernels(fused_attention=True), TorchKernels()
    for dtype in (torch.float16, torch.bfloat16, torch.float32):  # float32: SDPA's, not TF32
        qkv, bias = attention_problem(b, s, heads, head_dim, dtype, seed=s)
        got, want = fused.attention(qkv, bias, heads, None), ref.attention(qkv, bias, heads, None)
        assert got.shape == (b * s, heads * head_dim) and got.dtype == dtype
        tolerance = 1e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(got.float(), want.float(), atol=tolerance, rtol=tolerance)
        got_q = fused.attention(qkv, bias, heads, 0.01)
        want_q = ref.attention(qkv, bias, heads, 0.01)
        assert got_q.dtype == FP8
        fa, fb = got_q.float(), want_q.float()
        assert torch.isfinite(fa).all()
        assert (fa - fb).norm() / fb.norm() < 3e-2


@gpu
def test_fused_attention_takes_more_than_65535_batch_heads() -> None:
    """One program per (batch × head, query block) on one grid axis: CUDA caps a second axis at 65,535."""
    from fleetserve.engine.torch_kernels import TritonKernels

    b, s, heads, head_dim = 4200, 16, 16, 16
    qkv, bias = attention_problem(b, s, heads, head_dim, torch.float16, seed=3)
    got = TritonKernels(fused_attention=True).attention(qkv, bias, heads, None)
    want = TorchKernels().attention(qkv, bias, heads, None)
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)


@gpu
def test_every_attention_tuning_choice_computes_the_same() -> None:
    """Autotuning checks only speed: each tile shape of the attention kernel is run here and checked."""
    import triton

    from fleetserve.engine import torch_triton as tt

    b, s, heads, head_dim = 3, 100, 12, 64
    qkv, bias = attention_problem(b, s, heads, head_dim, torch.float16, seed=1)
    want = TorchKernels().attention(qkv, bias, heads, None).float()
    out = torch.empty((b * s, heads * head_dim), dtype=torch.float16, device="cuda")
    for cfg in tt.attention.configs:
        out.zero_()
        grid = (triton.cdiv(s, cfg.kwargs["BM"]) * b * heads,)
        tt.attention.fn[grid](qkv, bias, out, s, 128, heads, heads * head_dim, head_dim**-0.5, 1.0, HD=head_dim,
                              QUANT=False, **cfg.kwargs, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=2e-2, msg=str(cfg))


@gpu
@pytest.mark.parametrize(
    ("precision", "options"),
    [
        (Precision.FP16, {}), (Precision.BF16, {"gelu": "exact"}), (Precision.FP8, {}),
        (Precision.FP8, {"ffn1": "cublas"}), (Precision.FP16, {"attention": "sdpa"}),
        (Precision.FP8, {"attention": "sdpa"}),
    ],
)
def test_build_load_infer(model_dir: Path, tmp_path: Path, precision: Precision, options: dict[str, str]) -> None:
    backend = TorchCudaBackend()
    if not backend.supports(precision, "cuda"):
        pytest.skip(f"this GPU does not run {precision}")
    spec = BuildSpec(str(model_dir), model_dir / "unused.onnx", precision, PROFILE, "cuda", options=options)
    report = backend.build(spec, tmp_path)
    assert report.accuracy["mean_cosine"] > 0.99, report.accuracy
    engine = backend.load(tmp_path, PROFILE)
    inst = engine.instance()
    assert sorted(inst.buckets) == sorted((b, s) for b in (1, 4, 8) for s in (16, 32, 64))
    batch = random_batch(np.random.default_rng(5), 3, 20)  # padded to the (4, 32) graph inside
    out = inst.infer(batch)
    assert out["last_hidden_state"].shape == (3, 20, 64) and out["last_hidden_state"].dtype == np.float32
    assert out["sentence_embedding"].shape == (3, 64)
    ref = tiny_model().cuda()
    with torch.inference_mode():
        ref_emb = ref(*as_torch(batch, "cuda"))[1]
    assert cosines(torch.from_numpy(out["sentence_embedding"]), ref_emb).min() > 0.98
    # A row's result does not depend on what it was batched with.
    single = inst.infer({k: v[1:2, :20] for k, v in batch.items()}, ("sentence_embedding",))
    np.testing.assert_allclose(single["sentence_embedding"][0], out["sentence_embedding"][1], atol=2e-2)
    assert set(single) == {"sentence_embedding"}
    engine.close()


@gpu
def test_instances_run_concurrently_with_identical_results(model_dir: Path, tmp_path: Path) -> None:
    backend = TorchCudaBackend()
    backend.build(BuildSpec(str(model_dir), model_dir / "x.onnx", Precision.FP16, PROFILE, "cuda"), tmp_path)
    engine = backend.load(tmp_path, PROFILE)
    instances = [engine.instance() for _ in range(3)]
    batches = [random_batch(np.random.default_rng(i), 8, 64) for i in range(6)]
    expected = [instances[0].infer(b)["sentence_embedding"] for b in batches]
    results: dict[tuple[int, int], np.ndarray] = {}

    def work(k: int) -> None:
        for _ in range(5):
            for i, b in enumerate(batches):
                results[(k, i)] = instances[k].infer(b)["sentence_embedding"]

    threads = [threading.Thread(target=work, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for (_, i), got in results.items():
        np.testing.assert_array_equal(got, expected[i])
    with pytest.raises(InvalidInput, match="unknown output"):
        instances[0].infer(batches[0], ("logits",))
    engine.close()
