"""Backend choice by name: ``auto`` takes the fastest backend that is present and can run the request."""

from __future__ import annotations

import sys
import types

import pytest

from fleetserve.engine import registry
from fleetserve.engine.base import EngineError, Precision
from fleetserve.importer import Registry


class _GpuOnly:
    name = "gpu-only"

    @staticmethod
    def available() -> bool:
        return True

    def supports(self, precision: Precision, device: str) -> bool:
        return device.startswith("cuda") and precision is not Precision.FP32


class _Cpu:
    name = "cpu"

    @staticmethod
    def available() -> bool:
        return True

    def supports(self, precision: Precision, device: str) -> bool:
        return device == "cpu"


class _Counted(_Cpu):
    name = "counted"
    asked = 0

    @staticmethod
    def available() -> bool:
        _Counted.asked += 1
        return True


class _Absent(_Cpu):
    name = "absent"

    @staticmethod
    def available() -> bool:
        return False


@pytest.fixture
def fakes(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("fake_backends")
    module.GpuOnly, module.Cpu, module.Absent = _GpuOnly, _Cpu, _Absent  # type: ignore[attr-defined]
    module.Counted = _Counted  # type: ignore[attr-defined]
    _Counted.asked = 0
    monkeypatch.setitem(sys.modules, "fake_backends", module)
    monkeypatch.setattr(registry, "BACKENDS", Registry("backend", {
        "absent": "fake_backends:Absent", "gpu-only": "fake_backends:GpuOnly", "missing": "no_such_module_here:X",
        "cpu": "fake_backends:Cpu", "counted": "fake_backends:Counted"}))
    monkeypatch.setattr(registry, "AUTO_ORDER", ("missing", "absent", "gpu-only", "cpu", "counted"))


@pytest.mark.usefixtures("fakes")
def test_auto_skips_backends_that_cannot_run_the_precision_on_the_device() -> None:
    assert registry.get_backend("auto", Precision.FP32, "cpu").name == "cpu"
    assert registry.get_backend("auto", Precision.FP16, "cuda:0").name == "gpu-only"


@pytest.mark.usefixtures("fakes")
def test_auto_without_a_request_takes_the_first_present_backend() -> None:
    assert registry.get_backend("auto").name == "gpu-only"


@pytest.mark.usefixtures("fakes")
def test_auto_falls_back_to_the_fastest_present_backend_when_none_can() -> None:
    backend = registry.get_backend("auto", Precision.FP32, "cuda:0")  # the builder then says what it can run
    assert backend.name == "gpu-only"


@pytest.mark.usefixtures("fakes")
def test_a_named_backend_that_is_absent_is_a_clear_error() -> None:
    with pytest.raises(EngineError, match="lacks"):
        registry.get_backend("absent")
    with pytest.raises(EngineError, match="cannot be imported"):
        registry.get_backend("missing")


@pytest.mark.usefixtures("fakes")
def test_auto_never_probes_backends_slower_than_the_one_it_takes() -> None:
    assert registry.get_backend("auto", Precision.FP32, "cpu").name == "cpu"
    assert _Counted.asked == 0
