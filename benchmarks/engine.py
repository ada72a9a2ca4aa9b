"""Engine benchmark: PyTorch eager fp32 vs every engine fleetserve builds, on this machine, in one run.

For each model (minilm, bert-base) and batch size (1, 8, 32) at sequence 128 it prints median / p99 latency
per batch and sequences per second, the speed-up over PyTorch eager fp32 measured in the same run, the
accuracy report of each reduced-precision engine, and the engine load time from cache to first inference.

    .venv/bin/python benchmarks/engine.py            # full table (a few minutes on 2 cores)
    .venv/bin/python benchmarks/engine.py --quick    # minilm only, fewer iterations (used by `make demo`)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from fleetserve.engine.base import Precision
from fleetserve.engine.builder import build
from fleetserve.engine.config import EngineConfig
from fleetserve.engine.onnxruntime import threads_per_instance
from fleetserve.models.store import ModelStore
from fleetserve.models.tokenizer import TextTokenizer

from _common import machine

SEQ = 128


def inputs_for(model: str, batch: int) -> dict[str, np.ndarray]:
    stored = ModelStore().resolve(model)
    assert stored.tokenizer_path is not None
    text = " ".join(Path(__file__).resolve().parent.parent.joinpath("fleetserve/data/corpus.txt").read_text().split())
    enc = TextTokenizer(stored.tokenizer_path, SEQ).encode([text] * batch)
    assert enc.input_ids.shape == (batch, SEQ)
    return enc.as_inputs()


def timeit(fn: Callable[[], object], min_iters: int, min_seconds: float) -> list[float]:
    fn()
    fn()
    samples: list[float] = []
    start = time.perf_counter()
    while len(samples) < min_iters or time.perf_counter() - start < min_seconds:
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
        if len(samples) >= 2000:
            break
    return samples


def torch_runner(model: str, threads: int) -> Callable[[dict[str, np.ndarray]], object]:
    import torch

    from fleetserve.models.torch_models import load_torch_model

    torch.set_num_threads(threads)
    m = load_torch_model(model, attn_implementation="sdpa")

    def run(feed: dict[str, np.ndarray]) -> object:
        with torch.inference_mode():
            return m(*(torch.from_numpy(feed[k]) for k in ("input_ids", "attention_mask", "token_type_ids")))

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--models", default=None, help="comma list (default minilm,bert-base; --quick: minilm)")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    models = (args.models or ("minilm" if args.quick else "minilm,bert-base")).split(",")
    batches = [int(b) for b in args.batches.split(",")]
    min_iters, min_s = (5, 1.0) if args.quick else (20, 3.0)
    threads = threads_per_instance(1)
    print(f"# engine benchmark — {machine()}, {threads} threads, seq {SEQ}, "
          f"{time.strftime('%Y-%m-%d')}")
    rows = []
    for model in models:
        variants: list[tuple[str, Callable[[dict[str, np.ndarray]], object], dict[str, object]]] = []
        try:
            variants.append(("pytorch eager fp32", torch_runner(model, threads), {}))
        except ImportError:
            print("(torch not installed: PyTorch baseline skipped)")
        for precision in (Precision.FP32, Precision.INT8):
            built = build(EngineConfig(model=model, precision=precision), quiet=True)
            t0 = time.perf_counter()
            engine = built.load(threads=threads)
            inst = engine.instance()
            inst.infer(inputs_for(model, 1))
            load_s = time.perf_counter() - t0
            info = {"load_s": load_s, "accuracy": built.report.get("accuracy") or {}}
            variants.append((f"fleetserve onnxruntime {precision}", inst.infer, info))
        for batch in batches:
            feed = inputs_for(model, batch)
            base_tput = None
            for name, fn, info in variants:
                lat = timeit(lambda fn=fn, feed=feed: fn(feed), min_iters, min_s)  # type: ignore[misc]
                med = statistics.median(lat)
                p99 = float(np.percentile(lat, 99))
                tput = batch / med
                base_tput = base_tput or tput
                acc = info.get("accuracy") or {}
                rows.append({
                    "model": model, "batch": batch, "variant": name, "median_ms": med * 1e3, "p99_ms": p99 * 1e3,
                    "seq_per_s": tput, "speedup": tput / base_tput,
                    "mean_cosine": acc.get("mean_cosine") if isinstance(acc, dict) else None,
                    "load_s": info.get("load_s"),
                })
    print("\n| model | batch | variant | median ms | p99 ms | seq/s | × eager fp32 | mean cos | load s |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        cos = f"{r['mean_cosine']:.4f}" if r["mean_cosine"] else "—"
        load = f"{r['load_s']:.2f}" if r["load_s"] else "—"
        print(f"| {r['model']} | {r['batch']} | {r['variant']} | {r['median_ms']:.2f} | {r['p99_ms']:.2f} | "
              f"{r['seq_per_s']:.0f} | {r['speedup']:.2f} | {cos} | {load} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
