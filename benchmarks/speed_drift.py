"""How much this machine's speed drifts with nothing else of ours running (issue 15's validation).

The speed probe of :mod:`fleetserve.sim.speed` (one engine instance, the profile's small shape back to back) run
for ``--seconds`` in windows of ``--window`` seconds: each window's factor (its median call over the profile's
median of that shape), then the means of ``--span``-second spans. A factor of 1.10 means calls take 10% longer
than when the profile was measured. On a machine of its own the factors stay within a percent or two; on a
shared VM the neighbours move them, and a fleet's p99 near capacity moves with them (BENCHMARKS.md §8.2).

    .venv/bin/python benchmarks/speed_drift.py --profile P.json [--seconds 180] [--window 5] [--span 30]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from fleetserve.engine.base import Precision
from fleetserve.engine.config import EngineConfig
from fleetserve.sim.profile import Profile
from fleetserve.sim.speed import SpeedProbe


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", type=Path, required=True, help="the profile whose engine and shape to time")
    ap.add_argument("--seconds", type=float, default=180.0)
    ap.add_argument("--window", type=float, default=5.0, help="seconds per factor")
    ap.add_argument("--span", type=float, default=30.0, help="seconds per mean in the summary")
    args = ap.parse_args()
    if not 0 < args.window <= args.span <= args.seconds:
        ap.error("need 0 < --window <= --span <= --seconds")
    profile = Profile.load(args.profile)
    probe = SpeedProbe.for_engine(profile, EngineConfig(model=profile.model, precision=Precision(profile.precision)),
                                  seconds=args.window)
    rows, tokens = SpeedProbe.shape(profile)
    print(f"# speed drift — batch {rows} at {tokens} tokens, {profile.name}, {time.strftime('%Y-%m-%d %H:%M %Z')}"
          f"; the profile's median {probe.reference_s * 1e3:.3f} ms")
    factors = [probe.factor() for _ in range(round(args.seconds / args.window))]
    per_span = max(1, round(args.span / args.window))
    spans = [statistics.fmean(factors[i:i + per_span]) for i in range(0, len(factors) - per_span + 1, per_span)]
    print("| window | " + " | ".join(f"{args.window * i:g} s" for i in range(len(factors))) + " |")
    print("|---|" + "---:|" * len(factors))
    print("| factor | " + " | ".join(f"{f:.3f}" for f in factors) + " |")
    print(f"\n{args.window:g}-second factors {min(factors):.3f}–{max(factors):.3f} (spread "
          f"{max(factors) / min(factors) - 1:.1%}); {args.span:g}-second means "
          + ", ".join(f"{s:.3f}" for s in spans)
          + f" (spread {max(spans) / min(spans) - 1:.1%})")


if __name__ == "__main__":
    main()
