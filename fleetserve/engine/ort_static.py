"""Static INT8 (QDQ) quantization for ONNX Runtime, calibrated on unlabelled text.

Activation ranges come from running the FP32 graph on tokenized calibration texts (ONNX Runtime's MinMax
calibrator); weights are quantized per channel. On GPUs (TensorRT execution provider) this is the fast
INT8 path; ONNX Runtime's CPU kernels run QDQ graphs slower than FP32, so CPU builds default to dynamic.

The quantizer places activation QuantizeLinear nodes only where ONNX type inference reaches. The transformer
optimizer's fused contrib ops (Attention, SkipLayerNormalization, ...) stop it, so on a fused BERT graph it
quantizes no activation at all: only weights, dequantized again to float, and the engine computes in fp32
while its name says int8. A build that quantized no activation therefore fails, naming that, instead of
caching such an engine.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

from fleetserve.engine.base import BuildSpec, EngineError
from fleetserve.models.tokenizer import TextTokenizer


class _TextReader(CalibrationDataReader):
    def __init__(self, batches: list[dict[str, np.ndarray]]) -> None:
        self._it: Iterator[dict[str, np.ndarray]] = iter(batches)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)


def quantize_static_qdq(src: Path, dst: Path, spec: BuildSpec, batch: int = 8) -> None:
    tokenizer_path = spec.options.get("tokenizer")
    if not tokenizer_path or not spec.calibration_texts:
        raise EngineError("static int8 needs a tokenizer.json next to the model and calibration texts")
    tok = TextTokenizer(Path(tokenizer_path), spec.profile.max_seq)
    texts = list(spec.calibration_texts)
    batches = [tok.encode(texts[i : i + batch]).as_inputs() for i in range(0, len(texts), batch)]
    quantize_static(
        str(src), str(dst), _TextReader(batches), quant_format=QuantFormat.QDQ, per_channel=True,
        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"],
    )
    if not quantized_activations(dst):
        raise EngineError(
            "static int8 quantized no activation of this graph: ONNX Runtime's quantizer cannot infer the types "
            "around the fused transformer ops, so the engine would compute in fp32; use --int8-method dynamic "
            "(the CPU default)"
        )


def quantized_activations(path: Path) -> int:
    """How many QuantizeLinear nodes of the graph at ``path`` quantize a computed tensor (not a weight)."""
    graph = onnx.load(str(path), load_external_data=False).graph
    weights = {init.name for init in graph.initializer}
    return sum(node.op_type == "QuantizeLinear" and node.input[0] not in weights for node in graph.node)
