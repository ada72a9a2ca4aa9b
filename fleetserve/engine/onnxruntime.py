"""ONNX Runtime backend (default; CPU here, CUDA / TensorRT execution providers when onnxruntime-gpu exists).

Build: ONNX Runtime's transformer optimizer fuses BERT subgraphs (Attention, EmbedLayerNormalization,
SkipLayerNormalization, BiasGelu, ...) when the graph is a BERT-style encoder; any other graph gets ONNX
Runtime's generic graph optimizations. INT8 on CPU uses dynamic per-channel quantization of the fused graph
(weights int8 per output channel, activations quantized per batch at run time). Static calibration
(``int8_method=static``, :mod:`.ort_static`) is kept for devices whose kernels favour QDQ graphs; it reaches
only graphs without fused contrib ops, and a build where it quantized no activation fails rather than cache an
fp32 engine under an int8 name.

Runtime: one ``InferenceSession`` per instance, intra-op threads sized so instances × threads does not
oversubscribe the cores the process may use (its cgroup CPU quota included, :mod:`fleetserve.engine.cpus`).
``Run`` releases the GIL, so instances execute concurrently from worker threads.
ONNX Runtime's CPU memory arena keeps the buffers of the largest shape seen, so warming up at the maximum
shape allocates once and later runs reuse that memory.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from fleetserve.engine.base import (
    BuildReport,
    BuildSpec,
    EngineError,
    Precision,
    ShapeProfile,
    TensorSpec,
)
from fleetserve.engine.cpus import available_cpus

log = logging.getLogger(__name__)

_ORT_TYPES = {
    "tensor(float)": "FP32",
    "tensor(float16)": "FP16",
    "tensor(double)": "FP64",
    "tensor(int64)": "INT64",
    "tensor(int32)": "INT32",
    "tensor(int8)": "INT8",
    "tensor(uint8)": "UINT8",
    "tensor(bool)": "BOOL",
    "tensor(string)": "BYTES",
}
INDEX_LIMITS = "index_limits.json"
FUSED_OPS = ("EmbedLayerNormalization", "Attention", "MultiHeadAttention", "SkipLayerNormalization",
             "LayerNormalization", "BiasGelu", "FastGelu", "Gelu")


def load_onnx(path: Path) -> onnx.ModelProto:
    """Load and check an ONNX file, turning every failure into a one-line EngineError."""
    if not path.is_file():
        raise EngineError(f"ONNX file not found: {path}")
    try:
        model = onnx.load(str(path))
        onnx.checker.check_model(model)
    except Exception as exc:
        raise EngineError(f"{path} is not a valid ONNX model: {str(exc).splitlines()[0][:200]}") from None
    return model


def _bert_shape(model: onnx.ModelProto) -> tuple[int, int] | None:
    """(num_heads, hidden) for a BERT-style encoder exported from Hugging Face, else None."""
    for init in model.graph.initializer:
        if init.name.endswith("word_embeddings.weight") and len(init.dims) == 2:
            hidden = int(init.dims[1])
            head_dim = 64 if hidden % 64 == 0 and hidden >= 256 else 32
            return max(1, hidden // head_dim), hidden
    return None


class _PreprocessingAdvice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Please consider to run pre-processing before quantization")


@contextlib.contextmanager
def _without_preprocessing_advice() -> Iterator[None]:
    """Drop ONNX Runtime's advice to run ``quant_pre_process`` (logged on the root logger at every quantization):
    the graph it quantizes was just shape-inferred, optimized and fused by the transformer optimizer, and the
    quantized engine's accuracy is checked against fp32 before it is cached."""
    advice = _PreprocessingAdvice()
    root = logging.getLogger()
    root.addFilter(advice)
    try:
        yield
    finally:
        root.removeFilter(advice)


class OnnxRuntimeBackend:
    name = "onnxruntime"

    @staticmethod
    def available() -> bool:
        return True

    def version(self) -> str:
        return str(ort.__version__)

    def supports(self, precision: Precision, device: str) -> bool:
        if device == "cpu":
            return precision in (Precision.FP32, Precision.INT8)
        return precision in (Precision.FP32, Precision.FP16, Precision.INT8)

    def build(self, spec: BuildSpec, out_dir: Path) -> BuildReport:
        if not self.supports(spec.precision, spec.device):
            raise EngineError(
                f"backend onnxruntime does not support {spec.precision} on {spec.device}; "
                "use fp32 or int8 (fp16/bf16 need a GPU backend: --backend torch-cuda or tensorrt)"
            )
        model = load_onnx(spec.model_path)
        report = BuildReport(backend=self.name, precision=str(spec.precision), device=spec.device)
        optimized = out_dir / "optimized.onnx"
        shape = _bert_shape(model)
        if shape is not None:
            from onnxruntime.transformers.optimizer import optimize_model

            heads, hidden = shape
            opt = optimize_model(str(spec.model_path), model_type="bert", num_heads=heads, hidden_size=hidden)
            stats = opt.get_fused_operator_statistics()
            report.fusions = {k: int(v) for k, v in stats.items() if k in FUSED_OPS and v}
            opt.save_model_to_file(str(optimized))
        else:
            report.notes.append("not a BERT-style graph: generic ONNX Runtime graph optimizations only")
            onnx.save(model, str(optimized))

        target = out_dir / "model.onnx"
        if spec.precision is Precision.INT8:
            method = spec.options.get("int8_method", "dynamic" if spec.device == "cpu" else "static")
            report.method = self._quantize(method, optimized, target, spec)
            optimized.unlink()
        else:
            report.method = "graph fusion" if shape else "graph optimization"
            optimized.rename(target)
        # Found once here, so loading the engine never parses the graph a second time.
        (out_dir / INDEX_LIMITS).write_text(json.dumps(index_limits(target)))
        return report

    def _quantize(self, method: str, src: Path, dst: Path, spec: BuildSpec) -> str:
        with _without_preprocessing_advice():
            return self._quantize_graph(method, src, dst, spec)

    def _quantize_graph(self, method: str, src: Path, dst: Path, spec: BuildSpec) -> str:
        from onnxruntime.quantization import QuantType, quantize_dynamic

        if method == "dynamic":
            quantize_dynamic(
                str(src), str(dst), per_channel=True, weight_type=QuantType.QInt8,
                op_types_to_quantize=["MatMul", "Attention"],
                # Fused contrib ops defeat ONNX shape inference; their tensors are float.
                extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
            )
            return "int8 dynamic per-channel (weights int8 per channel, activations per batch at run time)"
        if method == "static":
            from fleetserve.engine.ort_static import quantize_static_qdq

            quantize_static_qdq(src, dst, spec)
            return "int8 static QDQ, calibrated on unlabelled text"
        raise EngineError(f"unknown int8_method {method!r}; use dynamic or static")

    def load(self, artifact_dir: Path, profile: ShapeProfile, threads: int = 0) -> OrtEngine:
        model, limits_file = artifact_dir / "model.onnx", artifact_dir / INDEX_LIMITS
        # Artifacts built before the limits were stored: find them from the graph.
        limits = json.loads(limits_file.read_text()) if limits_file.is_file() else index_limits(model)
        return OrtEngine(model, profile, threads=threads, index_limits=limits)


def _specs(args: Sequence[ort.NodeArg], limits: dict[str, int] | None = None) -> list[TensorSpec]:
    return [
        TensorSpec(
            a.name,
            _ORT_TYPES.get(a.type, a.type),
            tuple(d if isinstance(d, int) else -1 for d in a.shape),
            (limits or {}).get(a.name),
        )
        for a in args
    ]


def index_limits(model_path: Path) -> dict[str, int]:
    """Graph inputs used as Gather indices into a constant table (token and type ids), with the table's row
    count: ids at or past it are bad input, to be refused before they reach a batch. Follows the Cast that
    ONNX Runtime's fused EmbedLayerNormalization puts in front of its int32 ids."""
    model = onnx.load(str(model_path), load_external_data=False)
    source = {i.name: i.name for i in model.graph.input}
    rows = {t.name: int(t.dims[0]) for t in model.graph.initializer if len(t.dims) >= 1}
    pairs: list[tuple[str, str]] = []
    for node in model.graph.node:
        if node.op_type == "Cast" and node.input[0] in source:
            source[node.output[0]] = source[node.input[0]]
        elif node.op_type == "Gather" and len(node.input) == 2:
            pairs.append((node.input[1], node.input[0]))
        elif node.op_type == "EmbedLayerNormalization" and len(node.input) >= 5:
            pairs += [(node.input[0], node.input[2]), (node.input[1], node.input[4])]
    limits: dict[str, int] = {}
    for ids, table in pairs:
        if ids in source and table in rows:
            name = source[ids]
            limits[name] = min(limits.get(name, rows[table]), rows[table])
    return limits


class OrtInstance:
    def __init__(self, session: ort.InferenceSession, output_names: list[str]) -> None:
        self._session = session
        self._outputs = output_names

    def infer(self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        names = list(outputs) if outputs else self._outputs
        results = self._session.run(names, dict(inputs))
        return dict(zip(names, results, strict=True))


class OrtEngine:
    """N independent sessions over one model file; ``threads`` = intra-op threads per instance (0 = auto)."""

    device = "cpu"

    def __init__(
        self, model_path: Path, profile: ShapeProfile, threads: int = 0, index_limits: dict[str, int] | None = None
    ) -> None:
        self.model_path = model_path
        self.profile = profile
        self.threads = threads
        self._instances: list[OrtInstance] = []
        # The first session doubles as the metadata probe and as the first instance's session.
        self._first: ort.InferenceSession | None = self._session(self._threads())
        self.inputs = _specs(self._first.get_inputs(), index_limits)
        self.outputs = _specs(self._first.get_outputs())

    def _threads(self) -> int:
        return self.threads or available_cpus()

    def _session(self, threads: int) -> ort.InferenceSession:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        try:
            return ort.InferenceSession(str(self.model_path), opts, providers=["CPUExecutionProvider"])
        except Exception as exc:
            raise EngineError(f"cannot load engine {self.model_path}: {str(exc).splitlines()[0][:200]}") from None

    def instance(self) -> OrtInstance:
        names = [o.name for o in self.outputs]
        session, self._first = (self._first or self._session(self._threads())), None
        inst = OrtInstance(session, names)
        self._instances.append(inst)
        return inst

    def close(self) -> None:
        self._instances.clear()
        self._first = None


def threads_per_instance(instances: int, cores: int | None = None) -> int:
    """Split the cores evenly over instances, at least one thread each."""
    return max(1, (cores or available_cpus()) // max(1, instances))
