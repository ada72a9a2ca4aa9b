"""``fleetserve build MODEL``: build (or find in the cache) an optimized engine and print its report."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from fleetserve.config import EngineConfig
from fleetserve.engine.base import Precision
from fleetserve.engine.registry import BACKENDS


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """Options shared by ``build`` and ``serve``."""
    parser.add_argument("model", nargs="?", default="minilm",
                        help="minilm, bert-base, tiny, or a path to an .onnx file")
    parser.add_argument("--precision", choices=[p.value for p in Precision], default="fp32")
    parser.add_argument("--backend", choices=["auto", *BACKENDS], default="auto")
    parser.add_argument("--calibration", type=Path, help="unlabelled text, one per line, for int8/fp8 calibration")
    parser.add_argument("--max-batch", type=int, default=32, help="largest batch the engine is built for")
    parser.add_argument("--max-seq", type=int, help="longest sequence (default: the model's maximum)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    parser.add_argument("--int8-method", choices=["dynamic", "static"], help="override the backend's int8 choice")
    parser.add_argument("--accuracy-threshold", type=float, default=0.99,
                        help="fail a reduced-precision build whose mean cosine vs fp32 is lower")


def engine_config(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(
        model=args.model, precision=Precision(args.precision), backend=args.backend, calibration=args.calibration,
        max_batch=args.max_batch, max_seq=args.max_seq, device=args.device, int8_method=args.int8_method,
        accuracy_threshold=args.accuracy_threshold,
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_engine_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the build report as JSON")


def run(args: argparse.Namespace) -> int:
    from fleetserve.engine.builder import build

    config = engine_config(args)
    t0 = time.perf_counter()
    built = build(config)
    elapsed = time.perf_counter() - t0
    if args.json:
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
