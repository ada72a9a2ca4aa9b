"""GPU telemetry through NVML: utilization, memory, temperature, SM clock, power and clock throttling.

:class:`GpuMonitor` reads NVML (the ``nvidia-ml-py`` package, module ``pynvml``, imported only when a
monitor is created) for every visible GPU and, where MIG is enabled, for every MIG instance. A background
thread samples about once a second; Prometheus gauges and the replica's load report read the latest
sample, so a request never waits on NVML. The monitor only *reads*: it calls no NVML setter (clocks,
power limits, MIG layout stay as they are).

Each GPU and MIG instance also gets ``fleetserve_gpu_info`` (value 1) naming its model and, for a MIG
instance, its profile (``1g.18gb``): from NVML's device name where it carries one (``... MIG 1g.18gb``), else
from its attributes (GPU-instance slices, compute-instance slices, memory rounded up to GiB), the naming
NVIDIA's Kubernetes device plugin gives ``nvidia.com/mig-<profile>`` resources.

Throttling is NVML's "clocks event reasons" bit mask (``nvmlDeviceGetCurrentClocksEventReasons``, formerly
"throttle reasons"): software and hardware thermal slowdown count as *thermal*, the software power cap and
the hardware power brake as *power*. MIG instances report memory; NVML does not report utilization,
temperature, clocks or power per MIG instance, so those stay on the parent GPU's series.
"""

from __future__ import annotations

import importlib
import logging
import math
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fleetserve import wire

log = logging.getLogger(__name__)

# NVML clocks-event-reason bits (nvml.h; stable across driver versions).
SW_POWER_CAP = 0x4
SW_THERMAL_SLOWDOWN = 0x20
HW_THERMAL_SLOWDOWN = 0x40
HW_POWER_BRAKE_SLOWDOWN = 0x80
THROTTLE_BITS = {
    "thermal": SW_THERMAL_SLOWDOWN | HW_THERMAL_SLOWDOWN,
    "power": SW_POWER_CAP | HW_POWER_BRAKE_SLOWDOWN,
}
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_DEVICE_MIG_ENABLE = 1

LABELS = ("gpu", "uuid", "mig")
_MIG_NAME = re.compile(r"\bMIG ((?:[0-9]+c\.)?[0-9]+g\.[0-9]+gb)\b")


@dataclass(frozen=True)
class GpuMonitorConfig:
    interval_s: float = 1.0
    devices: tuple[int, ...] = ()  # GPU indices to watch; empty = every GPU NVML sees

    def __post_init__(self) -> None:
        if not 0.05 <= self.interval_s <= 60.0:
            raise ValueError(f"GPU sampling interval must be in [0.05, 60] seconds, got {self.interval_s}")
        if any(i < 0 for i in self.devices):
            raise ValueError(f"GPU indices must be >= 0, got {self.devices}")


@dataclass(frozen=True)
class GpuSample:
    """One reading of one GPU (``mig == ""``) or one MIG instance; None where NVML does not report a value."""

    gpu: str
    uuid: str
    mig: str
    name: str
    time: float
    utilization: float | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    temperature_celsius: float | None
    sm_clock_hertz: float | None
    power_watts: float | None
    throttled: dict[str, bool]
    profile: str = ""  # MIG profile, e.g. "1g.18gb"; "" for a whole GPU

    @property
    def labels(self) -> tuple[str, str, str]:
        return (self.gpu, self.uuid, self.mig)

    def to_json(self) -> dict[str, object]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def mig_profile(name: str, attributes: Any) -> str:
    """A MIG instance's profile from its NVML name, else from ``nvmlDeviceGetAttributes``; "" if neither says."""
    match = _MIG_NAME.search(name)
    if match:
        return match.group(1)
    try:
        gi, ci = int(attributes.gpuInstanceSliceCount), int(attributes.computeInstanceSliceCount)
        gib = math.ceil(int(attributes.memorySizeMB) / 1024)
    except (AttributeError, TypeError, ValueError):
        return ""
    if gi < 1 or gib < 1:
        return ""
    return f"{ci}c.{gi}g.{gib}gb" if 0 < ci < gi else f"{gi}g.{gib}gb"


class GpuMonitor:
    """Samples NVML; build it with :meth:`create`, which returns None where there is no GPU."""

    def __init__(
        self, nvml: Any, handles: Sequence[tuple[int, Any]], config: GpuMonitorConfig,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._nvml = nvml
        self._handles = list(handles)
        self.config = config
        self._clock = clock
        self._latest: list[GpuSample] = []
        self._gauges: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def create(
        cls, config: GpuMonitorConfig | None = None, nvml: Any = None, clock: Callable[[], float] = time.monotonic
    ) -> GpuMonitor | None:
        config = config or GpuMonitorConfig()
        try:
            if nvml is None:
                nvml = importlib.import_module("pynvml")
            nvml.nvmlInit()
            count = int(nvml.nvmlDeviceGetCount())
        except Exception as exc:  # ImportError, or NVMLError: no driver / no GPU on this machine
            log.debug("no GPU telemetry: %s", exc)
            return None
        indices = [i for i in (config.devices or range(count)) if i < count]
        if not indices:
            return None
        return cls(nvml, [(i, nvml.nvmlDeviceGetHandleByIndex(i)) for i in indices], config, clock)

    def _read(self, fn: str, *args: Any) -> Any:
        try:
            return getattr(self._nvml, fn)(*args)
        except Exception:  # NVMLError_NotSupported and friends: this GPU does not report it
            return None

    def _throttle_mask(self, handle: Any) -> int | None:
        mask = self._read("nvmlDeviceGetCurrentClocksEventReasons", handle)
        if mask is None:
            mask = self._read("nvmlDeviceGetCurrentClocksThrottleReasons", handle)
        return None if mask is None else int(mask)

    def _one(self, index: str, handle: Any, mig: str, now: float, whole: bool) -> GpuSample:
        util = self._read("nvmlDeviceGetUtilizationRates", handle)
        mem = self._read("nvmlDeviceGetMemoryInfo", handle)
        temp = clock = power = None
        throttled: dict[str, bool] = {}
        if whole:
            temp = self._read("nvmlDeviceGetTemperature", handle, NVML_TEMPERATURE_GPU)
            clock = self._read("nvmlDeviceGetClockInfo", handle, NVML_CLOCK_SM)
            power = self._read("nvmlDeviceGetPowerUsage", handle)
            mask = self._throttle_mask(handle)
            if mask is not None:
                throttled = {reason: bool(mask & bits) for reason, bits in THROTTLE_BITS.items()}
        name = _text(self._read("nvmlDeviceGetName", handle) or "")
        profile = mig_profile(name, self._read("nvmlDeviceGetAttributes", handle)) if mig else ""
        return GpuSample(
            gpu=index, uuid=_text(self._read("nvmlDeviceGetUUID", handle) or ""), mig=mig,
            name=name, time=now, profile=profile,
            utilization=None if util is None else float(util.gpu) / 100.0,
            memory_used_bytes=None if mem is None else int(mem.used),
            memory_total_bytes=None if mem is None else int(mem.total),
            temperature_celsius=None if temp is None else float(temp),
            sm_clock_hertz=None if clock is None else float(clock) * 1e6,
            power_watts=None if power is None else float(power) / 1000.0,
            throttled=throttled,
        )

    def _mig_handles(self, handle: Any) -> list[tuple[str, Any]]:
        mode = self._read("nvmlDeviceGetMigMode", handle)
        if not mode or int(mode[0]) != NVML_DEVICE_MIG_ENABLE:
            return []
        out = []
        for slot in range(int(self._read("nvmlDeviceGetMaxMigDeviceCount", handle) or 0)):
            mig = self._read("nvmlDeviceGetMigDeviceHandleByIndex", handle, slot)
            if mig is not None:  # empty slots raise NotFound
                gi = self._read("nvmlDeviceGetGpuInstanceId", mig)
                out.append((str(gi if gi is not None else slot), mig))
        return out

    def sample(self) -> list[GpuSample]:
        """Read every watched GPU (and MIG instance) now, keep it as the latest reading and export it."""
        now = self._clock()
        samples = []
        for index, handle in self._handles:
            samples.append(self._one(str(index), handle, "", now, whole=True))
            for name, mig in self._mig_handles(handle):
                samples.append(self._one(str(index), mig, name, now, whole=False))
        with self._lock:
            self._latest = samples
            if self._gauges:
                self._publish(samples)
        return samples

    def latest(self) -> list[GpuSample]:
        with self._lock:
            return list(self._latest)

    def register_metrics(self, registry: Any) -> None:
        """Create the ``fleetserve_gpu_*`` gauges on a ``prometheus_client`` registry; samples update them."""
        from prometheus_client import Gauge

        specs = {
            "utilization": ("fleetserve_gpu_utilization_ratio", "Fraction of time a kernel ran on the GPU (NVML)"),
            "memory_used_bytes": ("fleetserve_gpu_memory_used_bytes", "GPU memory in use"),
            "memory_total_bytes": ("fleetserve_gpu_memory_total_bytes", "GPU memory in total"),
            "temperature_celsius": ("fleetserve_gpu_temperature_celsius", "GPU core temperature"),
            "sm_clock_hertz": ("fleetserve_gpu_sm_clock_hertz", "Current SM clock"),
            "power_watts": ("fleetserve_gpu_power_watts", "Current board power draw"),
        }
        with self._lock:
            self._gauges = {f: Gauge(n, h, LABELS, registry=registry) for f, (n, h) in specs.items()}
            self._gauges["throttled"] = Gauge(
                "fleetserve_gpu_throttled", "1 while the GPU's clocks are held down for this reason",
                (*LABELS, "reason"), registry=registry,
            )
            self._gauges["info"] = Gauge(
                "fleetserve_gpu_info", "1 per GPU or MIG instance: its model and MIG profile (e.g. 1g.18gb)",
                (*LABELS, "name", "profile"), registry=registry,
            )
            if self._latest:
                self._publish(self._latest)

    def _publish(self, samples: list[GpuSample]) -> None:
        for s in samples:
            for field, gauge in self._gauges.items():
                if field == "throttled":
                    for reason, on in s.throttled.items():
                        gauge.labels(*s.labels, reason).set(1.0 if on else 0.0)
                    continue
                if field == "info":
                    gauge.labels(*s.labels, s.name, s.profile).set(1.0)
                    continue
                value = getattr(s, field)
                if value is not None:
                    gauge.labels(*s.labels).set(value)

    def load_metrics(self) -> dict[str, float]:
        """The GPU's named metrics of the replica's load report (:mod:`fleetserve.wire`), from the latest
        background sample (empty before the first): the busiest GPU's utilization, and 1.0 when any throttles."""
        whole = [s for s in self.latest() if not s.mig]
        utils = [s.utilization for s in whole if s.utilization is not None]
        if not whole:
            return {}
        metrics = {wire.GPU_THROTTLED: 1.0 if any(any(s.throttled.values()) for s in whole) else 0.0}
        if utils:
            metrics[wire.GPU_UTILIZATION] = max(utils)
        return metrics

    def start(self) -> None:
        """Sample in a daemon thread every ``interval_s`` until :meth:`stop`."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gpu-monitor", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sample()
            except Exception:  # a failing driver call must not kill the sampler; the next tick retries
                log.exception("GPU sampling failed")
            self._stop.wait(self.config.interval_s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None

    def close(self) -> None:
        self.stop()
        self._read("nvmlShutdown")
