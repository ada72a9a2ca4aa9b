"""GPU engine benchmark: PyTorch eager fp32 / fp16 vs fleetserve's torch-cuda engines, on one CUDA GPU.

For each model (bert-base, minilm) at sequence 128 and batch 1/8/32/128/512 it measures median and p99
latency per batch and sequences per second of:
  * ``eager-fp32`` / ``eager-fp16``: the Hugging Face model (SDPA attention), one forward per batch;
  * ``<precision>`` (torch-cuda engine): the captured CUDA graph alone (``graph``: GPU time between CUDA
    events) and the whole ``EngineInstance.infer`` call with numpy in and the embedding out (``infer``);
plus each engine's accuracy report (cosine vs FP32 on held-out text, and on the benchmark batch), 1/2/4
engine instances driven by as many threads, and NVML readings (idle and right after the heaviest run).
Engine variants are ``precision[:option=value...]`` (options of the torch-cuda backend, e.g.
``fp8:ffn1=cublas:fp8_margin=4``); a failing variant is reported and the run goes on. ``--profile``
lists the GPU kernels of un-graphed batch-128 forwards. Prints markdown tables and writes
``gpu_bench.json``, ``gpu_bench.md`` (and ``gpu_profile.txt``) to ``--out`` (default ``$OUT``).

    python3 benchmarks/gpu.py                                 # defaults: fp16, bf16, fp8 on both models
    python3 benchmarks/gpu.py --budget 0.3 --engines fp16,bf16,fp8,fp8:ffn1=cublas \
        --instances fp16,fp8 --profile fp8        # the BENCHMARKS.md runs (under 3 minutes)
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fleetserve.engine.base import BuildSpec, Precision, ShapeProfile
from fleetserve.engine.torch_cuda import TorchCudaBackend, TorchCudaEngine
from fleetserve.models.tokenizer import TextTokenizer
from fleetserve.models.torch_models import load_torch_model
from fleetserve.models.weights import minilm_dir
from fleetserve.telemetry.gpu import GpuMonitor

from _common import nearest_rank

SEQ = 128
NAMES = ("input_ids", "attention_mask", "token_type_ids")
ROOT = Path(__file__).resolve().parent.parent


def bench_inputs(batch: int) -> dict[str, np.ndarray]:
    """``batch`` different real-text windows, each exactly SEQ tokens (no padding)."""
    words = ROOT.joinpath("fleetserve/data/corpus.txt").read_text().split()
    tok = TextTokenizer(minilm_dir() / "tokenizer.json", SEQ)
    texts = [" ".join((words * 2)[(i * 37) % len(words) :][:400]) for i in range(batch)]
    enc = tok.encode(texts).as_inputs()
    assert enc["input_ids"].shape == (batch, SEQ), enc["input_ids"].shape
    return enc


def summary(ms: list[float], batch: int) -> dict[str, float]:
    median = statistics.median(ms)
    return {"median_ms": median, "p99_ms": nearest_rank(ms, 99),
            "seq_per_s": batch / median * 1000.0, "runs": len(ms)}


def time_gpu(fn: Callable[[], Any], stream: torch.cuda.Stream, budget_s: float, warmup: int = 3) -> list[float]:
    """Per-call GPU time (ms) between CUDA events on ``stream``; calls until ``budget_s`` or 300 calls."""
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    stream.synchronize()
    events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
    t_end = time.perf_counter() + budget_s
    with torch.cuda.stream(stream):
        while len(events) < 10 or (time.perf_counter() < t_end and len(events) < 300):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(stream)
            fn()
            end.record(stream)
            events.append((start, end))
            if len(events) % 20 == 0:
                end.synchronize()
    stream.synchronize()
    return [s.elapsed_time(e) for s, e in events]


def time_host(fn: Callable[[], Any], budget_s: float, warmup: int = 3) -> list[float]:
    for _ in range(warmup):
        fn()
    out: list[float] = []
    t_end = time.perf_counter() + budget_s
    while len(out) < 10 or (time.perf_counter() < t_end and len(out) < 300):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000.0)
    return out


def cosine(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    a, b = a.astype(np.float64), b.astype(np.float64)
    sims = (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12)
    return {"mean_cosine": float(sims.mean()), "min_cosine": float(sims.min())}


def run_eager(model: Any, dtype: torch.dtype, inputs: dict[int, dict[str, np.ndarray]], budget: float,
              dev: torch.device) -> tuple[dict[int, dict[str, float]], dict[int, np.ndarray]]:
    m = model.to(dtype)  # in place: the caller runs fp32 first, then fp16
    stream = torch.cuda.Stream(dev)
    rows: dict[int, dict[str, float]] = {}
    embs: dict[int, np.ndarray] = {}
    with torch.inference_mode():
        for batch, feed in inputs.items():
            args = [torch.from_numpy(feed[n]).to(dev) for n in NAMES]
            embs[batch] = m(*args)[1].float().cpu().numpy()
            rows[batch] = summary(time_gpu(functools.partial(m, *args), stream, budget), batch)
    return rows, embs


def run_engine(engine: TorchCudaEngine, inputs: dict[int, dict[str, np.ndarray]], budget: float,
               ) -> tuple[dict[int, dict[str, Any]], dict[int, np.ndarray]]:
    inst = engine.instance()
    rows: dict[int, dict[str, Any]] = {}
    embs: dict[int, np.ndarray] = {}
    for batch, feed in inputs.items():
        embs[batch] = inst.infer(feed, ("sentence_embedding",))["sentence_embedding"]
        graph = summary(time_gpu(functools.partial(inst.replay, batch, SEQ), inst.stream, budget), batch)
        call = functools.partial(inst.infer, feed, ("sentence_embedding",))
        infer = summary(time_host(call, budget), batch)
        rows[batch] = {"graph": graph, "infer": infer}
    return rows, embs


def run_instances(engine: TorchCudaEngine, feed: dict[str, np.ndarray], counts: list[int], seconds: float,
                  ) -> dict[int, float]:
    """Sequences/s with N instances, each called back-to-back by its own thread."""
    insts = [engine.instance() for _ in range(max(counts))]
    out: dict[int, float] = {}
    for n in counts:
        done = [0] * n
        stop = time.perf_counter() + seconds
        threads = [threading.Thread(target=_drive, args=(insts[i], feed, stop, done, i)) for i in range(n)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        out[n] = sum(done) / (time.perf_counter() - t0)
    return out


def hf_model(name: str) -> Any:
    """The zoo model with SDPA attention where this transformers version allows it (FP32, eval mode)."""
    try:
        model = load_torch_model(name, attn_implementation="sdpa")
    except TypeError:  # transformers versions whose BertModel takes no attn_implementation argument
        model = load_torch_model(name)
        bert: Any = model.bert
        with contextlib.suppress(AttributeError, ValueError):
            bert.set_attn_implementation("sdpa")
    return model.float().eval()


def _drive(inst: Any, feed: dict[str, np.ndarray], stop: float, done: list[int], i: int) -> None:
    while time.perf_counter() < stop:
        inst.infer(feed, ("sentence_embedding",))
        done[i] += feed["input_ids"].shape[0]


def parse_engine(item: str) -> tuple[str, Precision, dict[str, str]]:
    """``precision[:option=value...]``, e.g. ``fp8:ffn1=triton:fp8_margin=4``."""
    prec, *opts = item.split(":")
    return item, Precision(prec), dict(o.split("=", 1) for o in opts)


def engines_for(model: str, spec: str) -> list[str]:
    """Entries of ``--engines``; ``model/entry`` limits an entry to one model."""
    out = []
    for item in spec.split(","):
        only, _, entry = item.rpartition("/")
        if not only or only == model:
            out.append(entry)
    return out


def bench_engine(backend: TorchCudaBackend, name: str, item: str, profile: ShapeProfile,
                 inputs: dict[int, dict[str, np.ndarray]], ref: np.ndarray, args: argparse.Namespace,
                 monitor: GpuMonitor | None) -> dict[str, Any]:
    label, precision, options = parse_engine(item)
    with tempfile.TemporaryDirectory() as tmp:
        spec = BuildSpec(name, Path(tmp) / "unused.onnx", precision, profile, "cuda:0", options=options)
        t0 = time.perf_counter()
        report = backend.build(spec, Path(tmp))
        build_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        engine = backend.load(Path(tmp), profile)
        engine.instance()
        load_s = time.perf_counter() - t0
    rows, embs = run_engine(engine, inputs, args.budget)
    entry: dict[str, Any] = {
        "rows": rows, "method": report.method, "accuracy_heldout": report.accuracy,
        "accuracy_bench": cosine(ref, embs[max(inputs)]),
        "build_s": round(build_s, 1), "load_and_capture_s": round(load_s, 2),
    }
    if monitor:
        entry["nvml_after"] = [s.to_json() for s in monitor.sample()]
    if label in args.instances.split(","):
        entry["instances_seq_per_s"] = run_instances(engine, inputs[128 if 128 in inputs else max(inputs)],
                                                     [1, 2, 4], 2.0)
    if args.profile and 128 in inputs and label in args.profile.split(","):
        entry["profile"] = kernel_profile(engine, inputs[128])
    engine.close()
    speeds = {b: round(r["graph"]["seq_per_s"]) for b, r in rows.items()}
    print(f"{name} {label}: graph seq/s {speeds}, accuracy {report.accuracy}", file=sys.stderr, flush=True)
    return entry


def kernel_profile(engine: TorchCudaEngine, feed: dict[str, np.ndarray]) -> str:
    """Top GPU kernels of three un-graphed forwards (where the time goes inside one batch)."""
    from torch.profiler import ProfilerActivity, profile

    ids, mask, types = (torch.from_numpy(feed[n]).cuda() for n in NAMES)
    with torch.inference_mode():
        engine.encoder.forward(ids, mask, types)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                engine.encoder.forward(ids, mask, types)
            torch.cuda.synchronize()
    table: str = prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=60)
    return table


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="bert-base,minilm")
    ap.add_argument("--batches", default="1,8,32,128,512")
    ap.add_argument("--engines", default="fp16,bf16,fp8", help="[model/]precision[:option=value...], comma-separated")
    ap.add_argument("--instances", default="fp16,fp8", help="engines to drive with 1/2/4 instances")
    ap.add_argument("--profile", default="", help="engines whose batch-128 forward is profiled per kernel")
    ap.add_argument("--budget", type=float, default=1.0, help="seconds of timing per row")
    ap.add_argument("--no-eager", action="store_true")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")))
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    dev = torch.device("cuda", 0)
    batches = [int(b) for b in args.batches.split(",")]
    profile = ShapeProfile(max_batch=max(batches), max_seq=SEQ, seq_buckets=(SEQ,), batch_buckets=tuple(batches))
    monitor = GpuMonitor.create()
    result: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(dev), "torch": torch.__version__, "cuda": torch.version.cuda,
        "seq": SEQ, "batches": batches, "nvml_idle": [s.to_json() for s in monitor.sample()] if monitor else [],
        "models": {},
    }
    inputs = {b: bench_inputs(b) for b in batches}
    backend = TorchCudaBackend()
    for name in args.models.split(","):
        res: dict[str, Any] = {"eager": {}, "engines": {}}
        model = hf_model(name).to(dev)
        res["eager_attention"] = str(model.bert.config._attn_implementation)
        ref_rows, ref = run_eager(model, torch.float32, inputs, args.budget, dev)
        if not args.no_eager:
            res["eager"]["fp32"] = ref_rows
            rows, embs = run_eager(model, torch.float16, inputs, args.budget, dev)
            res["eager"]["fp16"] = rows
            res["eager_fp16_cosine"] = cosine(ref[max(batches)], embs[max(batches)])
        model.cpu()
        del model
        for item in engines_for(name, args.engines):
            try:
                res["engines"][item] = bench_engine(backend, name, item, profile, inputs, ref[max(batches)], args,
                                                    monitor)
            except Exception as exc:  # one failing variant must not cost the rest of the run
                res["engines"][item] = {"error": f"{type(exc).__name__}: {exc}"}
                print(f"{name} {item}: FAILED {exc!r}", file=sys.stderr, flush=True)
            torch.cuda.empty_cache()
        result["models"][name] = res
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_bench.json").write_text(json.dumps(result, indent=2))
    md = render(result)
    (args.out / "gpu_bench.md").write_text(md)
    profiles = render_profiles(result)
    if profiles:
        (args.out / "gpu_profile.txt").write_text(profiles)
        print(profiles)
    print(md)
    return 0


def render(result: dict[str, Any]) -> str:
    lines = [f"GPU: {result['gpu']}, torch {result['torch']} (CUDA {result['cuda']}), sequence {result['seq']}", ""]
    for name, res in result["models"].items():
        lines += [f"### {name} (eager attention: {res['eager_attention']})", "",
                  "| config | batch | median ms | p99 ms | seq/s | infer() median ms | infer() p99 ms "
                  "| infer() seq/s |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for prec, rows in res["eager"].items():
            for b, r in rows.items():
                lines.append(f"| eager {prec} | {b} | {r['median_ms']:.3f} | {r['p99_ms']:.3f} "
                             f"| {r['seq_per_s']:,.0f} | | | |")
        ok = {label: e for label, e in res["engines"].items() if "error" not in e}
        for label, e in ok.items():
            for b, r in e["rows"].items():
                g, i = r["graph"], r["infer"]
                lines.append(f"| torch-cuda {label} | {b} | {g['median_ms']:.3f} | {g['p99_ms']:.3f} "
                             f"| {g['seq_per_s']:,.0f} | {i['median_ms']:.3f} | {i['p99_ms']:.3f} "
                             f"| {i['seq_per_s']:,.0f} |")
        lines += ["", "| engine | held-out mean / min cosine | bench-batch mean / min cosine | build s | "
                  "load+capture s | instances 1/2/4 seq/s (b128) |", "|---|---|---|---:|---:|---|"]
        for label, e in ok.items():
            h, bb = e["accuracy_heldout"], e["accuracy_bench"]
            inst = e.get("instances_seq_per_s", {})
            lines.append(f"| {label} | {h['mean_cosine']:.5f} / {h['min_cosine']:.5f} | {bb['mean_cosine']:.5f} / "
                         f"{bb['min_cosine']:.5f} | {e['build_s']} | {e['load_and_capture_s']} | "
                         f"{' / '.join(f'{v:,.0f}' for v in inst.values())} |")
        for label, e in res["engines"].items():
            if "error" in e:
                lines.append(f"\n{label}: FAILED {e['error']}")
        if "eager_fp16_cosine" in res:
            c = res["eager_fp16_cosine"]
            lines.append(f"\neager fp16 vs fp32 on the bench batch: mean {c['mean_cosine']:.5f}, "
                         f"min {c['min_cosine']:.5f}")
        lines.append("")
    after = [(f"after {n} {lbl}", e["nvml_after"])
             for n, r in result["models"].items() for lbl, e in r["engines"].items() if "nvml_after" in e]
    for label, samples in [("idle", result["nvml_idle"]), *after[-1:]]:
        for s in samples:
            lines.append(f"NVML {label}: gpu {s['gpu']} util {s['utilization']} mem {s['memory_used_bytes']}/"
                         f"{s['memory_total_bytes']} temp {s['temperature_celsius']} C sm {s['sm_clock_hertz']} Hz "
                         f"power {s['power_watts']} W throttled {s['throttled']}")
    return "\n".join(lines) + "\n"


def render_profiles(result: dict[str, Any]) -> str:
    return "".join(f"## {n} {lbl}\n{e['profile']}\n" for n, r in result["models"].items()
                   for lbl, e in r["engines"].items() if "profile" in e)


if __name__ == "__main__":
    raise SystemExit(main())
