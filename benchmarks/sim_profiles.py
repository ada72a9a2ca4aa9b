"""Derived profiles (issue 15): engine timings transcribed from BENCHMARKS.md, marked as derived, not measured.

GPU profiles need an H200, which this machine does not have; ``fleetserve profile --device cuda`` on one would
measure them. Until then these profiles carry the numbers BENCHMARKS.md recorded on 2026-12-02, each naming its
source in ``derived_from``:

- ``h200-bert-base-fp16`` / ``-fp8``: §2, "fleetserve torch-cuda fp16, infer()" and "fp8, infer()" rows (whole
  engine call, sequence 128): batch b takes b ÷ (sequences/s) seconds. Only sequence 128 was measured, so every
  request is padded to 128 (pessimistic for short texts); the variance was not recorded (service times are
  constant in the simulation); device capacity from §2's 1/2/4-instance fp16 run (20,307 → 20,950 seq/s: 1.03),
  which fp8 reuses (its own was not measured).
- ``cpu-bert-base-int8``: §1's "fleetserve onnxruntime int8" rows (2 intra-op threads, sequence 128, 2-core box):
  median and p99 per batch size; mean and CV of a lognormal with that median and p99.

Replica and gateway CPU per request, the cold start and the text mix come from the measured minilm CPU profile
(same replica and gateway code; the GPU host's own figures were not measured).

    .venv/bin/python benchmarks/sim_profiles.py [--cpu-profile benchmarks/profiles/minilm-int8-cpu.json]
"""

from __future__ import annotations

import argparse
import math
from dataclasses import replace
from pathlib import Path

from fleetserve.sim.profile import Profile, ShapeTiming

SOURCE = "BENCHMARKS.md §{section} ({row}), 2026-12-02, {command}"
GPU_COMMAND = ("python3 benchmarks/gpu.py --budget 0.3 --engines fp16,bf16,fp8,bert-base/fp8:ffn1=triton "
               "--instances fp16 --profile fp8 (NVIDIA H200)")
CPU_COMMAND = ".venv/bin/python benchmarks/engine.py --json out/engine.json (2-core AMD EPYC)"
H200_BATCHES = (1, 8, 32, 128, 512)
# §2, bert-base, sequences/s of the whole engine call at sequence 128.
H200_INFER = {
    "fp16": (1754, 10619, 18453, 20721, 21068),
    "fp8": (1786, 10438, 19407, 24804, 26467),
}
H200_CAPACITY = 20950 / 20307  # §2: fp16 at batch 128, 4 instances vs 1
# §1, bert-base int8 onnxruntime: (batch, median ms, p99 ms) at sequence 128, 2 threads.
CPU_INT8 = ((1, 38.06, 51.80), (8, 262.69, 295.54), (32, 1099.69, 2257.56))
Z99 = 2.3263  # standard normal 99th percentile


def constant(seconds: float) -> ShapeTiming:
    return ShapeTiming(seconds, 0.0, seconds, seconds, 1)


def lognormal(median_s: float, p99_s: float) -> ShapeTiming:
    sigma = math.log(p99_s / median_s) / Z99
    mean = median_s * math.exp(sigma * sigma / 2)
    std = mean * math.sqrt(math.expm1(sigma * sigma))
    return ShapeTiming(mean, std, median_s, p99_s, 1)


def derived(measured: Profile) -> list[tuple[str, Profile]]:
    common = dict(
        model="bert-base", replica_cpu_s=measured.replica_cpu_s, gateway_cpu_s=measured.gateway_cpu_s,
        cold_start_s=None, lengths=measured.lengths, seq_lengths=(128,), seq_buckets=(128,),
        measured_at="2026-12-02",
    )
    cpu_note = (f"replica and gateway CPU per request and the text mix from {measured.name} "
                f"(measured {measured.measured_at}); cold start not measured")
    out = []
    for precision, rates in H200_INFER.items():
        service = tuple((constant(b / r),) for b, r in zip(H200_BATCHES, rates, strict=True))
        out.append((f"h200-bert-base-{precision}.json", Profile(
            precision=precision, backend="torch-cuda", device="cuda", device_name="NVIDIA H200",
            batch_sizes=H200_BATCHES, service=service, device_capacity=H200_CAPACITY, pad_to_bucket=True,
            name=f"H200 bert-base {precision}",
            derived_from=SOURCE.format(section=2, row=f"torch-cuda {precision}, infer()", command=GPU_COMMAND),
            notes=("sequence 128 only: every request padded to 128", "variance not recorded: constant service",
                   *(("device capacity from the fp16 instance run",) if precision != "fp16" else ()), cpu_note),
            **common)))  # type: ignore[arg-type]
    out.append(("cpu-bert-base-int8.json", Profile(
        precision="int8", backend="onnxruntime", device="cpu", device_name="AMD EPYC, 2 cores",
        batch_sizes=tuple(b for b, _, _ in CPU_INT8),
        service=tuple((lognormal(med / 1e3, p99 / 1e3),) for _, med, p99 in CPU_INT8), threads=2,
        name="2-core CPU bert-base int8",
        derived_from=SOURCE.format(section=1, row="fleetserve onnxruntime int8, bert-base", command=CPU_COMMAND),
        notes=("sequence 128 only: every request padded to 128", "lognormal fitted to the median and p99", cpu_note),
        **common)))  # type: ignore[arg-type]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu-profile", type=Path, default=Path("benchmarks/profiles/minilm-int8-cpu.json"))
    ap.add_argument("--out", type=Path, default=Path("benchmarks/profiles"))
    args = ap.parse_args()
    measured = Profile.load(args.cpu_profile)
    for name, profile in derived(measured):
        profile = replace(profile, command=f"benchmarks/sim_profiles.py --cpu-profile {args.cpu_profile}")
        profile.save(args.out / name)
        print(f"{args.out / name}: {profile.name} (derived from {profile.derived_from})")


if __name__ == "__main__":
    main()
