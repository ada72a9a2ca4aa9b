"""Serving on one GPU (issue 6, H200 measurements 2 and 3), in one bounded run.

1. ``build``: ``fleetserve build MODEL --backend torch-cuda ...`` (exports the zoo model into the store first).
   If that fails (the ONNX export needs a transformers the image may not have), the store entry is seeded
   with a placeholder graph: the torch-cuda backend builds from the zoo's PyTorch definition, not the ONNX.
2. ``raw``: the built engine loaded in a child process and called back-to-back, ``instance().infer`` at
   ``max_batch`` rows of ``tokens`` tokens: with every output (what the batcher asks for), with the embedding
   only, the captured graph alone, and N instances driven by N threads. This is the ceiling a server is
   compared with.
3. ``replica``: one ``fleetserve serve`` per ``--instances`` value, a closed-loop ``fleetserve bench`` sweep
   over ``--concurrency`` with ranking-sized v2-binary requests (``--rows`` sequences of ``--tokens``), or
   with ``--workload texts`` one short text per ``/inference`` request (the search mix, tokenised by the
   replica), or with ``--workload rank`` one query and ``--candidates`` texts to rank against it.
4. ``fleet``: 1, 2, 4 replicas on the one GPU behind ``fleetserve gateway --workers N``.

``--phases`` picks which of raw, replica and fleet run (the build always does).

Per load point: sequences/s (requests/s x rows), p50/p99, GPU utilization (NVML sampled here every 0.1 s over
the measured window, and the replicas' ``fleetserve_gpu_utilization_ratio`` gauge), the replicas' mean batch
(``fleetserve_batch_size`` histogram) and the CPU cores used by replicas, gateway and load generator, which
says where a server that cannot keep the GPU busy spends its time. Where a request's time goes: the mean of
each stage on its path (the client's latency, the gateway's, its attempt on the replica, the replica's handler,
its batcher queue and engine call, and with ``--frontends`` the engine process's queue and call), from the
servers' own histograms scraped before and after the point, and the three busiest threads of each part (a
thread near one core is a serial step at its limit, however idle the machine). Every point and the whole run have
deadlines (``--budget-s``); a point that no longer fits is recorded as skipped. ``gpu_server.json`` is
rewritten after every point and ``gpu_server.md`` at the end, under ``--out`` (default ``$OUT``).

    python3 benchmarks/gpu_server.py                    # the H200 run (about 5 minutes)
    python3 benchmarks/gpu_server.py --model minilm --workload texts --phases fleet --replicas 4,6 \
        --fleet-concurrency 256 --gateway-workers 4 --bench-processes 4   # one text per request
    python3 benchmarks/gpu_server.py --workload texts --client wrk ...   # the same closed loop from wrk (C)
    python3 benchmarks/gpu_server.py --cpu-smoke        # the orchestration on CPU with the tiny model
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fleetserve.bench.cpu import busiest_threads, tree_cpu_seconds, tree_threads_cpu  # noqa: E402
from fleetserve.bench.workloads import WorkloadConfig, make_payloads  # noqa: E402
from fleetserve.deploy.local import free_port  # noqa: E402

import _wrk  # noqa: E402
from _common import (  # noqa: E402
    NotReady,
    histogram_means,
    histogram_sums,
    http_get,
    machine_cpu_s,
    mean_batch,
    metrics_text,
    process_cpu_s,
    totals,
    wait_ready,
)

CLI = [sys.executable, "-m", "fleetserve.cli"]
WORKLOADS = ("v2-binary", "texts", "rank")
CLIENTS = ("fleetserve", "wrk")
EMBEDDING = "sentence_embedding"


@dataclass(frozen=True)
class RunConfig:
    model: str = "bert-base"
    backend: str = "torch-cuda"
    device: str = "cuda"
    precision: str = "fp16"
    max_batch: int = 128
    max_seq: int = 128
    workload: str = "v2-binary"
    candidates: int = 20  # rank workload: candidates per query
    seq_buckets: tuple[int, ...] = ()  # the engine's sequence buckets; empty: fleetserve's default
    rows: int = 32
    tokens: int = 128
    instances: tuple[int, ...] = (2, 4)
    concurrency: tuple[int, ...] = (4, 16, 64)
    replicas: tuple[int, ...] = (1, 2, 4)
    fleet_instances: int = 2
    serve_args: tuple[str, ...] = ()  # more `fleetserve serve` flags for every replica, e.g. --max-delay-ms 4
    fleet_concurrency: tuple[int, ...] = (32, 128)
    gateway_workers: int = 0  # 0: max(2, replicas)
    gateway_args: tuple[str, ...] = ()  # more `fleetserve gateway` flags, e.g. --server aiohttp
    bench_processes: int = 0  # 0: 2 against one replica, max(2, min(replicas, 4)) through the gateway
    client: str = "fleetserve"  # the load generator: "fleetserve" (bench) or "wrk" (closed loop, JSON workloads)
    wrk: str = "wrk"  # the wrk executable
    phases: tuple[str, ...] = ("raw", "replica", "fleet")
    duration_s: float = 6.0
    warmup_s: float = 1.5
    raw_s: float = 2.0
    budget_s: float = 360.0
    out: Path = Path(os.environ.get("OUT") or ROOT / "out")
    home: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="fleetserve-home-")))
    # Server logs and bench reports stay off $OUT (few files come back from the device); tails are collected.
    work: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="gpu-server-")))
    tree: str | None = None  # the source tree every fleetserve process runs from (None: this script's own)

    def __post_init__(self) -> None:
        if self.workload not in WORKLOADS:
            raise ValueError(f"workload must be one of {', '.join(WORKLOADS)}, got {self.workload!r}")
        if self.client not in CLIENTS:
            raise ValueError(f"client must be one of {', '.join(CLIENTS)}, got {self.client!r}")
        if self.client == "wrk" and self.workload not in ("texts", "rank"):
            raise ValueError(f"--client wrk posts JSON bodies: workload texts or rank, not {self.workload!r}")
        if unknown := set(self.phases) - {"raw", "replica", "fleet"}:
            raise ValueError(f"unknown phases {sorted(unknown)}; choose from raw, replica, fleet")
        if self.workload == "texts":
            object.__setattr__(self, "rows", 1)
        elif self.workload == "rank":  # one query and its candidates, tokenised by the replica as one request
            object.__setattr__(self, "rows", 1 + self.candidates)
        if not 1 <= self.rows <= self.max_batch:
            raise ValueError(f"rows must be in 1..max_batch ({self.max_batch}), got {self.rows}")
        if not 2 <= self.tokens <= self.max_seq:
            raise ValueError(f"tokens must be in 2..max_seq ({self.max_seq}), got {self.tokens}")
        if min((*self.instances, *self.concurrency, *self.replicas, *self.fleet_concurrency, 1)) < 1:
            raise ValueError("instances, concurrency, replicas and fleet concurrency must be >= 1")
        if not (self.duration_s > 0 and self.warmup_s >= 0 and self.raw_s > 0 and self.budget_s > 0):
            raise ValueError("durations must be positive")

    def engine_args(self) -> list[str]:
        """The engine every replica serves, built once before they start (so they load it, not build it)."""
        buckets = ["--seq-buckets", ",".join(map(str, self.seq_buckets))] if self.seq_buckets else []
        return [self.model, "--backend", self.backend, "--device", self.device, "--precision", self.precision,
                "--max-batch", str(self.max_batch), "--max-seq", str(self.max_seq), *buckets]


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


class Proc:
    """A server started in its own session, so stopping it reaches its worker processes too."""

    def __init__(self, argv: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.argv = argv
        self.log = log
        with log.open("ab") as f:
            self.popen = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                                          env=None if env is None else {**os.environ, **env})

    def stop(self) -> None:
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGTERM)

    def reap(self, timeout: float = 8.0) -> None:
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait()


def stop_all(procs: list[Proc]) -> None:
    for p in procs:
        p.stop()
    for p in procs:
        p.reap()


def wait_all_ready(url: str, procs: list[Proc], timeout: float) -> None:
    try:
        wait_ready(lambda: http_get(url, 2.0)[0] == 200, [p.popen for p in procs], timeout, url, poll_s=0.25)
    except NotReady as exc:
        logs = [str(p.log) for p in procs if p.popen.poll() is not None]
        raise NotReady(f"{exc}; see {', '.join(logs)}" if logs else str(exc)) from None


class GpuSampler:
    """NVML utilization and power of every whole GPU every ``interval_s`` in a thread (nothing without a GPU)."""

    def __init__(self, interval_s: float = 0.1) -> None:
        from fleetserve.telemetry.gpu import GpuMonitor, GpuMonitorConfig

        self.monitor = GpuMonitor.create(GpuMonitorConfig(interval_s=max(interval_s, 0.05)))
        self.samples: list[tuple[float, str, float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval_s,), daemon=True)
        if self.monitor is not None:
            self._thread.start()

    def _run(self, interval_s: float) -> None:
        assert self.monitor is not None
        while not self._stop.wait(interval_s):
            now = time.monotonic()
            self.samples += [(now, s.gpu, s.utilization or 0.0, s.power_watts or 0.0)
                             for s in self.monitor.sample() if not s.mig]

    def window(self, start: float, end: float) -> dict[str, Any]:
        """Mean utilization over the GPUs, the least busy GPU's, each GPU's, and the power of all together."""
        per: dict[str, list[tuple[float, float]]] = {}
        for t, gpu, u, p in list(self.samples):
            if start <= t <= end:
                per.setdefault(gpu, []).append((u, p))
        if not per:
            return {"gpu_util": None, "gpu_util_min": None, "gpu_util_each": None, "gpu_power_w": None}
        util = {g: sum(u for u, _ in v) / len(v) for g, v in sorted(per.items())}
        return {"gpu_util": sum(util.values()) / len(util), "gpu_util_min": min(util.values()),
                "gpu_util_each": util, "gpu_power_w": sum(sum(p for _, p in v) / len(v) for v in per.values())}

    def close(self) -> None:
        self._stop.set()
        if self.monitor is not None:
            self._thread.join(timeout=2.0)
            self.monitor.close()


# A request's path, outside in: (column, histogram as :func:`_common.histogram_sums` keys it, which server's
# /metrics has it). Means over a point; each stage holds the ones after it, so the gaps between them are the hops.
STAGES = (("gateway", "fleetserve_gateway_request_duration_seconds{}", "gateway"),
          ("upstream", "fleetserve_gateway_upstream_duration_seconds{}", "gateway"),
          ("replica", "fleetserve_request_duration_seconds{stage=total}", "replica"),
          ("batch queue", "fleetserve_request_duration_seconds{stage=queue}", "replica"),
          ("engine call", "fleetserve_request_duration_seconds{stage=compute}", "replica"),
          ("engine queue", "fleetserve_engine_queue_seconds{}", "replica"),
          ("engine compute", "fleetserve_engine_compute_seconds{}", "replica"))


def stage_means_ms(before: dict[str, list[str]], after: dict[str, list[str]]) -> dict[str, float | None]:
    """Each stage's mean time in ms between two readings of each server's ``/metrics`` pages (``replica``,
    ``gateway``)."""
    means = {server: histogram_means(histogram_sums(before[server]), histogram_sums(after[server]))
             for server in before}
    return {column: None if (mean := means.get(server, {}).get(key)) is None else 1e3 * mean
            for column, key, server in STAGES}


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def fleetserve_bench(cfg: RunConfig, url: str, concurrency: int, processes: int, tag: str,
                     rate: float | None) -> tuple[list[str], dict[str, Any] | str]:
    """``fleetserve bench``'s command line and its JSON report, or the end of its output if it wrote none."""
    report = cfg.work / f"bench-{tag}.json"
    load = ["--rate", str(rate), "--arrivals", "poisson"] if rate else ["--concurrency", str(concurrency)]
    argv = [*CLI, "bench", url, *load, "--duration", str(cfg.duration_s),
            "--warmup", str(cfg.warmup_s), "--workload", cfg.workload, "--processes", str(processes),
            "--timeout", "30", "--out", str(report)]
    if cfg.workload == "v2-binary":
        argv += ["--model", cfg.model, "--rows", str(cfg.rows), "--tokens", str(cfg.tokens), "--output", EMBEDDING]
    elif cfg.workload == "rank":
        argv += ["--candidates", str(cfg.candidates)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=cfg.duration_s + cfg.warmup_s + 60)
    if done.returncode not in (0, 1) or not report.is_file():
        return ["fleetserve", *argv[3:]], (done.stderr or done.stdout)[-800:]
    r: dict[str, Any] = json.loads(report.read_text())
    report.unlink()
    return ["fleetserve", *argv[3:]], r


def wrk_bench(cfg: RunConfig, url: str, concurrency: int, threads: int) -> tuple[list[str], dict[str, Any] | str]:
    """The same closed loop from ``wrk`` (``threads`` threads): a warm-up run, then the measured one (each in whole
    seconds), posting the workload's pool of bodies in turn; the result in ``fleetserve bench``'s report keys."""
    workload = WorkloadConfig(name=cfg.workload)
    if cfg.workload == "rank":
        workload = replace(workload, candidates=cfg.candidates)
    payloads = make_payloads(workload, random.Random(0))
    script = cfg.work / "wrk.lua"
    script.write_text(_wrk.script(payloads[0].path, [pl.body for pl in payloads]))
    target = url + payloads[0].path
    command = ["wrk", f"-t{threads}", f"-c{concurrency}", f"-d{_wrk.seconds(cfg.duration_s)}s", "-s", script.name,
               target]
    try:
        if cfg.warmup_s:
            _wrk.run(target, script, concurrency, cfg.warmup_s, threads, timeout_s=30, wrk=cfg.wrk)
        r = _wrk.run(target, script, concurrency, cfg.duration_s, threads, timeout_s=30, wrk=cfg.wrk)
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        return command, str(exc)[-800:]
    seconds = r["duration_us"] / 1e6
    ok = int(r["requests"] - r["status_errors"])
    return command, {"ok": ok, "errors": int(r["status_errors"] + r["socket_errors"]), "duration_s": seconds,
                     "errors_by_type": {"status": r["status_errors"], "socket": r["socket_errors"]},
                     "achieved_rps": ok / seconds,
                     "latency_s": {"p50": r["p50_us"] / 1e6, "p99": r["p99_us"] / 1e6, "mean": r["mean_us"] / 1e6}}


def bench_point(cfg: RunConfig, url: str, concurrency: int, processes: int, servers: dict[str, list[Proc]],
                bases: list[str], gpu: GpuSampler, tag: str, rate: float | None = None) -> dict[str, Any]:
    """One closed-loop point at ``concurrency``, or open loop (Poisson) at ``rate`` requests/s when given; the
    load from ``fleetserve bench`` (``processes`` processes) or with ``cfg.client`` "wrk" from ``wrk`` (as many
    threads)."""
    metrics = {"replica": bases, "gateway": [url] if "gateway" in servers else []}
    before = {k: [metrics_text(u) for u in v] for k, v in metrics.items()}
    cpu0 = {k: sum(tree_cpu_seconds(p.popen.pid) for p in v) for k, v in servers.items()}
    threads0 = {k: {key: t for p in v for key, t in tree_threads_cpu(p.popen.pid).items()} for k, v in servers.items()}
    # A replica's own process alone: with --frontends, the engine process (its front ends are its children).
    root0 = sum(process_cpu_s(p.popen.pid) for p in servers.get("replica", []))
    m0, t0, kids0 = machine_cpu_s(), time.monotonic(), children_cpu_s()
    if cfg.client == "wrk":
        command, r = wrk_bench(cfg, url, concurrency, processes) if rate is None else (
            ["wrk"], "wrk runs a closed loop only, not an open-loop rate")
    else:
        command, r = fleetserve_bench(cfg, url, concurrency, processes, tag, rate)
    t1 = time.monotonic()
    bench_cpu = children_cpu_s() - kids0
    wall = t1 - t0
    # The measured window ends when the generator stops sending, just before it writes its report.
    window = gpu.window(t1 - 0.3 - cfg.duration_s, t1 - 0.3)
    after = {k: [metrics_text(u) for u in v] for k, v in metrics.items()}
    point: dict[str, Any] = {"command": " ".join(command), "concurrency": concurrency, "rate": rate,
                             **window, "stage_ms": stage_means_ms(before, after)}
    point["busiest_threads"] = {
        k: busiest_threads(threads0[k], {key: t for p in v for key, t in tree_threads_cpu(p.popen.pid).items()}, wall)
        for k, v in servers.items()}
    point.update({f"{k}_cores": (sum(tree_cpu_seconds(p.popen.pid) for p in v) - cpu0[k]) / wall
                  for k, v in servers.items()})
    point["machine_cores"] = (machine_cpu_s() - m0) / wall
    point["replica_root_cores"] = (sum(process_cpu_s(p.popen.pid) for p in servers.get("replica", [])) - root0) / wall
    replicas_after = [totals(t) for t in after["replica"]]
    point["mean_batch_rows"] = mean_batch([totals(t) for t in before["replica"]], replicas_after)
    gauges = [a["fleetserve_gpu_utilization_ratio"] for a in replicas_after if "fleetserve_gpu_utilization_ratio" in a]
    point["replica_gpu_gauge"] = max(gauges) if gauges else None
    point["bench_cores"] = bench_cpu / wall  # the generator's processes, start-up included
    if isinstance(r, str):
        point["error"] = r
        return point
    lat = r["latency_s"]
    point.update({"ok": r["ok"], "errors": r["errors"], "errors_by_type": r["errors_by_type"],
                  "req_per_s": r["achieved_rps"], "seq_per_s": r["ok"] / r["duration_s"] * cfg.rows,
                  "p50_ms": (lat.get("p50") or 0) * 1e3, "p99_ms": (lat.get("p99") or 0) * 1e3,
                  "mean_ms": (lat.get("mean") or 0) * 1e3})
    return point


def start_replicas(cfg: RunConfig, n: int, instances: int, logs: Path,
                   gpus: int = 0) -> tuple[list[Proc], list[str]]:
    """``n`` replicas; with ``gpus``, replica i sees only GPU ``i % gpus`` (``CUDA_VISIBLE_DEVICES``)."""
    procs, bases = [], []
    for i in range(n):
        port = free_port()
        argv = [*CLI, "serve", *cfg.engine_args(), "--instances", str(instances), "--host", "127.0.0.1",
                "--port", str(port), "--grpc-port", "0", "--max-queue", str(max(8192, cfg.max_batch)),
                "--drain-grace-s", "0", "--drain-timeout-s", "2", *cfg.serve_args]
        env = {"CUDA_VISIBLE_DEVICES": str(i % gpus)} if gpus else None
        procs.append(Proc(argv, logs / f"replica{i}.log", env))  # appended to by later starts
        bases.append(f"http://127.0.0.1:{port}")
    return procs, bases


def run_replica(cfg: RunConfig, deadline: Deadline, gpu: GpuSampler, results: dict[str, Any]) -> None:
    for instances in cfg.instances:
        if deadline.left() < 40:
            results["replica"].append({"instances": instances, "skipped": "out of time"})
            continue
        procs, bases = start_replicas(cfg, 1, instances, cfg.work)
        try:
            wait_all_ready(bases[0] + "/v2/health/ready", procs, min(120.0, deadline.left()))
            for c in cfg.concurrency:
                if deadline.left() < cfg.duration_s + cfg.warmup_s + 10:
                    results["replica"].append({"instances": instances, "concurrency": c, "skipped": "out of time"})
                    continue
                point = bench_point(cfg, bases[0], c, cfg.bench_processes or 2, {"replica": procs}, bases, gpu,
                                    f"r{instances}-c{c}")
                results["replica"].append({"instances": instances, **point})
                save(cfg, results)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            results["replica"].append({"instances": instances, "error": str(exc)})
        finally:
            stop_all(procs)


def run_fleet(cfg: RunConfig, deadline: Deadline, gpu: GpuSampler, results: dict[str, Any]) -> None:
    for n in cfg.replicas:
        if deadline.left() < 45:
            results["fleet"].append({"replicas": n, "skipped": "out of time"})
            continue
        procs, bases = start_replicas(cfg, n, cfg.fleet_instances, cfg.work)
        workers = cfg.gateway_workers or max(2, n)
        port = free_port()
        gateway_argv = [*CLI, "gateway", *(a for b in bases for a in ("--backend", b)), "--host", "127.0.0.1",
                        "--port", str(port), "--workers", str(workers), "--health-interval", "0.5", *cfg.gateway_args]
        gateway: list[Proc] = []
        try:
            for b in bases:
                wait_all_ready(b + "/v2/health/ready", procs, min(150.0, deadline.left()))
            gateway.append(Proc(gateway_argv, cfg.work / "gateway.log"))
            url = f"http://127.0.0.1:{port}"
            wait_all_ready(url + "/v2/health/ready", gateway, 30.0)
            time.sleep(1.0)  # every worker's health checker has seen every backend
            for c in cfg.fleet_concurrency:
                if deadline.left() < cfg.duration_s + cfg.warmup_s + 10:
                    results["fleet"].append({"replicas": n, "concurrency": c, "skipped": "out of time"})
                    continue
                point = bench_point(cfg, url, c, cfg.bench_processes or max(2, min(n, 4)),
                                    {"replica": procs, "gateway": gateway},
                                    bases, gpu, f"f{n}-c{c}")
                results["fleet"].append({"replicas": n, "instances": cfg.fleet_instances,
                                         "gateway_workers": workers, "gateway": " ".join(gateway_argv[3:]), **point})
                save(cfg, results)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            results["fleet"].append({"replicas": n, "error": str(exc)})
        finally:
            stop_all(gateway + procs)


def run_build(cfg: RunConfig, deadline: Deadline) -> dict[str, Any]:
    argv = [*CLI, "build", *cfg.engine_args(), "--json"]
    t0 = time.monotonic()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=min(75.0, deadline.left()))
        ok, tail = done.returncode == 0, (done.stderr + done.stdout)[-1500:]
    except subprocess.TimeoutExpired:
        ok, tail = False, "timed out"
    out: dict[str, Any] = {"command": " ".join(["fleetserve", *argv[3:]]), "ok": ok, "seconds": time.monotonic() - t0}
    if not ok:
        out["failure"] = tail
        seed_store(cfg.model, cfg.home)
        done = subprocess.run(argv, capture_output=True, text=True, timeout=min(100.0, deadline.left()))
        out["seeded_store"] = done.returncode == 0
        if done.returncode != 0:
            raise RuntimeError(f"build failed even with a seeded store: {(done.stderr + done.stdout)[-1500:]}")
    return out


def seed_store(model: str, home: Path) -> None:
    """A store entry for ``model`` under ``home`` without an ONNX export; the torch-cuda build reads the zoo's
    PyTorch model, not the graph."""
    import shutil

    from fleetserve.models.store import ModelMeta
    from fleetserve.models.weights import minilm_dir
    from fleetserve.models.zoo import get_zoo_model

    zoo = get_zoo_model(model)
    directory = home / "models" / zoo.name
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "model.onnx").write_bytes(f"placeholder: {zoo.name} for torch-cuda\n".encode())
    shutil.copy(minilm_dir() / "tokenizer.json", directory / "tokenizer.json")
    ModelMeta(zoo.name, zoo.hidden_size, zoo.max_seq).write(directory)


def graph_seq(cfg: RunConfig) -> int:
    """The sequence bucket whose captured graph a ``tokens``-long batch replays (what the engine picks)."""
    from fleetserve.engine.config import EngineConfig
    from fleetserve.engine.gpu_io import bucket_for

    engine = EngineConfig(max_batch=cfg.max_batch, max_seq=cfg.max_seq, seq_buckets=cfg.seq_buckets)
    profile = engine.profile(cfg.max_seq)
    return bucket_for(profile.seq_buckets, cfg.tokens, "sequence length")


def raw_argv(cfg: RunConfig, argv: list[str]) -> list[str]:
    """The ``--raw`` child's command: the parent's arguments plus its home (the engine just built) and output."""
    return [sys.executable, __file__, "--raw", *argv, "--home", str(cfg.home), "--out", str(cfg.out)]


def raw_engine(cfg: RunConfig) -> dict[str, Any]:
    """Runs in a child process (``--raw``): the built engine called directly, no server."""
    import random

    from fleetserve.bench.workloads import token_ids
    from fleetserve.engine.builder import build
    from fleetserve.engine.config import EngineConfig

    engine = build(EngineConfig(model=cfg.model, precision=cfg.precision, backend=cfg.backend,  # type: ignore[arg-type]
                                max_batch=cfg.max_batch, max_seq=cfg.max_seq, seq_buckets=cfg.seq_buckets,
                                device=cfg.device), quiet=True).load()
    ids = token_ids(random.Random(0), cfg.tokens, cfg.max_batch)
    limit = next((s.value_limit for s in engine.inputs if s.name == "input_ids"), None)
    if limit is not None:  # a small vocabulary (the tiny model of --cpu-smoke)
        ids %= limit
    feed = {"input_ids": ids, "attention_mask": (ids * 0 + 1), "token_type_ids": ids * 0}
    insts: list[Any] = [engine.instance() for _ in range(max(cfg.instances))]  # torch-cuda's take outputs
    out: dict[str, Any] = {"batch": cfg.max_batch, "tokens": cfg.tokens}

    def loop(call: Any, counts: list[int], i: int, stop: float) -> None:
        while time.monotonic() < stop:
            call()
            counts[i] += cfg.max_batch

    def rate(calls: list[Any]) -> float:
        for c in calls:
            c()
        counts = [0] * len(calls)
        t0 = time.monotonic()
        threads = [threading.Thread(target=loop, args=(c, counts, i, t0 + cfg.raw_s)) for i, c in enumerate(calls)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return sum(counts) / (time.monotonic() - t0)

    out["infer_all_outputs_seq_per_s"] = rate([lambda: insts[0].infer(feed)])
    if hasattr(insts[0], "replay"):
        out["infer_embedding_only_seq_per_s"] = rate([lambda: insts[0].infer(feed, (EMBEDDING,))])
        seq = graph_seq(cfg)

        def replay() -> None:
            insts[0].replay(cfg.max_batch, seq)
            insts[0].stream.synchronize()

        out["graph_replay_seq_per_s"] = rate([replay])
    for n in cfg.instances:
        out[f"infer_all_outputs_{n}_instances_seq_per_s"] = rate(
            [lambda inst=inst: inst.infer(feed) for inst in insts[:n]])
    engine.close()
    return out


def save(cfg: RunConfig, results: dict[str, Any]) -> None:
    save_as(cfg, results, "gpu_server.json")


def save_as(cfg: RunConfig, results: dict[str, Any], name: str) -> None:
    (cfg.out / name).write_text(json.dumps(results, indent=2, default=str) + "\n")


def fmt(v: Any, spec: str = ",.0f") -> str:
    return "" if v is None else format(v, spec)


def markdown(results: dict[str, Any]) -> str:
    raw = results.get("raw") or {}
    # The ceiling a server is held to: the best single-instance infer() (embedding only, where supported).
    base = raw.get("infer_embedding_only_seq_per_s") or raw.get("infer_all_outputs_seq_per_s")
    conf = results["config"]
    shape = {"texts": "one text per /inference request (search mix)",
             "rank": f"one query + {conf.get('candidates')} candidates per /inference request (search mix)"}.get(
        conf.get("workload", ""), f"rows {conf['rows']} x tokens {conf['tokens']} per request")
    lines = [f"GPU server run: {results['gpu']}; {conf['model']} {conf['precision']}; {shape}; "
             f"load from {conf.get('client', 'fleetserve')}; "
             f"budget {conf['budget_s']:.0f} s, " + (f"servers from {conf['tree']}, " if conf.get("tree") else "") +
             f"took {results.get('elapsed_s', 0):.0f} s", "", f"build: `{results['build'].get('command')}` "
             f"ok={results['build'].get('ok')} seeded={results['build'].get('seeded_store')}", "",
             "| raw engine (no server) | seq/s |", "|---|---:|"]
    lines += [f"| {k.removesuffix('_seq_per_s')} | {fmt(v)} |" for k, v in raw.items() if k.endswith("_seq_per_s")]
    head = ("| req/s | seq/s | % of raw | p50 ms | p99 ms | errors | GPU util | replica gauge | mean batch "
            "| replica cores | gateway cores | bench cores | machine cores |")
    cols = "|---:" * 13 + "|"

    def row(p: dict[str, Any]) -> str:
        if "skipped" in p or "error" in p:
            return "| " + (p.get("skipped") or str(p.get("error"))[-200:].replace("\n", " ")) + " |" + " |" * 12
        pct = 100 * p["seq_per_s"] / base if base and p.get("seq_per_s") else None
        return (f"| {fmt(p.get('req_per_s'))} | {fmt(p.get('seq_per_s'))} | {fmt(pct, '.0f')} | "
                f"{fmt(p.get('p50_ms'), '.1f')} | "
                f"{fmt(p.get('p99_ms'), '.1f')} | {p.get('errors', '')} | {fmt(p.get('gpu_util'), '.2f')} | "
                f"{fmt(p.get('replica_gpu_gauge'), '.2f')} | {fmt(p.get('mean_batch_rows'), '.1f')} | "
                f"{fmt(p.get('replica_cores'), '.1f')} | {fmt(p.get('gateway_cores'), '.1f')} | "
                f"{fmt(p.get('bench_cores'), '.1f')} | {fmt(p.get('machine_cores'), '.1f')} |")

    lines += ["", "### one replica", "", "| instances | concurrency " + head, "|---:|---:" + cols]
    lines += [f"| {p['instances']} | {p.get('concurrency', '')} " + row(p) for p in results["replica"]]
    lines += ["", "### replicas behind the gateway", "", "| replicas | gateway workers | concurrency " + head,
              "|---:|---:|---:" + cols]
    lines += [f"| {p['replicas']} | {p.get('gateway_workers', '')} | {p.get('concurrency', '')} " + row(p)
              for p in results["fleet"]]
    lines += ["", "### where a request's time goes (means, ms) and the busiest threads (cores)", "",
              "| phase | replicas | concurrency | client | " + " | ".join(c for c, _, _ in STAGES)
              + " | busiest threads |", "|---|---:|---:|---:" + "|---:" * len(STAGES) + "|---|"]
    for phase in ("replica", "fleet"):
        for p in results[phase]:
            if "stage_ms" not in p:
                continue
            busy = "; ".join(f"{part}: " + ", ".join(f"{name} {cores:.2f}" for name, cores in threads)
                             for part, threads in p.get("busiest_threads", {}).items())
            lines.append(f"| {phase} | {p.get('replicas', 1)} | {p.get('concurrency', '')} | "
                         f"{fmt(p.get('mean_ms'), '.2f')} | "
                         + " | ".join(fmt(p["stage_ms"].get(c), ".2f") for c, _, _ in STAGES) + f" | {busy} |")
    commands = {f"    {p['command']}" for k in ("replica", "fleet") for p in results[k] if "command" in p}
    lines += ["", "commands:", "", *sorted(commands)]
    lines += sorted({f"    fleetserve {p['gateway']}" for p in results["fleet"] if "gateway" in p})
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> tuple[RunConfig, argparse.Namespace]:
    ints = lambda s: tuple(int(x) for x in s.split(",") if x)  # noqa: E731
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu-smoke", action="store_true", help="tiny model on CPU, short points: test the script")
    p.add_argument("--raw", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--seed-store", action="store_true",
                   help="seed the store before building (skips the ONNX export the torch-cuda build does not read)")
    p.add_argument("--model")
    p.add_argument("--precision")
    p.add_argument("--max-batch", type=int)
    p.add_argument("--workload", choices=WORKLOADS)
    p.add_argument("--candidates", type=int)
    p.add_argument("--seq-buckets", type=lambda s: tuple(int(x) for x in s.split(",") if x))
    p.add_argument("--phases", type=lambda s: tuple(x for x in s.split(",") if x))
    p.add_argument("--fleet-instances", type=int)
    p.add_argument("--serve-args", type=shlex.split, help="more `fleetserve serve` flags for every replica")
    p.add_argument("--gateway-workers", type=int)
    p.add_argument("--gateway-args", type=shlex.split, help="more `fleetserve gateway` flags, e.g. '--server aiohttp'")
    p.add_argument("--bench-processes", type=int, help="the load generator's processes (with --client wrk: threads)")
    p.add_argument("--client", choices=CLIENTS, help="load generator: fleetserve bench (default) or wrk, closed loop, "
                   "texts and rank workloads")
    p.add_argument("--wrk", help="the wrk executable (default: wrk on PATH)")
    p.add_argument("--instances", type=ints)
    p.add_argument("--concurrency", type=ints)
    p.add_argument("--replicas", type=ints)
    p.add_argument("--fleet-concurrency", type=ints)
    p.add_argument("--duration", type=float)
    p.add_argument("--budget-s", type=float)
    p.add_argument("--out", type=Path)
    p.add_argument("--home", type=Path)
    p.add_argument("--tree", type=Path, help="run build, replicas, gateway and generator from this source tree "
                   "(a folder holding fleetserve/, e.g. from gpu_prepare.py --tree) instead of this script's own")
    args = p.parse_args(argv)
    if args.tree is not None and not (args.tree / "fleetserve").is_dir():
        p.error(f"--tree {args.tree}: no fleetserve/ package there")
    cfg = RunConfig()
    if args.cpu_smoke:
        cfg = replace(cfg, model="tiny", backend="auto", device="cpu", precision="fp32", max_batch=32, max_seq=32,
                      rows=8, tokens=32, instances=(1, 2), concurrency=(2, 8), replicas=(1, 2), fleet_concurrency=(8,),
                      duration_s=1.5, warmup_s=0.5, raw_s=0.5, budget_s=150.0)
    overrides = {"model": args.model, "precision": args.precision, "max_batch": args.max_batch,
                 "workload": args.workload, "candidates": args.candidates, "seq_buckets": args.seq_buckets,
                 "phases": args.phases, "fleet_instances": args.fleet_instances,
                 "serve_args": None if args.serve_args is None else tuple(args.serve_args),
                 "gateway_workers": args.gateway_workers, "bench_processes": args.bench_processes,
                 "client": args.client, "wrk": args.wrk,
                 "gateway_args": None if args.gateway_args is None else tuple(args.gateway_args),
                 "instances": args.instances, "concurrency": args.concurrency,
                 "replicas": args.replicas,
                 "fleet_concurrency": args.fleet_concurrency, "duration_s": args.duration,
                 "budget_s": args.budget_s, "out": args.out, "home": args.home,
                 "tree": None if args.tree is None else str(args.tree.resolve())}
    return replace(cfg, **{k: v for k, v in overrides.items() if v is not None}), args


def main(argv: list[str] | None = None) -> int:
    cfg, args = parse_args(argv)
    cfg = replace(cfg, out=cfg.out.resolve(), home=cfg.home.resolve())
    os.environ["FLEETSERVE_HOME"] = str(cfg.home)
    cfg.out.mkdir(parents=True, exist_ok=True)
    if cfg.tree is not None:  # `python -m` puts the working folder first on the children's path
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (cfg.tree, os.environ.get("PYTHONPATH")) if p)
        os.chdir(cfg.tree)
    if args.raw:
        print(json.dumps(raw_engine(cfg)))
        return 0
    t0, deadline = time.monotonic(), Deadline(cfg.budget_s)
    gpu = GpuSampler()
    name = gpu.monitor.sample()[0].name if gpu.monitor is not None else "no GPU"
    results: dict[str, Any] = {"gpu": name, "config": asdict(cfg), "replica": [], "fleet": []}
    try:
        if args.seed_store:
            seed_store(cfg.model, cfg.home)
        results["build"] = run_build(cfg, deadline)
        print("build:", results["build"], flush=True)
        if "raw" in cfg.phases:
            raw = subprocess.run(raw_argv(cfg, list(sys.argv[1:] if argv is None else argv)), capture_output=True,
                                 text=True, timeout=min(120.0, deadline.left()))
            results["raw"] = json.loads(raw.stdout.strip().splitlines()[-1]) if raw.returncode == 0 else None
            if raw.returncode != 0:
                results["raw_error"] = raw.stderr[-1500:]
            print("raw:", results["raw"] or results["raw_error"], flush=True)
            save(cfg, results)
        if "replica" in cfg.phases:
            run_replica(cfg, deadline, gpu, results)
        if "fleet" in cfg.phases:
            run_fleet(cfg, deadline, gpu, results)
    finally:
        gpu.close()
        results["elapsed_s"] = time.monotonic() - t0
        save(cfg, results)
        text = markdown(results) if "build" in results else "no build\n"
        (cfg.out / "gpu_server.md").write_text(text)
        print(text, flush=True)
        tails = [f"==== {f.name}\n{f.read_text(errors='replace')[-4000:]}" for f in sorted(cfg.work.glob("*.log"))]
        (cfg.out / "servers.log").write_text("\n".join(tails) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
