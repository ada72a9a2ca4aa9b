"""MLPerf-style BERT-Large on one GPU (issue 16): offline throughput, and a server scenario through a replica.

The shape of MLPerf Inference's BERT-Large benchmark (SQuAD v1.1 features, max 384 tokens) without its
data set or LoadGen, neither of which is shipped: sequence lengths come from ``squad_tokens`` (a SQuAD-like
mix, mean ~185 tokens), the weights are the zoo's seeded ``bert-large``.

1. ``offline``: ``--samples`` sequences (10,833 = the SQuAD v1.1 dev features MLPerf uses), all available at
   once, as the offline scenario allows: sorted by length, cut into ``--max-batch`` batches, each padded to
   the nearest of ``--seq-buckets`` (one CUDA graph each), run by ``--instances`` engine instances fed by as
   many threads. Samples/s over one timed pass after a warm-up pass, for each of ``--precisions``
   (``precision[:option=value...]``, options of the torch-cuda backend, e.g. ``fp8:attention=triton``).
2. ``server``: for each of ``--server-fleets`` (replicas x engine instances), that many ``fleetserve serve
   bert-large`` replicas (``--server-precision``) sharing the GPU behind ``fleetserve gateway``, each cutting
   batches at ``--server-seq-buckets`` (fewer than offline: online, each bucket is a queue of its own), and
   ``fleetserve bench`` open loop, Poisson arrivals of one sequence per request (v2 binary, squad lengths) at
   each of ``--rates``. The scenario's result is the highest rate answered with p99 <= ``--p99-ms`` (130 ms,
   MLPerf's bound for BERT) and no errors.

Writes ``gpu_mlperf.json`` and ``gpu_mlperf.md`` under ``--out`` (default ``$OUT``).

    python3 benchmarks/gpu_mlperf.py                       # the H200 run (about 4 minutes)
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fleetserve.bench.workloads import CLS_ID, SEP_ID, VOCAB_IDS, squad_tokens  # noqa: E402

# MLPerf Inference v4.0, closed division, one H100 (TensorRT): BERT-Large samples/s (issue 16's references).
REFERENCES = {"offline": {"99% (INT8/FP8)": 9081, "99.9% (FP16)": 7940},
              "server": {"99% (INT8/FP8)": 6996, "99.9% (FP16)": 6096}}


@dataclass(frozen=True)
class RunConfig:
    model: str = "bert-large"
    backend: str = "torch-cuda"
    device: str = "cuda"
    precisions: tuple[str, ...] = ("fp16", "fp8")
    server_precision: str = "fp16"
    max_batch: int = 128
    max_seq: int = 384
    seq_buckets: tuple[int, ...] = (64, 96, 128, 160, 192, 224, 256, 320, 384)
    instances: int = 2
    server_fleets: tuple[tuple[int, int], ...] = ((1, 2), (2, 1))  # (replicas, instances each)
    # Online, each bucket is its own queue: fewer buckets than offline make fuller batches.
    server_seq_buckets: tuple[int, ...] = (128, 192, 256, 384)
    server_max_delay_ms: float = 16.0
    server_frontends: int = 0  # front-end processes per replica (`serve --frontends`); 0: one process each
    gateway_workers: int = 4
    samples: int = 10833
    rates: tuple[float, ...] = (3000.0, 5000.0, 6000.0, 7000.0)
    p99_ms: float = 130.0
    duration_s: float = 6.0
    warmup_s: float = 1.5
    bench_processes: int = 4
    phases: tuple[str, ...] = ("offline", "server")
    out: Path = Path(os.environ.get("OUT") or ROOT / "out")
    home: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="fleetserve-home-")))

    def __post_init__(self) -> None:
        if unknown := set(self.phases) - {"offline", "server"}:
            raise ValueError(f"unknown phases {sorted(unknown)}; choose from offline, server")
        if min(self.samples, self.max_batch, self.instances, self.gateway_workers,
               *(n for fleet in self.server_fleets for n in fleet)) < 1:
            raise ValueError("samples, max_batch, instances, replicas and gateway workers must be >= 1")
        if max(self.seq_buckets, default=0) != self.max_seq or max(self.server_seq_buckets, default=0) != self.max_seq:
            raise ValueError(f"the largest sequence bucket must be max_seq ({self.max_seq})")
        if min(self.rates, default=1) <= 0 or self.p99_ms <= 0 or self.duration_s <= 0:
            raise ValueError("rates, p99 bound and duration must be positive")


def sample_lengths(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [squad_tokens(rng) for _ in range(n)]


def plan_batches(lengths: list[int], max_batch: int, buckets: tuple[int, ...]) -> list[tuple[int, int]]:
    """(rows, padded length) of each offline batch: lengths sorted, cut every ``max_batch``, and padded to
    the smallest bucket that holds a batch's longest sequence."""
    ordered = sorted(lengths)
    plan = []
    for i in range(0, len(ordered), max_batch):
        chunk = ordered[i : i + max_batch]
        plan.append((len(chunk), next(b for b in sorted(buckets) if b >= chunk[-1])))
    return plan


def padded_tokens(plan: list[tuple[int, int]]) -> int:
    return sum(rows * seq for rows, seq in plan)


def batch_inputs(rows: int, seq: int, lengths: list[int], rng: np.random.Generator) -> dict[str, np.ndarray]:
    ids = np.zeros((rows, seq), dtype=np.int64)
    mask = np.zeros((rows, seq), dtype=np.int64)
    for i, n in enumerate(lengths):
        ids[i, :n] = rng.integers(*VOCAB_IDS, size=n)
        ids[i, 0], ids[i, n - 1] = CLS_ID, SEP_ID
        mask[i, :n] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


def offline(cfg: RunConfig, precision: str) -> dict[str, Any]:
    """One engine of ``precision`` with the run's buckets; samples/s over a timed pass of every sample."""
    from fleetserve.engine.base import BuildSpec, Precision, ShapeProfile
    from fleetserve.engine.torch_cuda import TorchCudaBackend

    profile = ShapeProfile(max_batch=cfg.max_batch, max_seq=cfg.max_seq, seq_buckets=cfg.seq_buckets,
                           batch_buckets=(cfg.max_batch,))
    backend = TorchCudaBackend()
    with tempfile.TemporaryDirectory() as tmp:
        name, *opts = precision.split(":")
        spec = BuildSpec(cfg.model, Path(tmp) / "unused.onnx", Precision(name), profile, "cuda:0",
                         options=dict(o.split("=", 1) for o in opts))
        t0 = time.perf_counter()
        report = backend.build(spec, Path(tmp))
        engine = backend.load(Path(tmp), profile)
        insts = [engine.instance() for _ in range(cfg.instances)]
        build_s = time.perf_counter() - t0
    lengths = sorted(sample_lengths(cfg.samples))
    plan = plan_batches(lengths, cfg.max_batch, cfg.seq_buckets)
    rng = np.random.default_rng(0)
    feeds, start = [], 0
    for rows, seq in plan:
        feeds.append(batch_inputs(rows, seq, lengths[start : start + rows], rng))
        start += rows

    def one_pass() -> float:
        work: queue.SimpleQueue[dict[str, np.ndarray]] = queue.SimpleQueue()
        for f in feeds:
            work.put(f)

        def drain(inst: Any) -> None:
            while True:
                try:
                    feed = work.get_nowait()
                except queue.Empty:
                    return
                inst.infer(feed, ("sentence_embedding",))

        t0 = time.perf_counter()
        threads = [threading.Thread(target=drain, args=(i,)) for i in insts]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return time.perf_counter() - t0

    one_pass()
    seconds = one_pass()
    engine.close()
    return {"precision": precision, "samples": cfg.samples, "seconds": seconds, "samples_per_s": cfg.samples / seconds,
            "mean_tokens": float(np.mean(lengths)), "padding_overhead": padded_tokens(plan) / sum(lengths) - 1,
            "batches": len(plan), "instances": cfg.instances, "accuracy": report.accuracy, "build_and_capture_s":
            round(build_s, 1)}


def server(cfg: RunConfig, replicas_n: int, instances: int) -> list[dict[str, Any]]:
    """``replicas_n`` replicas of ``instances`` engine instances sharing the GPU, each with the server buckets,
    behind ``fleetserve gateway`` (one replica: no gateway), and one open-loop Poisson point
    per rate, with the CPU cores of replicas and gateway and the GPU's utilisation over it."""
    from gpu_server import GpuSampler, Proc, seed_store, stop_all, wait_all_ready

    from fleetserve.bench.cpu import tree_cpu_seconds
    from fleetserve.deploy.local import free_port

    from _common import mean_batch, scrape

    seed_store(cfg.model, cfg.home)  # the torch-cuda build reads the zoo's PyTorch model: no ONNX export of 1.3 GB
    cli = [sys.executable, "-m", "fleetserve.cli"]
    # The first replica builds the engine into the store; the others start once it is there and load it.
    replicas: list[Proc] = []
    bases: list[str] = []
    procs: list[Proc] = []
    points: list[dict[str, Any]] = []
    gpu = GpuSampler()

    def cores(group: list[Proc]) -> float:
        return sum(tree_cpu_seconds(p.popen.pid) for p in group)

    try:
        for i in range(replicas_n):
            port = free_port()
            argv = [*cli, "serve", cfg.model, "--backend", cfg.backend, "--device", cfg.device, "--precision",
                    cfg.server_precision, "--max-batch", str(cfg.max_batch), "--max-seq", str(cfg.max_seq),
                    "--seq-buckets", ",".join(map(str, cfg.server_seq_buckets)), "--instances", str(instances),
                    "--max-delay-ms", str(cfg.server_max_delay_ms), "--promote-overdue", "--host", "127.0.0.1",
                    "--port", str(port), "--grpc-port", "0", "--max-queue", "65536", "--drain-grace-s", "0",
                    "--drain-timeout-s", "2", "--frontends", str(cfg.server_frontends)]
            replicas.append(Proc(argv, cfg.home / f"replica{i}.log"))
            bases.append(f"http://127.0.0.1:{port}")
            procs.append(replicas[-1])
            if i == 0:
                wait_all_ready(bases[0] + "/v2/health/ready", replicas, 240.0)
        for b in bases:
            wait_all_ready(b + "/v2/health/ready", replicas, 240.0)
        url = bases[0]
        if replicas_n > 1:
            port = free_port()
            gateway = Proc([*cli, "gateway", *(a for b in bases for a in ("--backend", b)), "--host", "127.0.0.1",
                            "--port", str(port), "--workers", str(cfg.gateway_workers), "--health-interval", "0.5"],
                           cfg.home / "gateway.log")
            procs.append(gateway)
            url = f"http://127.0.0.1:{port}"
            wait_all_ready(url + "/v2/health/ready", [gateway], 30.0)
            time.sleep(1.0)  # every worker's health checker has seen every replica
        for rate in cfg.rates:
            report = cfg.home / f"bench-{rate:.0f}.json"
            argv = [*cli, "bench", url, "--rate", str(rate), "--arrivals", "poisson", "--duration",
                    str(cfg.duration_s), "--warmup", str(cfg.warmup_s), "--workload", "v2-binary", "--model",
                    cfg.model, "--lengths", "squad", "--output", "sentence_embedding", "--processes",
                    str(cfg.bench_processes), "--timeout", "10", "--out", str(report)]
            before = [scrape(b) for b in bases]
            cpu0, t0 = (cores(replicas), cores(procs[len(replicas):])), time.monotonic()
            done = subprocess.run(argv, capture_output=True, text=True, timeout=cfg.duration_s + cfg.warmup_s + 60)
            t1 = time.monotonic()
            fleet = {"replicas": replicas_n, "instances": instances, "rate": rate,
                     "replica_cores": (cores(replicas) - cpu0[0]) / (t1 - t0),
                     "gateway_cores": (cores(procs[len(replicas):]) - cpu0[1]) / (t1 - t0),
                     "gpu_util": gpu.window(t1 - 0.3 - cfg.duration_s, t1 - 0.3)["gpu_util"],
                     "mean_batch_rows": mean_batch(before, [scrape(b) for b in bases])}
            if not report.is_file():
                points.append({**fleet, "error": (done.stderr or done.stdout)[-600:]})
                continue
            r = json.loads(report.read_text())
            lat = r["latency_s"]
            points.append({**fleet, "command": " ".join(["fleetserve", *argv[3:]]), "achieved": r["achieved_rps"],
                           "ok": r["ok"], "errors": r["errors"], "errors_by_type": r.get("errors_by_type"),
                           "p50_ms": (lat.get("p50") or 0) * 1e3, "p99_ms": (lat.get("p99") or 0) * 1e3})
            print("server:", points[-1], flush=True)
    except Exception as exc:  # the offline results still get written
        tail = (cfg.home / "replica0.log").read_text()[-1500:] if (cfg.home / "replica0.log").is_file() else ""
        points.append({"replicas": replicas_n, "instances": instances,
                       "error": f"{type(exc).__name__}: {exc}; log tail: {tail}"})
    finally:
        gpu.close()
        stop_all(procs)
    return points


def markdown(results: dict[str, Any]) -> str:
    cfg = results["config"]
    lines = [f"MLPerf-style BERT-Large: {results.get('gpu')}; {cfg['model']}, max {cfg['max_seq']} tokens, batch "
             f"{cfg['max_batch']}, {cfg['instances']} instances"]
    if "offline" in cfg["phases"]:
        lines += _offline_lines(results.get("offline", []))
    if "server" in cfg["phases"]:
        lines += _server_lines(results.get("server", []), cfg)
    return "\n".join(lines) + "\n"


def _offline_lines(offline: list[dict[str, Any]]) -> list[str]:
    lines = ["", "| offline | samples/s | mean tokens | padding | held-out cosine vs fp32 | MLPerf v4.0 one H100 |",
             "|---|---:|---:|---:|---:|---|"]
    for r in offline:
        if "error" in r:
            lines.append(f"| {r.get('precision')} | failed: {r['error'][-200:]} | | | | |")
            continue
        tier = "99% (INT8/FP8)" if r["precision"].split(":")[0] in ("fp8", "int8") else "99.9% (FP16)"
        ref = REFERENCES["offline"][tier]
        cos = r["accuracy"].get("mean_cosine")
        lines.append(f"| {r['precision']} | {r['samples_per_s']:,.0f} | {r['mean_tokens']:.0f} | "
                     f"{100 * r['padding_overhead']:.0f}% | {'' if cos is None else f'{cos:.4f}'} | {ref:,} |")
    return lines


def _server_lines(server: list[dict[str, Any]], cfg: dict[str, Any]) -> list[str]:
    buckets = ",".join(map(str, cfg["server_seq_buckets"]))
    lines = ["", f"server ({cfg['server_precision']}, replicas sharing the GPU behind the gateway, buckets {buckets}, "
              f"--max-delay-ms {cfg['server_max_delay_ms']:g} --promote-overdue "
              f"--frontends {cfg.get('server_frontends', 0)}; Poisson; p99 bound "
              f"{cfg['p99_ms']:.0f} ms):", "",
              "| replicas x instances | offered/s | achieved/s | p50 ms | p99 ms | errors | within bound | mean batch "
              "| GPU util | replica cores | gateway cores |", "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|"]
    for p in server:
        fleet = f"{p.get('replicas', '?')} x {p.get('instances', '?')}"
        if "error" in p:
            lines.append(f"| {fleet} | {p.get('rate', '')} | failed: {p['error'][-200:]} | | | | |")
            continue
        ok = p["p99_ms"] <= cfg["p99_ms"] and p["errors"] == 0
        kinds = f" {p['errors_by_type']}" if p.get("errors_by_type") else ""
        extra = " | ".join("" if p.get(k) is None else f"{p[k]:.{d}f}"
                           for k, d in (("mean_batch_rows", 1), ("gpu_util", 2), ("replica_cores", 1),
                                        ("gateway_cores", 1)))
        lines.append(f"| {fleet} | {p['rate']:,.0f} | {p['achieved']:,.0f} | {p['p50_ms']:.1f} | {p['p99_ms']:.1f} | "
                     f"{p['errors']}{kinds} | {'yes' if ok else 'no'} | {extra} |")
    best = server_result(server, cfg["p99_ms"])
    ref = REFERENCES["server"]["99% (INT8/FP8)" if cfg["server_precision"] in ("fp8", "int8") else "99.9% (FP16)"]
    return [*lines, "", f"server result: {best:,.0f} samples/s within the bound (MLPerf v4.0 one H100: {ref:,})"]


def server_result(points: list[dict[str, Any]], p99_ms: float) -> float:
    """The highest achieved rate of a point with p99 within the bound and no errors (0 if none)."""
    good = [p["achieved"] for p in points if "error" not in p and p["p99_ms"] <= p99_ms and p["errors"] == 0]
    return max(good, default=0.0)


def fleets(text: str) -> tuple[tuple[int, int], ...]:
    """``2x2,4x1`` -> ((2, 2), (4, 1)): replicas x engine instances each."""
    try:
        return tuple((int(r), int(i)) for r, i in (f.split("x") for f in text.split(",") if f))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected REPLICASxINSTANCES[,...] like 2x2,4x1, got {text!r}") from None


def parse_args(argv: list[str] | None = None) -> RunConfig:
    floats = lambda s: tuple(float(x) for x in s.split(",") if x)  # noqa: E731
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--precisions", type=lambda s: tuple(x for x in s.split(",") if x))
    p.add_argument("--server-precision")
    p.add_argument("--max-batch", type=int)
    p.add_argument("--instances", type=int)
    p.add_argument("--samples", type=int)
    p.add_argument("--server-fleets", type=fleets, help="replicas x instances each, e.g. 2x2,4x1")
    p.add_argument("--server-max-delay-ms", type=float)
    p.add_argument("--server-frontends", type=int, help="front-end processes per replica (serve --frontends)")
    p.add_argument("--server-seq-buckets", type=lambda s: tuple(int(x) for x in s.split(",") if x))
    p.add_argument("--gateway-workers", type=int)
    p.add_argument("--rates", type=floats)
    p.add_argument("--p99-ms", type=float)
    p.add_argument("--duration", type=float)
    p.add_argument("--bench-processes", type=int)
    p.add_argument("--phases", type=lambda s: tuple(x for x in s.split(",") if x))
    p.add_argument("--out", type=Path)
    p.add_argument("--home", type=Path)
    a = p.parse_args(argv)
    overrides = {"precisions": a.precisions, "server_precision": a.server_precision, "max_batch": a.max_batch,
                 "instances": a.instances, "server_fleets": a.server_fleets,
                 "server_max_delay_ms": a.server_max_delay_ms, "server_frontends": a.server_frontends,
                 "server_seq_buckets": a.server_seq_buckets,
                 "gateway_workers": a.gateway_workers, "samples": a.samples, "rates": a.rates, "p99_ms": a.p99_ms,
                 "duration_s": a.duration, "bench_processes": a.bench_processes, "phases": a.phases, "out": a.out,
                 "home": a.home}
    return replace(RunConfig(), **{k: v for k, v in overrides.items() if v is not None})


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    os.environ["FLEETSERVE_HOME"] = str(cfg.home)
    cfg.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"config": asdict(cfg), "offline": [], "server": []}
    try:
        import torch

        results["gpu"] = torch.cuda.get_device_name(0)
        if "offline" in cfg.phases:
            for precision in cfg.precisions:
                try:
                    results["offline"].append(offline(cfg, precision))
                except Exception as exc:  # one precision failing must not cost the rest of the run
                    results["offline"].append({"precision": precision, "error": f"{type(exc).__name__}: {exc}"})
                print("offline:", results["offline"][-1], flush=True)
                torch.cuda.empty_cache()
        if "server" in cfg.phases:
            for replicas_n, instances in cfg.server_fleets:
                results["server"] += server(cfg, replicas_n, instances)
    finally:
        (cfg.out / "gpu_mlperf.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
        text = markdown(results)
        (cfg.out / "gpu_mlperf.md").write_text(text)
        print(text, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
