"""``fleetserve build MODEL``: build (or find in the cache) an optimized engine and print its report."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from fleetserve.engine.config import EngineConfig
from fleetserve.options import option, section


@dataclass(frozen=True)
class BuildOptions:
    engine: EngineConfig = section(EngineConfig)
    json: bool = option(False, "print the build report as JSON")


OPTIONS = BuildOptions


def run(options: BuildOptions) -> int:
    from fleetserve.engine.builder import build

    config = options.engine
    t0 = time.perf_counter()
    built = build(config)
    elapsed = time.perf_counter() - t0
    if options.json:
        print(json.dumps({"key": built.key, "cache_hit": built.cache_hit, "path": str(built.entry.directory),
                          "profile": built.profile.key(),
                          **built.report}, indent=2))
        return 0
    r = built.report
    print(f"engine   {built.key}  ({'cache hit' if built.cache_hit else 'built'} in {elapsed:.2f} s)")
    print(f"model    {built.model.name}  ({built.model.onnx_path})")
    print(f"backend  {r.get('backend')}  precision {r.get('precision')}  device {r.get('device')}")
    if r.get("method"):
        print(f"method   {r['method']}")
    fusions = r.get("fusions") or {}
    if isinstance(fusions, dict) and fusions:
        print("fusions  " + ", ".join(f"{k}×{v}" for k, v in sorted(fusions.items())))
    acc = r.get("accuracy") or {}
    if isinstance(acc, dict) and acc:
        print(f"accuracy mean cosine {acc['mean_cosine']:.4f}, min {acc['min_cosine']:.4f} "
              f"vs fp32 on {int(acc.get('texts', 0))} held-out texts")
    notes = r.get("notes") or []
    for note in notes if isinstance(notes, list) else []:
        print(f"note     {note}")
    print(f"path     {built.entry.directory}")
    return 0
