"""ONNX Runtime GPU execution providers (``onnxruntime-gpu``): which to use and with what options.

UNVERIFIED: no machine we have carries onnxruntime-gpu; the option names follow ONNX Runtime's
documentation of the TensorRT and CUDA execution providers. TensorRT's provider builds its own engines
from the ONNX graph and keeps them (and its timing cache) in ``cache_dir`` so a restart does not rebuild;
FP16/INT8 are its precision switches (INT8 takes the Q/DQ scales in the graph, so an ``int8`` build of
the ONNX Runtime backend made with ``int8_method=static`` is the graph to give it; on a fused BERT graph that
build fails, see :mod:`.ort_static`). The CUDA provider is
the fallback for the nodes TensorRT does not take, and the CPU provider the last resort.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

from fleetserve.engine.base import Precision

Provider = str | tuple[str, dict[str, str]]
TRT_EP, CUDA_EP, CPU_EP = "TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"


def _flag(on: bool) -> str:
    return "True" if on else "False"


def provider_options(
    precision: Precision | str, cache_dir: Path, available: Collection[str] | None = None, device_id: int = 0,
    workspace_bytes: int = 4 << 30,
) -> list[Provider]:
    """Providers for ``InferenceSession(providers=...)``, best first, limited to those this ONNX Runtime has.

    ``available`` defaults to ``onnxruntime.get_available_providers()``. A CPU-only ONNX Runtime gets
    ``["CPUExecutionProvider"]``. Creates the TensorRT engine-cache directory when that provider is offered.
    """
    precision = Precision(precision)
    if precision in (Precision.BF16, Precision.FP8):
        raise ValueError(f"ONNX Runtime's GPU providers take fp32, fp16 or int8, not {precision}")
    if device_id < 0:
        raise ValueError(f"device_id must be >= 0, got {device_id}")
    if available is None:
        import onnxruntime as ort

        available = ort.get_available_providers()
    providers: list[Provider] = []
    if TRT_EP in available:
        engines = cache_dir / "trt-engines"
        engines.mkdir(parents=True, exist_ok=True)
        providers.append((TRT_EP, {
            "device_id": str(device_id),
            "trt_max_workspace_size": str(workspace_bytes),
            "trt_fp16_enable": _flag(precision in (Precision.FP16, Precision.INT8)),
            "trt_int8_enable": _flag(precision is Precision.INT8),
            "trt_engine_cache_enable": "True",
            "trt_engine_cache_path": str(engines),
            "trt_timing_cache_enable": "True",
            "trt_timing_cache_path": str(engines),
        }))
    if CUDA_EP in available:
        providers.append((CUDA_EP, {
            "device_id": str(device_id),
            "arena_extend_strategy": "kSameAsRequested",
            "cudnn_conv_algo_search": "HEURISTIC",
            # Each instance's session runs on its own stream instead of serialising on the default one.
            "do_copy_in_default_stream": "False",
        }))
    providers.append(CPU_EP)
    return providers
