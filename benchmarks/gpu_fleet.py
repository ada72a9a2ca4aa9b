"""Many GPUs behind one gateway (issue 18): one replica per GPU, N = 1, 2, 4, 8 up to the GPUs present.

1. ``scale``: for each N in ``--gpus`` (default: 1, 2, 4, 8 up to the GPUs NVML sees), N replicas, replica i
   started with ``CUDA_VISIBLE_DEVICES=i``, behind ``fleetserve gateway --workers W`` (W grows with N), and
   the load generator on the same host: 32-row v2-binary requests (closed loop at ``--rows-concurrency`` x N)
   and one text per ``/inference`` request (``--text-concurrency`` x N). Per point: seq/s, p99, each GPU's
   utilization (NVML), the CPU cores of replicas, gateway and generator; the scaling efficiency
   seq/s(N) / (N x seq/s(1)).
2. ``throttle``: the largest N again (2 replicas sharing GPU 0 where there is one GPU), open loop (Poisson)
   at ``--throttle-load`` x the capacity measured first, the first workload (32-row requests): all healthy, then with
   replica 0 stopped (SIGSTOP) 80 ms of every 100 ms (SIGCONT between), as the CPU scenarios do. The goal:
   p99 <= 1.5 x the healthy p99 and no failed requests.

Writes ``gpu_fleet.json`` after every point and ``gpu_fleet.md`` at the end, under ``--out``.

    python3 benchmarks/gpu_fleet.py                            # every N the machine allows
    python3 benchmarks/gpu_fleet.py --cpu-smoke                # the orchestration on CPU with the tiny model
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import gpu_server as gs

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class FleetConfig:
    server: gs.RunConfig = field(default_factory=lambda: gs.RunConfig(model="bert-base", instances=(2,)))
    gpus: tuple[int, ...] = ()  # empty: 1, 2, 4, 8 up to the GPUs present
    rows_concurrency: int = 32  # per GPU
    text_concurrency: int = 96  # per GPU
    workloads: tuple[str, ...] = ("v2-binary", "texts")
    throttle_load: float = 0.5
    stop_ms: float = 80.0
    period_ms: float = 100.0
    phases: tuple[str, ...] = ("scale", "throttle")

    def __post_init__(self) -> None:
        if unknown := set(self.phases) - {"scale", "throttle"}:
            raise ValueError(f"unknown phases {sorted(unknown)}; choose from scale, throttle")
        if not 0 < self.stop_ms < self.period_ms:
            raise ValueError("the stop must be shorter than its period")
        if not 0 < self.throttle_load <= 1:
            raise ValueError("throttle load must be in (0, 1]")


def gpu_counts(present: int, wanted: tuple[int, ...]) -> list[int]:
    """The N to run: ``wanted`` (each at most ``present``), or 1, 2, 4, 8 up to ``present``."""
    if wanted:
        return sorted({n for n in wanted if 1 <= n <= max(present, 1)})
    return [n for n in (1, 2, 4, 8) if n <= max(present, 1)]


def gateway_workers(n: int) -> int:
    return min(2 + 2 * n, 16)


def efficiency(seq_per_s: dict[int, float]) -> dict[int, float]:
    """seq/s at N over N x seq/s at 1 (scaling efficiency), for every N measured beside N = 1."""
    one = seq_per_s.get(1)
    return {n: v / (n * one) for n, v in seq_per_s.items() if one}


class Staller:
    """SIGSTOP a process for ``stop_ms`` of every ``period_ms`` (SIGCONT between) until closed."""

    def __init__(self, pid: int, stop_ms: float, period_ms: float) -> None:
        self.pid, self.stop_s, self.period_s = pid, stop_ms / 1000, period_ms / 1000
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.is_set():
            os.kill(self.pid, signal.SIGSTOP)
            self._done.wait(self.stop_s)
            os.kill(self.pid, signal.SIGCONT)
            self._done.wait(self.period_s - self.stop_s)

    def close(self) -> None:
        self._done.set()
        self._thread.join()
        os.kill(self.pid, signal.SIGCONT)


class Fleet:
    """N replicas (one per GPU) and a gateway, started and stopped together."""

    def __init__(self, cfg: gs.RunConfig, n: int, gpus: int, deadline: gs.Deadline) -> None:
        self.replicas, self.bases = gs.start_replicas(cfg, n, cfg.fleet_instances, cfg.work, gpus=gpus)
        self.gateway: list[gs.Proc] = []
        self.workers = gateway_workers(n)
        port = gs.free_port()
        self.gateway_argv = [*gs.CLI, "gateway", *(a for b in self.bases for a in ("--backend", b)), "--host",
                             "127.0.0.1", "--port", str(port), "--workers", str(self.workers), "--health-interval",
                             "0.5"]
        self.url = f"http://127.0.0.1:{port}"
        try:
            for b in self.bases:
                gs.wait_all_ready(b + "/v2/health/ready", self.replicas, min(180.0, deadline.left()))
            self.gateway.append(gs.Proc(self.gateway_argv, cfg.work / "gateway.log"))
            gs.wait_all_ready(self.url + "/v2/health/ready", self.gateway, 30.0)
            time.sleep(1.0)  # every worker's health checker has seen every backend
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        gs.stop_all(self.gateway + self.replicas)

    def point(self, cfg: gs.RunConfig, concurrency: int, tag: str, gpu: gs.GpuSampler,
              rate: float | None = None) -> dict[str, Any]:
        return gs.bench_point(cfg, self.url, concurrency, min(2 + len(self.bases), 8),
                              {"replica": self.replicas, "gateway": self.gateway}, self.bases, gpu, tag, rate)


def workload_cfg(cfg: gs.RunConfig, workload: str) -> gs.RunConfig:
    return replace(cfg, workload=workload, rows=32 if workload == "v2-binary" else 1)


def run_scale(fc: FleetConfig, ns: list[int], present: int, deadline: gs.Deadline, gpu: gs.GpuSampler,
              results: dict[str, Any]) -> None:
    for n in ns:
        if deadline.left() < 40:
            results["scale"].append({"gpus": n, "skipped": "out of time"})
            continue
        try:
            fleet = Fleet(fc.server, n, present, deadline)
        except (RuntimeError, OSError) as exc:
            results["scale"].append({"gpus": n, "error": str(exc)})
            continue
        try:
            for w in fc.workloads:
                c = (fc.rows_concurrency if w == "v2-binary" else fc.text_concurrency) * n
                point = fleet.point(workload_cfg(fc.server, w), c, f"s{n}-{w}", gpu)
                results["scale"].append({"gpus": n, "workload": w, "gateway_workers": fleet.workers, **point})
                gs.save_as(fc.server, results, "gpu_fleet.json")
        finally:
            fleet.close()


def run_throttle(fc: FleetConfig, present: int, deadline: gs.Deadline, gpu: gs.GpuSampler,
                 results: dict[str, Any]) -> None:
    n = max(present, 1)
    replicas = max(n, 2)  # one GPU: two replicas share it, so one can stall while the other serves
    cfg = workload_cfg(fc.server, fc.workloads[0])
    if deadline.left() < 40:
        results["throttle"].append({"skipped": "out of time"})
        return
    fleet = Fleet(cfg, replicas, present, deadline)
    try:
        per_gpu = fc.rows_concurrency if cfg.workload == "v2-binary" else fc.text_concurrency
        capacity = fleet.point(cfg, per_gpu * replicas, "t-capacity", gpu)
        results["throttle"].append({"phase": "capacity", "replicas": replicas, "gpus": n, **capacity})
        rate = fc.throttle_load * (capacity.get("req_per_s") or 0)
        if rate <= 0:
            return
        healthy = fleet.point(cfg, 0, "t-healthy", gpu, rate=rate)
        results["throttle"].append({"phase": "healthy", "replicas": replicas, "gpus": n, **healthy})
        staller = Staller(fleet.replicas[0].popen.pid, fc.stop_ms, fc.period_ms)
        try:
            stalled = fleet.point(cfg, 0, "t-stalled", gpu, rate=rate)
        finally:
            staller.close()
        results["throttle"].append({"phase": "stalled", "replicas": replicas, "gpus": n, **stalled})
        gs.save_as(fc.server, results, "gpu_fleet.json")
    finally:
        fleet.close()


def markdown(results: dict[str, Any]) -> str:
    fmt = gs.fmt
    lines = [f"GPU fleet run: {results['gpus_present']} x {results['gpu']}; {results['config']['server']['model']} "
             f"{results['config']['server']['precision']}; took {results.get('elapsed_s', 0):.0f} s", "",
             "| GPUs | workload | gateway workers | concurrency | req/s | seq/s | scaling eff. | p50 ms | p99 ms "
             "| errors | GPU util mean / min | replica cores | gateway cores | bench cores |",
             "|---:|---|---:" + "|---:" * 11 + "|"]
    for w, eff in results.get("efficiency", {}).items():
        for p in results["scale"]:
            if p.get("workload") != w:
                continue
            e = eff.get(p["gpus"])
            lines.append(f"| {p['gpus']} | {w} | {p.get('gateway_workers', '')} | {p.get('concurrency', '')} | "
                         f"{fmt(p.get('req_per_s'))} | {fmt(p.get('seq_per_s'))} | {fmt(e, '.2f')} | "
                         f"{fmt(p.get('p50_ms'), '.1f')} | {fmt(p.get('p99_ms'), '.1f')} | {p.get('errors', '')} | "
                         f"{fmt(p.get('gpu_util'), '.2f')} / {fmt(p.get('gpu_util_min'), '.2f')} | "
                         f"{fmt(p.get('replica_cores'), '.1f')} | {fmt(p.get('gateway_cores'), '.1f')} | "
                         f"{fmt(p.get('bench_cores'), '.1f')} |")
    for p in results["scale"]:
        if "skipped" in p or "error" in p:
            lines.append(f"| {p['gpus']} | {p.get('skipped') or str(p.get('error'))[-300:]} |" + " |" * 12)
    lines += ["", "| throttle phase | replicas | GPUs | offered/s | req/s | p50 ms | p99 ms | errors | GPU util |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for p in results["throttle"]:
        if "phase" not in p:
            lines.append(f"| {p.get('skipped') or p.get('error')} |" + " |" * 8)
            continue
        lines.append(f"| {p['phase']} | {p['replicas']} | {p['gpus']} | {fmt(p.get('rate'))} | "
                     f"{fmt(p.get('req_per_s'))} | {fmt(p.get('p50_ms'), '.1f')} | {fmt(p.get('p99_ms'), '.1f')} | "
                     f"{p.get('errors', '')} | {fmt(p.get('gpu_util'), '.2f')} |")
    verdict = throttle_verdict(results["throttle"])
    if verdict:
        lines += ["", verdict]
    commands = sorted({f"    {p['command']}" for k in ("scale", "throttle") for p in results[k] if "command" in p})
    return "\n".join([*lines, "", "commands:", "", *commands]) + "\n"


def throttle_verdict(points: list[dict[str, Any]]) -> str:
    by = {p.get("phase"): p for p in points}
    healthy, stalled = by.get("healthy"), by.get("stalled")
    if not healthy or not stalled or not healthy.get("p99_ms") or "p99_ms" not in stalled:
        return ""
    ratio = stalled["p99_ms"] / healthy["p99_ms"]
    met = ratio <= 1.5 and stalled.get("errors") == 0
    return (f"stalled / healthy p99: {ratio:.2f} (goal <= 1.5), failed requests while stalled: "
            f"{stalled.get('errors')} (goal 0): {'met' if met else 'not met'}")


def parse_args(argv: list[str] | None = None) -> FleetConfig:
    ints = lambda s: tuple(int(x) for x in s.split(",") if x)  # noqa: E731
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu-smoke", action="store_true", help="tiny model on CPU, short points: test the script")
    p.add_argument("--model")
    p.add_argument("--precision")
    p.add_argument("--gpus", type=ints)
    p.add_argument("--rows-concurrency", type=int)
    p.add_argument("--text-concurrency", type=int)
    p.add_argument("--throttle-load", type=float)
    p.add_argument("--phases", type=lambda s: tuple(x for x in s.split(",") if x))
    p.add_argument("--duration", type=float)
    p.add_argument("--budget-s", type=float)
    p.add_argument("--out", type=Path)
    p.add_argument("--home", type=Path)
    a = p.parse_args(argv)
    server = gs.RunConfig(model="bert-base", instances=(2,), budget_s=420.0)
    fc = FleetConfig(server=server)
    if a.cpu_smoke:
        server = replace(server, model="tiny", backend="auto", device="cpu", precision="fp32", max_batch=32,
                         max_seq=32, tokens=32, fleet_instances=1, duration_s=1.5, warmup_s=0.5, budget_s=150.0)
        # The tiny model's vocabulary is too small for the v2 workloads' BERT token ids: texts only.
        fc = replace(fc, gpus=(1, 2), rows_concurrency=4, text_concurrency=8, workloads=("texts",))
    server = replace(server, **{k: v for k, v in {"model": a.model, "precision": a.precision, "duration_s": a.duration,
                                                  "budget_s": a.budget_s, "out": a.out, "home": a.home}.items()
                                if v is not None})
    overrides = {"gpus": a.gpus, "rows_concurrency": a.rows_concurrency, "text_concurrency": a.text_concurrency,
                 "throttle_load": a.throttle_load, "phases": a.phases}
    return replace(fc, server=server, **{k: v for k, v in overrides.items() if v is not None})


def main(argv: list[str] | None = None) -> int:
    fc = parse_args(argv)
    cfg = fc.server
    os.environ["FLEETSERVE_HOME"] = str(cfg.home)
    cfg.out.mkdir(parents=True, exist_ok=True)
    t0, deadline = time.monotonic(), gs.Deadline(cfg.budget_s)
    gpu = gs.GpuSampler()
    samples = [s for s in gpu.monitor.sample() if not s.mig] if gpu.monitor is not None else []
    present = len(samples)
    results: dict[str, Any] = {"gpu": samples[0].name if samples else "no GPU", "gpus_present": present,
                               "config": asdict(fc), "scale": [], "throttle": []}
    try:
        if cfg.backend == "torch-cuda":
            gs.seed_store(cfg.model, cfg.home)
        results["build"] = gs.run_build(cfg, deadline)
        if "scale" in fc.phases:
            run_scale(fc, gpu_counts(present, fc.gpus), present, deadline, gpu, results)
        if "throttle" in fc.phases:
            run_throttle(fc, present, deadline, gpu, results)
    finally:
        gpu.close()
        results["efficiency"] = {w: efficiency({p["gpus"]: p["seq_per_s"] for p in results["scale"]
                                                if p.get("workload") == w and p.get("seq_per_s")})
                                 for w in fc.workloads}
        results["elapsed_s"] = time.monotonic() - t0
        gs.save_as(cfg, results, "gpu_fleet.json")
        text = markdown(results)
        (cfg.out / "gpu_fleet.md").write_text(text)
        print(text, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
