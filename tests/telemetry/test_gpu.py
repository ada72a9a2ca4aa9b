"""GpuMonitor against a fake NVML (every code path, deterministic) and, where there is a GPU, the real one."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from fleetserve.telemetry.gpu import (
    HW_THERMAL_SLOWDOWN,
    SW_POWER_CAP,
    GpuMonitor,
    GpuMonitorConfig,
    mig_profile,
)
from fleetserve.wire import GPU_THROTTLED, GPU_UTILIZATION, encode_load_report, parse_load_report


class NotSupported(Exception):
    pass


class FakeNvml:
    """Two GPUs; GPU 1 has MIG on with instances in slots 0 and 2. Records every call by name."""

    def __init__(self, count: int = 2, fail_init: bool = False) -> None:
        self.count = count
        self.fail_init = fail_init
        self.calls: list[str] = []
        self.util = {0: 73, 1: 10}
        self.reasons = {0: 0, 1: SW_POWER_CAP | HW_THERMAL_SLOWDOWN}
        self.sampled = threading.Event()

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(name)

    def _log(self, name: str) -> None:
        self.calls.append(name)

    def nvmlInit(self) -> None:
        self._log("nvmlInit")
        if self.fail_init:
            raise NotSupported("driver not loaded")

    def nvmlShutdown(self) -> None:
        self._log("nvmlShutdown")

    def nvmlDeviceGetCount(self) -> int:
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i: int) -> tuple[str, int]:
        return ("gpu", i)

    def nvmlDeviceGetUUID(self, h: tuple) -> bytes:
        return f"GPU-{h[1]}".encode() if h[0] == "gpu" else f"MIG-{h[1]}-{h[2]}".encode()

    def nvmlDeviceGetName(self, h: tuple) -> str:
        # Slot 0's name carries its MIG profile; slot 2's does not, so its attributes must tell it.
        return "NVIDIA H200 MIG 1g.18gb" if h[0] == "mig" and h[2] == 0 else "Fake H200"

    def nvmlDeviceGetAttributes(self, h: tuple) -> SimpleNamespace:
        if h[0] != "mig":
            raise NotSupported("attributes of a whole GPU")
        return SimpleNamespace(gpuInstanceSliceCount=3, computeInstanceSliceCount=3, memorySizeMB=72704)

    def nvmlDeviceGetUtilizationRates(self, h: tuple) -> SimpleNamespace:
        self.sampled.set()
        if h[0] == "mig":
            raise NotSupported("utilization per MIG instance")
        return SimpleNamespace(gpu=self.util[h[1]], memory=5)

    def nvmlDeviceGetMemoryInfo(self, h: tuple) -> SimpleNamespace:
        return SimpleNamespace(used=1000 * (h[1] + 1), total=8000, free=0)

    def nvmlDeviceGetTemperature(self, h: tuple, sensor: int) -> int:
        return 40 + h[1]

    def nvmlDeviceGetClockInfo(self, h: tuple, clock: int) -> int:
        return 1980

    def nvmlDeviceGetPowerUsage(self, h: tuple) -> int:
        if h[1] == 1:
            raise NotSupported("power")
        return 350_500

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: tuple) -> int:
        return self.reasons[h[1]]

    def nvmlDeviceGetMigMode(self, h: tuple) -> list[int]:
        return [1, 1] if h[1] == 1 else [0, 0]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: tuple) -> int:
        return 3

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: tuple, slot: int) -> tuple:
        if slot == 1:
            raise NotSupported("empty slot")
        return ("mig", h[1], slot)

    def nvmlDeviceGetGpuInstanceId(self, h: tuple) -> int:
        return 10 + h[2]


def monitor(nvml: FakeNvml | None = None, **cfg: Any) -> GpuMonitor:
    mon = GpuMonitor.create(GpuMonitorConfig(**cfg), nvml=nvml or FakeNvml(), clock=lambda: 123.0)
    assert mon is not None
    return mon


def test_create_returns_none_without_a_gpu() -> None:
    assert GpuMonitor.create(nvml=FakeNvml(fail_init=True)) is None
    assert GpuMonitor.create(nvml=FakeNvml(count=0)) is None
    assert GpuMonitor.create(GpuMonitorConfig(devices=(5,)), nvml=FakeNvml()) is None


def test_sample_converts_units_and_reads_throttle_reasons() -> None:
    samples = monitor().sample()
    assert [(s.gpu, s.mig) for s in samples] == [("0", ""), ("1", ""), ("1", "10"), ("1", "12")]
    g0, g1, mig = samples[0], samples[1], samples[2]
    assert g0.utilization == pytest.approx(0.73) and g0.uuid == "GPU-0" and g0.time == 123.0
    assert g0.sm_clock_hertz == 1.98e9 and g0.power_watts == pytest.approx(350.5)
    assert g0.throttled == {"thermal": False, "power": False}
    assert g1.throttled == {"thermal": True, "power": True} and g1.power_watts is None
    assert mig.uuid == "MIG-1-0" and mig.memory_used_bytes == 2000 and mig.memory_total_bytes == 8000
    assert mig.utilization is None and mig.temperature_celsius is None and mig.throttled == {}


def test_mig_slices_show_their_profile_on_metrics() -> None:
    mon = monitor()
    registry = CollectorRegistry()
    mon.register_metrics(registry)
    samples = mon.sample()
    assert [s.profile for s in samples] == ["", "", "1g.18gb", "3g.71gb"]
    info = {(s.labels["mig"], s.labels["profile"], s.labels["name"]) for family in registry.collect()
            if family.name == "fleetserve_gpu_info" for s in family.samples if s.value == 1}
    assert info == {("", "", "Fake H200"), ("10", "1g.18gb", "NVIDIA H200 MIG 1g.18gb"), ("12", "3g.71gb", "Fake H200")}


@pytest.mark.parametrize(("name", "attrs", "profile"), [
    ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", None, "1g.5gb"),
    ("NVIDIA H100 MIG 1c.2g.20gb", None, "1c.2g.20gb"),
    ("NVIDIA H100", SimpleNamespace(gpuInstanceSliceCount=2, computeInstanceSliceCount=1, memorySizeMB=20096),
     "1c.2g.20gb"),
    ("NVIDIA H200", SimpleNamespace(gpuInstanceSliceCount=7, computeInstanceSliceCount=7, memorySizeMB=143360),
     "7g.140gb"),
    ("NVIDIA H200", None, ""),
    ("NVIDIA H200", SimpleNamespace(gpuInstanceSliceCount=0, computeInstanceSliceCount=0, memorySizeMB=0), ""),
])
def test_mig_profile_from_name_or_attributes(name: str, attrs: object, profile: str) -> None:
    assert mig_profile(name, attrs) == profile


def test_only_selected_devices_are_watched() -> None:
    samples = monitor(devices=(0,)).sample()
    assert [s.gpu for s in samples] == ["0"]


def test_gauges_follow_samples_and_skip_unreported_values() -> None:
    nvml = FakeNvml()
    mon = monitor(nvml)
    registry = CollectorRegistry()
    mon.register_metrics(registry)
    mon.sample()

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert value("fleetserve_gpu_utilization_ratio", gpu="0", uuid="GPU-0", mig="") == pytest.approx(0.73)
    assert value("fleetserve_gpu_memory_total_bytes", gpu="1", uuid="MIG-1-2", mig="12") == 8000
    assert value("fleetserve_gpu_temperature_celsius", gpu="1", uuid="GPU-1", mig="") == 41
    assert value("fleetserve_gpu_sm_clock_hertz", gpu="0", uuid="GPU-0", mig="") == 1.98e9
    assert value("fleetserve_gpu_power_watts", gpu="1", uuid="GPU-1", mig="") is None
    assert value("fleetserve_gpu_utilization_ratio", gpu="1", uuid="MIG-1-0", mig="10") is None
    assert value("fleetserve_gpu_throttled", gpu="1", uuid="GPU-1", mig="", reason="thermal") == 1
    assert value("fleetserve_gpu_throttled", gpu="0", uuid="GPU-0", mig="", reason="power") == 0
    nvml.reasons[1] = 0
    nvml.util[0] = 5
    mon.sample()
    assert value("fleetserve_gpu_throttled", gpu="1", uuid="GPU-1", mig="", reason="thermal") == 0
    assert value("fleetserve_gpu_utilization_ratio", gpu="0", uuid="GPU-0", mig="") == pytest.approx(0.05)


def test_load_metrics_come_from_the_latest_sample() -> None:
    nvml = FakeNvml()
    mon = monitor(nvml)
    assert mon.load_metrics() == {}
    mon.sample()
    assert mon.load_metrics() == {GPU_UTILIZATION: pytest.approx(0.73), GPU_THROTTLED: 1.0}
    nvml.reasons[1] = 0
    mon.sample()
    assert mon.load_metrics()[GPU_THROTTLED] == 0.0
    report = parse_load_report(encode_load_report(0, 0, gpu=mon.load_metrics()))
    assert report is not None and report.gpu_utilization == pytest.approx(0.73) and not report.gpu_throttled


def test_background_sampler_starts_and_stops() -> None:
    nvml = FakeNvml()
    mon = monitor(nvml, interval_s=0.05)
    mon.start()
    try:
        assert nvml.sampled.wait(5.0)
    finally:
        mon.close()
    assert mon.latest() and "nvmlShutdown" in nvml.calls


def test_monitor_never_changes_gpu_settings() -> None:
    nvml = FakeNvml()
    mon = monitor(nvml)
    mon.sample()
    mon.close()
    assert not [c for c in nvml.calls if "Set" in c or "Reset" in c]


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="interval"):
        GpuMonitorConfig(interval_s=0)
    with pytest.raises(ValueError, match="indices"):
        GpuMonitorConfig(devices=(-1,))


def test_real_nvml_where_a_gpu_exists() -> None:
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        pytest.skip(f"no NVIDIA driver/GPU here ({exc.__class__.__name__})")
    mon = GpuMonitor.create()
    assert mon is not None
    samples = mon.sample()
    whole = [s for s in samples if not s.mig]
    assert whole and all(s.memory_total_bytes and s.memory_total_bytes > 0 for s in whole)
    assert all(s.utilization is None or 0.0 <= s.utilization <= 1.0 for s in whole)
    assert set(mon.load_metrics()) >= {GPU_THROTTLED}
    mon.close()
