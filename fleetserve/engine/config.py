"""What to build and how to load it: the engine part of ``fleetserve build`` and ``fleetserve serve``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from fleetserve.engine.base import Precision, ShapeProfile, batch_ladder
from fleetserve.engine.registry import BACKENDS
from fleetserve.options import option, positive_ints

MODEL_HELP = "minilm, bert-base, bert-large, tiny, or a path to an .onnx file (a tokenizer.json beside it enables text)"


@dataclass(frozen=True)
class EngineConfig:
    """One engine: the model, its precision, the backend that runs it and the shapes it is built for."""

    model: str = option("minilm", MODEL_HELP, positional=True, required=True)
    precision: Precision = option(Precision.FP32, "numeric precision of the engine (int8/fp8 are calibrated)")
    backend: str = option("auto", "engine backend; auto: the fastest present one that runs the precision",
                          choices=("auto", *BACKENDS))
    device: str = option("cpu", "cpu or cuda[:N]")
    calibration: Path | None = option(None, "unlabelled text, one per line, to calibrate int8/fp8",
                                      metavar="FILE", default_text="a corpus shipped with fleetserve")
    int8_method: str | None = option(None, "int8 quantisation: dynamic or static",
                                     choices=("dynamic", "static"), default_text="the backend's choice")
    max_batch: int = option(32, "largest batch the engine is built for; also the most rows per engine call")
    max_seq: int | None = option(None, "longest sequence in tokens", default_text="the model's maximum")
    seq_buckets: tuple[int, ...] = option(
        (), "padded sequence lengths the engine is built for and batches are cut at (one CUDA graph or "
        "TensorRT profile each; finer buckets pad less), e.g. 64,128,192,256; max-seq is always one",
        parse=positive_ints, repeat=False, metavar="N[,N...]", default_text="16,32,64,128,256,512 up to max-seq")
    batch_buckets: tuple[int, ...] = option(
        (), "batch sizes a graph backend captures (one CUDA graph per batch size and sequence bucket; a batch "
        "runs the smallest that holds it), e.g. 1,8,32,128; max-batch is always one",
        parse=positive_ints, repeat=False, metavar="N[,N...]",
        default_text="on GPUs 1,2,4 and every multiple of 8 up to max-batch; on CPUs 1,2,4,8,16,32, warm-up only")
    accuracy_threshold: float = option(0.99, "refuse a reduced-precision build whose mean cosine vs fp32 is lower")
    home: Path | None = None  # None = $FLEETSERVE_HOME or ~/.cache/fleetserve
    options: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "precision", Precision(self.precision))
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {self.max_batch}")
        if self.max_seq is not None and not 1 <= self.max_seq <= 8192:
            raise ValueError(f"max_seq must be in 1..8192, got {self.max_seq}")
        if self.seq_buckets and max(self.seq_buckets) > (self.max_seq or 8192):
            raise ValueError(f"seq_buckets {list(self.seq_buckets)} reach past max_seq ({self.max_seq})")
        if self.batch_buckets and max(self.batch_buckets) > self.max_batch:
            raise ValueError(f"batch_buckets {list(self.batch_buckets)} reach past max_batch ({self.max_batch})")
        if not 0.0 < self.accuracy_threshold <= 1.0:
            raise ValueError(f"accuracy_threshold must be in (0, 1], got {self.accuracy_threshold}")
        if self.int8_method not in (None, "dynamic", "static"):
            raise ValueError(f"int8_method must be dynamic or static, got {self.int8_method!r}")

    def profile(self, model_max_seq: int) -> ShapeProfile:
        """The shapes to build and warm for. A GPU engine pads a batch up to a captured graph, so its default
        batch sizes are the fine :func:`batch_ladder`; ONNX Runtime on a CPU runs any batch and only warms up
        at them, so it keeps a few (each one more is warm-up time at every sequence bucket)."""
        max_seq = min(self.max_seq or model_max_seq, model_max_seq)
        shapes: dict[str, tuple[int, ...]] = {}
        if self.seq_buckets:
            shapes["seq_buckets"] = self.seq_buckets
        if self.batch_buckets or self.device != "cpu":
            shapes["batch_buckets"] = self.batch_buckets or batch_ladder(self.max_batch)
        return ShapeProfile(max_batch=self.max_batch, max_seq=max_seq, **shapes)
