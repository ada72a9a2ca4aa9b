"""ONNX Runtime GPU provider options: pure logic (no machine we have carries onnxruntime-gpu)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetserve.engine.base import Precision
from fleetserve.engine.ort_gpu import CPU_EP, CUDA_EP, TRT_EP, provider_options

ALL = [TRT_EP, CUDA_EP, CPU_EP]


def test_cpu_only_onnxruntime_gets_the_cpu_provider(tmp_path: Path) -> None:
    assert provider_options("fp32", tmp_path, available=[CPU_EP]) == [CPU_EP]
    assert not (tmp_path / "trt-engines").exists()


def test_default_reads_this_onnxruntime(tmp_path: Path) -> None:
    import onnxruntime as ort

    providers = provider_options(Precision.FP32, tmp_path)
    assert providers[-1] == CPU_EP
    names = [p if isinstance(p, str) else p[0] for p in providers]
    assert set(names) <= set(ort.get_available_providers())


@pytest.mark.parametrize(("precision", "fp16", "int8"), [("fp32", "False", "False"), ("fp16", "True", "False"),
                                                         ("int8", "True", "True")])
def test_tensorrt_provider_flags_and_cache(tmp_path: Path, precision: str, fp16: str, int8: str) -> None:
    providers = provider_options(precision, tmp_path, available=ALL, device_id=1)
    assert [p if isinstance(p, str) else p[0] for p in providers] == ALL
    _, trt = providers[0]
    assert trt["trt_fp16_enable"] == fp16 and trt["trt_int8_enable"] == int8
    assert trt["trt_engine_cache_enable"] == "True" and trt["device_id"] == "1"
    assert Path(trt["trt_engine_cache_path"]).is_dir()
    assert providers[1][1]["device_id"] == "1"


def test_cuda_without_tensorrt(tmp_path: Path) -> None:
    providers = provider_options("fp16", tmp_path, available=[CUDA_EP, CPU_EP])
    assert [p if isinstance(p, str) else p[0] for p in providers] == [CUDA_EP, CPU_EP]


def test_rejects_what_the_providers_cannot_run(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not bf16"):
        provider_options("bf16", tmp_path, available=ALL)
    with pytest.raises(ValueError, match="device_id"):
        provider_options("fp32", tmp_path, available=ALL, device_id=-1)
    with pytest.raises(ValueError):
        provider_options("fp64", tmp_path, available=ALL)
