"""Native TensorRT backend (TensorRT ≥ 10, Python API). UNVERIFIED: no machine we have runs TensorRT.

Build: the model's ONNX graph is first given its precision (FP16: every float tensor converted except the
graph's inputs and outputs, ONNX Runtime's ``float16`` converter; INT8: explicit, symmetric Q/DQ nodes on
the matrix products, calibrated on the unlabelled calibration text with ONNX Runtime's quantizer), then
parsed with TensorRT's ONNX parser into a *strongly typed* network, which is how TensorRT 11 requires
precision to be stated (its FP16/INT8 builder flags and calibrators are gone; TensorRT 10 reads the same
network the same way). One optimization profile per sequence bucket (batch 1..max, that exact length),
a workspace memory-pool limit instead of the removed workspace size, and the serialized plan is the
artifact (``model.plan`` + ``trt.json``), stored by the engine cache.

Run: each instance owns a CUDA stream, one execution context per optimization profile sharing one
pre-allocated activation block (the contexts of one instance never run at once), fixed device buffers
for every input and output bound once with ``set_tensor_address``, and pinned host buffers; a call stages
and pads the request to its sequence bucket, sets the input shapes, and runs ``execute_async_v3``.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fleetserve.engine.base import BuildReport, BuildSpec, EngineError, Precision, ShapeProfile, TensorSpec

log = logging.getLogger(__name__)

PLAN, META = "model.plan", "trt.json"
FORMAT = 1
_KSERVE = {"FLOAT": "FP32", "HALF": "FP16", "BF16": "BF16", "INT8": "INT8", "INT32": "INT32", "INT64": "INT64",
           "BOOL": "BOOL"}


@dataclass(frozen=True)
class TensorRTOptions:
    workspace_mib: int = 4096
    optimization_level: int = 3  # TensorRT's builder_optimization_level, 0..5

    def __post_init__(self) -> None:
        if not 64 <= self.workspace_mib <= 1 << 20:
            raise ValueError(f"trt_workspace_mib must be in [64, 1048576], got {self.workspace_mib}")
        if not 0 <= self.optimization_level <= 5:
            raise ValueError(f"trt_optimization_level must be in 0..5, got {self.optimization_level}")

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> TensorRTOptions:
        try:
            return cls(int(options.get("trt_workspace_mib", cls.workspace_mib)),
                       int(options.get("trt_optimization_level", cls.optimization_level)))
        except ValueError as exc:
            raise EngineError(f"invalid TensorRT option: {exc}") from None


def profile_shapes(profile: ShapeProfile) -> list[tuple[int, tuple[int, int], tuple[int, int], tuple[int, int]]]:
    """(sequence bucket, min, opt, max) [batch, seq] shapes: one optimization profile per sequence bucket."""
    return [(s, (1, s), (profile.max_batch, s), (profile.max_batch, s)) for s in profile.seq_buckets]


def token_limits(model: Any) -> dict[str, int]:
    """Exclusive upper bounds of the token inputs, read from the ONNX embedding tables where present."""
    limits = {"attention_mask": 2}
    for init in model.graph.initializer:
        if init.name.endswith("word_embeddings.weight") and init.dims:
            limits["input_ids"] = int(init.dims[0])
        elif init.name.endswith("token_type_embeddings.weight") and init.dims:
            limits["token_type_ids"] = int(init.dims[0])
    return limits


def _trt() -> Any:
    import tensorrt as trt

    return trt


def _prepare_onnx(spec: BuildSpec, out_dir: Path) -> tuple[Path, str]:
    """Write the ONNX graph TensorRT will parse, with its precision made explicit; returns (path, method)."""
    import onnx

    if spec.precision is Precision.FP32:
        return spec.model_path, "fp32 strongly typed network"
    target = out_dir / "typed.onnx"
    if spec.precision is Precision.FP16:
        from onnxruntime.transformers.float16 import convert_float_to_float16

        model = convert_float_to_float16(onnx.load(str(spec.model_path)), keep_io_types=True)
        onnx.save(model, str(target))
        return target, "fp16 graph (I/O kept fp32), strongly typed network"
    _quantize_qdq(spec, target)
    return target, "int8 explicit symmetric Q/DQ on MatMul, calibrated on unlabelled text"


def _quantize_qdq(spec: BuildSpec, target: Path, batch: int = 8) -> None:
    # TensorRT takes only symmetric (zero-point 0) int8 Q/DQ, hence the symmetric options.
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    from fleetserve.models.tokenizer import TextTokenizer

    tokenizer = spec.options.get("tokenizer")
    if not tokenizer or not spec.calibration_texts:
        raise EngineError("INT8 needs the model's tokenizer.json and calibration texts")
    tok = TextTokenizer(Path(tokenizer), spec.profile.max_seq)
    texts = list(spec.calibration_texts)
    batches = iter([tok.encode(texts[i : i + batch]).as_inputs() for i in range(0, len(texts), batch)])

    class Reader(CalibrationDataReader):
        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(batches, None)

    quantize_static(
        str(spec.model_path), str(target), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"],
        extra_options={"ActivationSymmetric": True, "WeightSymmetric": True},
    )


class TensorRTBackend:
    name = "tensorrt"

    @staticmethod
    def available() -> bool:
        if importlib.util.find_spec("tensorrt") is None or importlib.util.find_spec("torch") is None:
            return False
        import torch

        return bool(torch.cuda.is_available())

    def version(self) -> str:
        return f"tensorrt-{_trt().__version__}-fmt{FORMAT}"

    def supports(self, precision: Precision, device: str) -> bool:
        return device.startswith("cuda") and precision in (Precision.FP32, Precision.FP16, Precision.INT8)

    def build(self, spec: BuildSpec, out_dir: Path) -> BuildReport:
        import onnx

        if not self.supports(spec.precision, spec.device):
            raise EngineError(f"backend tensorrt does not support {spec.precision} on {spec.device}; "
                              "it builds fp32, fp16 and int8 for CUDA devices")
        trt = _trt()
        opts = TensorRTOptions.from_options(spec.options)
        onnx_path, method = _prepare_onnx(spec, out_dir)
        logger = trt.Logger(trt.Logger.WARNING)
        builder = trt.Builder(logger)
        network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
        parser = trt.OnnxParser(network, logger)
        if not parser.parse_from_file(str(onnx_path)):
            errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
            raise EngineError(f"TensorRT cannot parse {onnx_path.name}: {errors[:500]}")
        config = builder.create_builder_config()
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, opts.workspace_mib << 20)
        config.builder_optimization_level = opts.optimization_level
        shapes = profile_shapes(spec.profile)
        for _, lo, opt, hi in shapes:
            prof = builder.create_optimization_profile()
            for i in range(network.num_inputs):
                prof.set_shape(network.get_input(i).name, lo, opt, hi)
            config.add_optimization_profile(prof)
        plan = builder.build_serialized_network(network, config)
        if plan is None:
            raise EngineError("TensorRT failed to build the engine (see the TensorRT log above)")
        (out_dir / PLAN).write_bytes(bytes(plan))
        if onnx_path != spec.model_path:
            onnx_path.unlink()
        meta = {
            "format": FORMAT, "precision": str(spec.precision), "device": spec.device,
            "seq_buckets": [s for s, *_ in shapes], "max_batch": spec.profile.max_batch,
            "limits": token_limits(onnx.load(str(spec.model_path), load_external_data=False)),
        }
        (out_dir / META).write_text(json.dumps(meta, indent=2))
        return BuildReport(backend=self.name, precision=str(spec.precision), device=spec.device, method=method,
                           fusions={"optimization_profiles": len(shapes)})

    def load(self, artifact_dir: Path, profile: ShapeProfile, threads: int = 0) -> TensorRTEngine:
        import torch

        try:
            meta = json.loads((artifact_dir / META).read_text())
        except (OSError, ValueError) as exc:
            raise EngineError(f"{artifact_dir / META} is missing or unreadable: {exc}") from None
        if meta.get("format") != FORMAT:
            raise EngineError(f"TensorRT artifact format {meta.get('format')} is not {FORMAT}; rebuild it")
        if list(profile.seq_buckets) != meta["seq_buckets"] or profile.max_batch > meta["max_batch"]:
            raise EngineError("the serving shape profile differs from the one the TensorRT plan was built for")
        trt = _trt()
        runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        engine = runtime.deserialize_cuda_engine((artifact_dir / PLAN).read_bytes())
        if engine is None:
            raise EngineError(f"TensorRT cannot deserialize {artifact_dir / PLAN} (built by another version?)")
        return TensorRTEngine(engine, profile, torch.device(meta["device"]), meta["limits"])


class TensorRTEngine:
    def __init__(self, engine: Any, profile: ShapeProfile, device: Any, limits: Mapping[str, int]) -> None:
        trt = _trt()
        self._engine = engine
        self.profile = profile
        self.device = str(device)
        self._torch_device = device
        self._limits = dict(limits)
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        is_input = {n: engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT for n in names}

        def spec(n: str) -> TensorSpec:
            dtype = _KSERVE.get(engine.get_tensor_dtype(n).name, engine.get_tensor_dtype(n).name)
            return TensorSpec(n, dtype, tuple(int(d) for d in engine.get_tensor_shape(n)))

        self.inputs = [spec(n) for n in names if is_input[n]]
        self.outputs = [spec(n) for n in names if not is_input[n]]
        self._instances: list[TensorRTInstance] = []

    def instance(self) -> TensorRTInstance:
        inst = TensorRTInstance(self._engine, self.profile, self._torch_device, self.inputs, self.outputs,
                                self._limits)
        self._instances.append(inst)
        return inst

    def close(self) -> None:
        self._instances.clear()


class TensorRTInstance:
    def __init__(self, engine: Any, profile: ShapeProfile, device: Any, inputs: Sequence[TensorSpec],
                 outputs: Sequence[TensorSpec], limits: Mapping[str, int]) -> None:
        import torch

        from fleetserve.engine.gpu_io import PinnedInputs

        trt = _trt()
        self._profile = profile
        self._limits = limits
        self._lock = threading.Lock()
        self._stream = torch.cuda.Stream(device)
        cap = profile.max_batch * profile.max_seq
        torch_types = {"INT64": torch.int64, "INT32": torch.int32, "FP32": torch.float32, "FP16": torch.float16}
        self._dev_in = {t.name: torch.zeros(cap, dtype=torch_types[t.datatype], device=device) for t in inputs}
        # Every output's per-row size is known from its static trailing dims; a -1 after the batch is seq.
        self._row_elems = {t.name: int(np.prod([profile.max_seq if d < 0 else d for d in t.shape[1:]]))
                           for t in outputs}
        self._dev_out = {t.name: torch.empty(profile.max_batch * self._row_elems[t.name],
                                             dtype=torch_types[t.datatype], device=device) for t in outputs}
        self._host_out = {n: torch.empty(t.numel(), dtype=t.dtype, pin_memory=True) for n, t in self._dev_out.items()}
        self._staging = PinnedInputs(cap)
        self._workspace = torch.empty(int(engine.device_memory_size_v2), dtype=torch.uint8, device=device)
        self._contexts = []
        for index in range(engine.num_optimization_profiles):
            ctx = engine.create_execution_context(trt.ExecutionContextAllocationStrategy.USER_MANAGED)
            ctx.set_device_memory(self._workspace.data_ptr(), self._workspace.numel())
            ctx.set_optimization_profile_async(index, self._stream.cuda_stream)
            for name, buf in {**self._dev_in, **self._dev_out}.items():
                ctx.set_tensor_address(name, buf.data_ptr())
            self._contexts.append(ctx)
        self._stream.synchronize()

    def infer(self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        import torch

        from fleetserve.engine.gpu_io import bucket_for, check_inputs

        b, s = check_inputs(inputs, self._limits, self._profile.max_batch, self._profile.max_seq)
        sb = bucket_for(self._profile.seq_buckets, s, "sequence length")
        ctx = self._contexts[self._profile.seq_buckets.index(sb)]
        want = [n for n in self._dev_out if outputs is None or n in outputs]
        stream = self._stream
        with self._lock, torch.cuda.stream(stream):
            self._staging.stage(inputs, b, sb)
            self._staging.upload(self._dev_in, b * sb)
            for name in self._dev_in:
                ctx.set_input_shape(name, (b, sb))
            if not ctx.execute_async_v3(stream.cuda_stream):
                raise EngineError("TensorRT execution failed (see the TensorRT log)")
            shapes = {n: tuple(ctx.get_tensor_shape(n)) for n in want}
            for n in want:
                count = int(np.prod(shapes[n]))
                self._host_out[n][:count].copy_(self._dev_out[n][:count], non_blocking=True)
            stream.synchronize()
            result = {}
            for n in want:
                arr = self._host_out[n][: int(np.prod(shapes[n]))].numpy().reshape(shapes[n])
                # Outputs padded along the sequence axis are cut back to the request's own length.
                result[n] = (arr[:, :s] if arr.ndim == 3 and arr.shape[1] == sb else arr).copy()
        return result
