"""Synthetic profiles for simulator tests: service times we choose, so expectations can be computed."""

from __future__ import annotations

from fleetserve.sim.profile import LengthMix, Profile, ShapeTiming

BATCHES = (1, 2, 4, 8, 16, 32)
LENGTHS = (16, 32, 64, 128, 256)


def linear_profile(
    base_s: float = 0.001, per_row_s: float = 0.0, cv: float = 0.0, *, device: str = "cuda", name: str = "",
    replica_cpu_s: float = 0.0, gateway_cpu_s: float = 0.0, lengths: LengthMix | None = None,
    cold_start_s: float | None = 1.0, cost_per_hour: float | None = None,
) -> Profile:
    """Service time = base + per_row × rows (independent of length), with coefficient of variation ``cv``."""

    def timing(rows: int) -> ShapeTiming:
        mean = base_s + per_row_s * rows
        return ShapeTiming(mean, cv * mean, mean, mean, 10)

    return Profile(
        model="synthetic", precision="fp16", backend="test", device=device, device_name="test device",
        batch_sizes=BATCHES, seq_lengths=LENGTHS,
        service=tuple(tuple(timing(b) for _ in LENGTHS) for b in BATCHES),
        replica_cpu_s=replica_cpu_s, gateway_cpu_s=gateway_cpu_s, cold_start_s=cold_start_s,
        lengths=lengths or LengthMix.fixed(20), name=name, cost_per_hour=cost_per_hour,
    )
