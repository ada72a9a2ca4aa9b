"""``torch-cuda`` backend: a zoo or Hugging Face BERT model -> fp16 / bf16 / FP8 encoder replayed as CUDA graphs.

Build: load the model's PyTorch definition, lay its weights out for :class:`Encoder`, convert them to the
precision asked for (FP8: calibrate activation scales on the unlabelled calibration text first), write
``encoder.json`` + ``weights.pt`` into the artifact directory, then measure the artifact against the FP32
model on held-out text (cosine of sentence embeddings) and put that in the build report.
Load: weights onto the GPU once; every :meth:`TorchCudaEngine.instance` captures its own CUDA graphs and
owns its own stream (:mod:`fleetserve.engine.torch_graphs`), so several instances share one GPU.

``torch.compile`` is not used: with the element-wise chains already fused and every shape replayed from a
graph, Inductor has little left to fuse, and a plain-PyTorch trial on the H200 gained 4% at batch 128
for minutes of compile time per shape set.

Options (``BuildSpec.options``): ``gelu`` = ``tanh`` (GELU's tanh form: cuBLASLt's bias+GELU epilogue in
half precision, the hardware tanh in FP8's GELU + cast pass; default) or ``exact`` (erf); ``ffn1`` =
``triton`` (one FP8 GEMM with a bias+GELU+cast epilogue; default: faster than the other at every batch size
on the H200, BENCHMARKS.md §10.2) or ``cublas`` (``_scaled_mm`` then a GELU+cast pass); ``attention`` =
``triton`` (one kernel from the QKV product's output to the output projection's input, FP8 cast included;
default: faster than the other in every shape measured on the H200 but BERT-base fp16 at batch ≥ 128, where it
is 0.2-2.4% slower, BENCHMARKS.md §10.2) or ``sdpa`` (PyTorch's ``scaled_dot_product_attention``, cuDNN on the
H200); ``fp8_margin``
(default 2); ``fp8_fast_accum`` = ``1``/``0`` (default 1).
"""

from __future__ import annotations

import importlib.util
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fleetserve.engine.base import BuildReport, BuildSpec, EngineError, Precision, ShapeProfile, TensorSpec

if TYPE_CHECKING:
    import torch

    from fleetserve.engine.torch_encoder import Encoder, EncoderConfig
    from fleetserve.engine.torch_graphs import GraphInstance

FORMAT = 2  # 2: the artifact records its attention option
META, WEIGHTS = "encoder.json", "weights.pt"
CALIBRATION_BATCH = 32
ACCURACY_BATCH = 16
_DTYPES = {Precision.FP32: "float32", Precision.FP16: "float16", Precision.BF16: "bfloat16", Precision.FP8: "bfloat16"}


@dataclass(frozen=True)
class TorchCudaOptions:
    gelu: str = "tanh"
    ffn1: str = "triton"
    attention: str = "triton"
    fp8_margin: float = 2.0
    fp8_fast_accum: bool = True

    def __post_init__(self) -> None:
        for name, allowed in (("gelu", ("tanh", "exact")), ("ffn1", ("cublas", "triton")),
                              ("attention", ("sdpa", "triton"))):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        if not 1.0 <= self.fp8_margin <= 64.0:
            raise ValueError(f"fp8_margin must be in [1, 64], got {self.fp8_margin}")

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> TorchCudaOptions:
        try:
            margin = float(options.get("fp8_margin", cls.fp8_margin))
        except ValueError:
            raise ValueError(f"fp8_margin must be a number, got {options['fp8_margin']!r}") from None
        accum = str(options.get("fp8_fast_accum", "1")).lower()
        if accum not in ("0", "1", "true", "false"):
            raise ValueError(f"fp8_fast_accum must be 0 or 1, got {accum!r}")
        return cls(
            gelu=options.get("gelu", cls.gelu), ffn1=options.get("ffn1", cls.ffn1),
            attention=options.get("attention", cls.attention), fp8_margin=margin,
            fp8_fast_accum=accum in ("1", "true"),
        )


def _dtype(name: str) -> torch.dtype:
    import torch

    dtype: torch.dtype = getattr(torch, name)
    return dtype


def cuda_device(device: str) -> torch.device:
    import torch

    if not device.startswith("cuda"):
        raise EngineError(f"backend torch-cuda runs on a CUDA device (cuda or cuda:N), not {device!r}")
    if not torch.cuda.is_available():
        raise EngineError("backend torch-cuda needs a CUDA GPU and none is visible")
    dev = torch.device(device)
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    if index >= torch.cuda.device_count():
        raise EngineError(f"{device} does not exist: {torch.cuda.device_count()} CUDA device(s) are visible")
    return torch.device("cuda", index)


def prepare_weights(
    model: Any, precision: Precision, options: TorchCudaOptions, calibration: list[dict[str, torch.Tensor]],
    device: torch.device,
) -> tuple[EncoderConfig, dict[str, torch.Tensor], dict[str, float] | None]:
    """HF model -> (config, weights in the artifact's dtypes on CPU, FP8 activation scales or None)."""
    import torch

    from fleetserve.engine.torch_encoder import Encoder, EncoderConfig, weights_from_hf
    from fleetserve.engine.torch_fp8 import activation_scales, observe_amax, quantize_weights
    from fleetserve.engine.torch_kernels import TorchKernels

    cfg = EncoderConfig.from_hf(model.bert.config)
    weights = weights_from_hf(model.state_dict(), cfg)
    scales = None
    if precision is Precision.FP8:
        if cfg.hidden % 16 or cfg.intermediate % 16:
            raise EngineError(f"FP8 needs hidden and intermediate sizes divisible by 16, got {cfg}")
        ref = Encoder(cfg, {k: v.to(device) for k, v in weights.items()}, TorchKernels(), torch.float32)
        batches = [{k: v.to(device) for k, v in b.items()} for b in calibration]
        scales = activation_scales(observe_amax(ref, batches), options.fp8_margin)
        weights = quantize_weights(weights, cfg)
    dtype = _dtype(_DTYPES[precision])
    out = {k: v if v.dtype == torch.float8_e4m3fn or k.endswith("_ws") else v.to(dtype) for k, v in weights.items()}
    return cfg, {k: v.contiguous().cpu() for k, v in out.items()}, scales


def write_artifact(
    out_dir: Path, cfg: EncoderConfig, weights: Mapping[str, torch.Tensor], precision: Precision,
    scales: Mapping[str, float] | None, options: TorchCudaOptions, device: str,
) -> None:
    import torch

    torch.save(dict(weights), out_dir / WEIGHTS)
    meta = {
        "format": FORMAT, "config": cfg.to_json(), "precision": str(precision), "act_scales": scales,
        "gelu": options.gelu, "ffn1": options.ffn1, "attention": options.attention,
        "fp8_fast_accum": options.fp8_fast_accum, "device": device,
    }
    (out_dir / META).write_text(json.dumps(meta, indent=2))


def read_artifact(artifact_dir: Path) -> dict[str, Any]:
    path = artifact_dir / META
    try:
        meta: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise EngineError(f"{path} is missing or unreadable: {exc}") from None
    if meta.get("format") != FORMAT:
        raise EngineError(f"{path} has format {meta.get('format')}, this fleetserve reads format {FORMAT}")
    return meta


def make_encoder(meta: Mapping[str, Any], weights: Mapping[str, torch.Tensor], kernels: Any) -> Encoder:
    from fleetserve.engine.torch_encoder import Encoder, EncoderConfig

    precision = Precision(meta["precision"])
    return Encoder(EncoderConfig(**meta["config"]), weights, kernels, _dtype(_DTYPES[precision]), meta["act_scales"])


def _tokenized(texts: list[str], tokenizer: Path, max_seq: int, batch: int) -> list[dict[str, np.ndarray]]:
    from fleetserve.models.tokenizer import TextTokenizer

    tok = TextTokenizer(tokenizer, max_seq)
    return [tok.encode(texts[i : i + batch]).as_inputs() for i in range(0, len(texts), batch)]


def _tokenizer_path(spec: BuildSpec) -> Path:
    if "tokenizer" in spec.options:
        return Path(spec.options["tokenizer"])
    local = Path(spec.model_name) / "tokenizer.json"
    if local.is_file():
        return local
    from fleetserve.models.weights import minilm_dir

    return minilm_dir() / "tokenizer.json"


def _load_model(name: str) -> Any:
    from fleetserve.models.torch_models import load_torch_model

    try:
        return load_torch_model(name).float().eval()
    except (ValueError, RuntimeError, OSError) as exc:
        raise EngineError(f"backend torch-cuda cannot load a PyTorch definition of {name!r}: {exc}") from None


class TorchCudaEngine:
    """Weights on one GPU; :meth:`instance` adds an independent graph-replaying instance."""

    def __init__(self, encoder: Encoder, profile: ShapeProfile, device: torch.device) -> None:
        from fleetserve.engine.gpu_io import EMBEDDING, HIDDEN, INPUT_NAMES

        hidden = encoder.cfg.hidden
        self.inputs = [TensorSpec(n, "INT64", (-1, -1)) for n in INPUT_NAMES]
        self.outputs = [TensorSpec(HIDDEN, "FP32", (-1, -1, hidden)), TensorSpec(EMBEDDING, "FP32", (-1, hidden))]
        self.profile = profile
        self.device = str(device)
        self._torch_device = device
        self._encoder = encoder
        self._instances: list[GraphInstance] = []

    @property
    def encoder(self) -> Encoder:
        return self._encoder

    def instance(self) -> GraphInstance:
        from fleetserve.engine.torch_graphs import GraphInstance

        inst = GraphInstance(self._encoder, self.profile, self._torch_device)
        self._instances.append(inst)
        return inst

    def close(self) -> None:
        for inst in self._instances:
            inst.close()
        self._instances.clear()


class TorchCudaBackend:
    name = "torch-cuda"

    @staticmethod
    def available() -> bool:
        if importlib.util.find_spec("torch") is None or importlib.util.find_spec("triton") is None:
            return False
        import torch

        return bool(torch.cuda.is_available())

    def version(self) -> str:
        import torch

        return f"torch-{torch.__version__}-cuda{torch.version.cuda}-fmt{FORMAT}"

    def supports(self, precision: Precision, device: str) -> bool:
        if not device.startswith("cuda") or precision is Precision.INT8:
            return False
        if precision is not Precision.FP8:
            return True
        import torch

        # e4m3 matrix products need Ada or Hopper (compute capability 8.9+).
        return bool(torch.cuda.is_available() and torch.cuda.get_device_capability(cuda_device(device)) >= (8, 9))

    def build(self, spec: BuildSpec, out_dir: Path) -> BuildReport:
        import torch

        if not self.supports(spec.precision, spec.device):
            raise EngineError(
                f"backend torch-cuda does not support {spec.precision} on {spec.device}; "
                "it runs fp32, fp16, bf16 and (on compute capability 8.9+) fp8 on CUDA devices"
            )
        try:
            options = TorchCudaOptions.from_options(spec.options)
        except ValueError as exc:
            raise EngineError(str(exc)) from None
        device = cuda_device(spec.device)
        t0 = time.perf_counter()
        model = _load_model(spec.model_name)
        tokenizer = _tokenizer_path(spec)
        calib: list[dict[str, torch.Tensor]] = []
        report = BuildReport(backend=self.name, precision=str(spec.precision), device=str(device))
        if spec.precision is Precision.FP8:
            from fleetserve.engine.calibration import calibration_texts

            texts = list(spec.calibration_texts) or calibration_texts()
            calib = [{k: torch.from_numpy(v) for k, v in b.items()}
                     for b in _tokenized(texts, tokenizer, spec.profile.max_seq, CALIBRATION_BATCH)]
            report.notes.append(f"FP8 activation scales calibrated on {len(texts)} texts, margin {options.fp8_margin}")
        with torch.inference_mode():
            cfg, weights, scales = prepare_weights(model, spec.precision, options, calib, device)
        write_artifact(out_dir, cfg, weights, spec.precision, scales, options, str(device))
        report.method = _describe(spec.precision, options)
        report.fusions = {"qkv_matmul": cfg.layers, "add_layernorm": 2 * cfg.layers + 1,
                          "cuda_graphs": len(spec.profile.batch_buckets) * len(spec.profile.seq_buckets)}
        report.accuracy = self._accuracy(model, out_dir, spec.profile, device, tokenizer)
        report.build_seconds = round(time.perf_counter() - t0, 2)
        return report

    def _accuracy(
        self, model: Any, artifact: Path, profile: ShapeProfile, device: torch.device, tokenizer: Path
    ) -> dict[str, float]:
        """Cosine of sentence embeddings, this artifact's engine vs the FP32 PyTorch model, on held-out text."""
        import torch

        from fleetserve.engine.accuracy import cosine_report
        from fleetserve.engine.calibration import held_out_texts
        from fleetserve.engine.gpu_io import INPUT_NAMES

        ref = model.to(device)

        def reference(batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
            with torch.inference_mode():
                ids, mask, types = (torch.from_numpy(batch[n]).to(device) for n in INPUT_NAMES)
                return {"sentence_embedding": ref(ids, mask, types)[1].float().cpu().numpy()}

        engine = self.load(artifact, profile)
        try:
            inst = engine.instance()
            batches = _tokenized(held_out_texts(), tokenizer, profile.max_seq, min(ACCURACY_BATCH, profile.max_batch))
            return cosine_report(reference, lambda b: inst.infer(b, ("sentence_embedding",)), batches)
        finally:
            engine.close()
            model.cpu()

    def load(self, artifact_dir: Path, profile: ShapeProfile, threads: int = 0) -> TorchCudaEngine:
        import torch

        from fleetserve.engine.torch_kernels import TritonKernels

        meta = read_artifact(artifact_dir)
        device = cuda_device(meta["device"])
        if profile.max_seq > int(meta["config"]["max_positions"]):
            raise EngineError(
                f"profile max_seq {profile.max_seq} exceeds the model's {meta['config']['max_positions']} positions"
            )
        weights = torch.load(artifact_dir / WEIGHTS, map_location=device, weights_only=True)
        kernels = TritonKernels(
            tanh_gelu=meta["gelu"] != "exact", fast_accum=bool(meta["fp8_fast_accum"]),
            fused_ffn1=meta["ffn1"] == "triton", fused_attention=meta["attention"] == "triton",
        )
        return TorchCudaEngine(make_encoder(meta, weights, kernels), profile, device)


def _describe(precision: Precision, options: TorchCudaOptions) -> str:
    gelu = "cuBLASLt bias+GELU epilogue (tanh GELU)" if options.gelu == "tanh" else "exact GELU (Triton)"
    attention = "SDPA attention"
    if options.attention == "triton":
        attention = "Triton attention (QKV product to output projection, one pass)"
    common = f"{attention}, fused QKV, Triton residual+LayerNorm, CUDA graph per bucket"
    if precision is Precision.FP8:
        accum = "fast accumulation" if options.fp8_fast_accum else "fp32 accumulation"
        tanh = "tanh" if options.gelu == "tanh" else "exact"
        ffn1 = (f"Triton FP8 GEMM with bias+{tanh} GELU+FP8 epilogue for FFN1" if options.ffn1 == "triton"
                else f"Triton {tanh} GELU+FP8 cast after FFN1")
        return (f"FP8 e4m3 linear layers (torch._scaled_mm, static per-tensor scales, {accum}), "
                f"{ffn1}, bf16 residual stream, {common}")
    return f"{precision} weights and activations, {gelu}, {common}"
