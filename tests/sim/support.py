"""Synthetic profiles for simulator tests: service times we choose, so expectations can be computed."""

from __future__ import annotations

from fleetserve.sim.profile import LengthMix, Profile, ShapeTiming

BATCHES = (1, 2, 4, 8, 16, 32)
LENGTHS = (16, 32, 64, 128, 256)


def linear_profile(
    base_s: float = 0.001, per_row_s: float = 0.0, cv: float = 0.0, *, device: str = "cuda", name: str = "",
    replica_cpu_s: float = 0.0, gateway_cpu_s: float = 0.0, lengths: LengthMix | None = None,
    cold_start_s: float | None = 1.0, cost_per_hour: float | None = None, idle_extra_s: float | None = None,
    replica_wall_s: float = 0.0, gateway_wall_s: float = 0.0, timer_lag_s: float = 0.0,
    replica_busy_cpu_s: float | None = None, gateway_busy_cpu_s: float | None = None, idle_after_s: float = 0.0,
) -> Profile:
    """Service time = base + per_row × rows (independent of length), with coefficient of variation ``cv``;
    ``idle_extra_s`` more for a call after idling (None: not measured)."""

    def timing(rows: int) -> ShapeTiming:
        mean = base_s + per_row_s * rows
        idle = None if idle_extra_s is None else mean + idle_extra_s
        return ShapeTiming(mean, cv * mean, mean, mean, 10, idle, None if idle is None else cv * idle)

    return Profile(
        model="synthetic", precision="fp16", backend="test", device=device, device_name="test device",
        batch_sizes=BATCHES, seq_lengths=LENGTHS,
        service=tuple(tuple(timing(b) for _ in LENGTHS) for b in BATCHES),
        replica_cpu_s=replica_cpu_s, gateway_cpu_s=gateway_cpu_s, cold_start_s=cold_start_s,
        replica_wall_s=replica_wall_s, gateway_wall_s=gateway_wall_s, timer_lag_s=timer_lag_s,
        replica_busy_cpu_s=replica_busy_cpu_s, gateway_busy_cpu_s=gateway_busy_cpu_s, idle_after_s=idle_after_s,
        lengths=lengths or LengthMix.fixed(20), name=name, cost_per_hour=cost_per_hour,
    )
