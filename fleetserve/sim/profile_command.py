"""``fleetserve profile MODEL --out P.json``: measure what one engine instance and one replica cost here.

Builds the engine as ``fleetserve build`` would (same flags), times every (batch size, sequence length) on
one instance (:mod:`fleetserve.sim.profiler`), tokenizes the benchmark's text mix, measures the replica's and
the gateway's CPU and wall time per request, the batcher's timer lag and the replica's cold start with real
processes (:mod:`fleetserve.sim.costs`; ``--no-costs`` skips that), and writes the profile JSON that ``fleetserve
plan`` and the simulator read.
"""

from __future__ import annotations

import asyncio
import functools
import os
import platform
import random
import shlex
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from fleetserve.engine.config import EngineConfig
from fleetserve.options import option, positive_ints, section
from fleetserve.sim.profile import LengthMix, Profile
from fleetserve.sim.profiler import (
    ProfileConfig,
    after_waits,
    default_seq_lengths,
    engine_inputs,
    feeds,
    idle_threshold,
    length_mix,
    measure_capacity,
    measure_grid,
)


@dataclass(frozen=True)
class ProfileOptions:
    engine: EngineConfig = section(EngineConfig)
    out: Path = option(Path("profile.json"), "where to write the profile JSON", metavar="P.json", required=True)
    threads: int = option(0, "intra-op threads of the instance", default_text="all cores, as one instance uses")
    batch_sizes: tuple[int, ...] = option((), "batch sizes to time, comma list", parse=positive_ints, repeat=False,
                                          metavar="N,N,...", default_text="the engine's batch buckets")
    seq_lengths: tuple[int, ...] = option((), "sequence lengths to time, comma list", parse=positive_ints, repeat=False,
                                          metavar="N,N,...", default_text="16, 32, ... up to max-seq")
    repeats: int = option(20, "most timed runs per shape")
    budget_s: float = option(2.0, "timed seconds per shape once 3 runs are in")
    costs: bool = option(True, "measure the replica's and gateway's CPU per request and the cold start "
                               "(starts a real replica and gateway)")
    cost_duration_s: float = option(5.0, "seconds of load per CPU-cost phase (twice that per low-load wall-time "
                                         "phase)")
    cost_per_hour: float | None = option(None, "price of one replica per hour, stored for plan",
                                         default_text="none")
    name: str = option("", "short label for tables", default_text="model/precision/device")

    def __post_init__(self) -> None:
        if self.threads < 0 or self.cost_duration_s <= 0:
            raise ValueError("--threads must be >= 0 and --cost-duration-s > 0")


OPTIONS = ProfileOptions


def _device_name(device: str) -> str:
    if device.startswith("cuda"):
        from fleetserve.telemetry.gpu import GpuMonitor

        monitor = GpuMonitor.create()
        samples = monitor.sample() if monitor is not None else []
        return samples[0].name if samples and samples[0].name else "GPU"
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores"


def run(options: ProfileOptions) -> int:
    from fleetserve.engine.builder import build
    from fleetserve.engine.onnxruntime import threads_per_instance
    from fleetserve.models.tokenizer import TextTokenizer

    config = ProfileConfig(repeats=options.repeats, min_repeats=min(3, options.repeats), budget_s=options.budget_s,
                           batch_sizes=options.batch_sizes, seq_lengths=options.seq_lengths)
    econf = options.engine
    built = build(econf, quiet=True)
    threads = options.threads or threads_per_instance(1)
    engine = built.load(threads)
    shape = built.profile
    batch_sizes = config.batch_sizes or shape.batch_buckets
    seq_lengths = config.seq_lengths or default_seq_lengths(shape.max_seq)
    if max(batch_sizes) > shape.max_batch or max(seq_lengths) > shape.max_seq:
        raise ValueError(f"shapes must fit the engine: batch <= {shape.max_batch}, seq <= {shape.max_seq}")
    inputs = engine_inputs(engine)

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    load_before = os.getloadavg()[0]
    service = measure_grid(engine.instance().infer, inputs, batch_sizes, seq_lengths, config, progress=say)
    small = (batch_sizes[0], seq_lengths[min(1, len(seq_lengths) - 1)])
    waited = after_waits(functools.partial(engine.instance().infer, feeds(inputs, *small, random.Random(config.seed))),
                         config)
    idle_after = idle_threshold(waited)
    say(f"batch {small[0]} seq {small[1]} after a wait of "
        + ", ".join(f"{g * 1e3:g} ms: {m * 1e3:.3f}" for g, m in waited.items())
        + f" ms (medians); a wait of {idle_after * 1e3:g} ms or more counts as idle")
    capacity = 1.0
    if engine.device != "cpu":
        middle = (batch_sizes[len(batch_sizes) // 2], seq_lengths[len(seq_lengths) // 2])
        feed = feeds(inputs, *middle, random.Random(config.seed))
        capacity = measure_capacity(lambda: engine.instance().infer, feed, config)
    notes = [f"engine {built.key}; {threads} intra-op thread(s); load average {load_before:.2f} before timing, "
             f"{os.getloadavg()[0]:.2f} after"]
    if built.model.tokenizer_path is not None:
        tok = TextTokenizer(built.model.tokenizer_path, shape.max_seq)

        def tokens(texts: list[str]) -> list[int]:
            return [int(n) for n in tok.encode(texts).attention_mask.sum(axis=1)]

        mix, short = length_mix(tokens, config), length_mix(tokens, config, long_fraction=0.0)
    else:
        mix = short = LengthMix.fixed(min(32, shape.max_seq))
        notes.append("no tokenizer: request mix fixed at 32 tokens")
    costs = None
    if options.costs:
        from fleetserve.sim.costs import CostConfig, measure_costs

        serve_args = ["--precision", str(econf.precision), "--backend", econf.backend, "--device", econf.device,
                      "--max-batch", str(econf.max_batch)]
        if econf.max_seq:
            serve_args += ["--max-seq", str(econf.max_seq)]
        costs = asyncio.run(measure_costs(econf.model, serve_args, CostConfig(duration_s=options.cost_duration_s,
                                                                            low_load_s=2 * options.cost_duration_s)))
    else:
        notes.append("CPU costs and cold start not measured (--no-costs)")
    engine.close()
    profile = Profile(
        model=built.model.name, precision=str(econf.precision), backend=built.backend.name,
        device="cpu" if engine.device == "cpu" else "cuda", device_name=_device_name(engine.device),
        batch_sizes=tuple(batch_sizes), seq_lengths=tuple(seq_lengths), service=service, threads=threads,
        device_capacity=capacity, replica_cpu_s=costs.replica_cpu_s if costs else 0.0,
        gateway_cpu_s=costs.gateway_cpu_s if costs else 0.0, replica_wall_s=costs.replica_wall_s if costs else 0.0,
        gateway_wall_s=costs.gateway_wall_s if costs else 0.0, timer_lag_s=costs.timer_lag_s if costs else 0.0,
        idle_after_s=idle_after,
        replica_busy_cpu_s=costs.replica_busy_cpu_s if costs else None,
        gateway_busy_cpu_s=costs.gateway_busy_cpu_s if costs else None,
        replica_cpu_curve=costs.replica_cpu_curve if costs else (),
        gateway_cpu_curve=costs.gateway_cpu_curve if costs else (),
        cold_start_s=costs.cold_start_s if costs else None,
        lengths=mix, seq_buckets=shape.seq_buckets, pad_to_bucket=engine.device != "cpu",
        cost_per_hour=options.cost_per_hour, measured_at=time.strftime("%Y-%m-%d %H:%M %Z"),
        command="fleetserve profile " + shlex.join(sys.argv[2:] if sys.argv[1:2] == ["profile"] else sys.argv[1:]),
        notes=tuple(notes), name=options.name,
    )
    if costs is not None and costs.served_compute_s is not None:
        rows = max(1, round(costs.served_rows))
        alone = sum(w * profile.timing(rows, v, idle=True)[0] for v, w in zip(short.values, short.weights,
                                                                               strict=True)) / sum(short.weights)
        profile = replace(profile, served_factor=costs.served_compute_s / alone)
    profile.save(options.out)
    for who, curve in (("replica", profile.replica_cpu_curve), ("gateway", profile.gateway_cpu_curve)):
        if curve:
            print(f"{who} CPU per request at " + "/".join(str(k) for k, _ in curve) + " in flight: "
                  + "/".join(f"{c * 1e6:.0f}" for _, c in curve) + " us", file=sys.stderr, flush=True)
    cold = f"{profile.cold_start_s:.2f} s" if profile.cold_start_s is not None else "not measured"
    print(f"profile {profile.name}: {len(batch_sizes)} batch sizes x {len(seq_lengths)} lengths, "
          f"batch 1 at {seq_lengths[0]} tokens {service[0][0].mean_s * 1e3:.3f} ms, "
          f"replica CPU {profile.replica_cpu_s * 1e6:.0f} us/request ({profile.replica_loaded_cpu_s * 1e6:.0f} busy), "
          f"gateway CPU {profile.gateway_cpu_s * 1e6:.0f} us/request ({profile.gateway_loaded_cpu_s * 1e6:.0f} busy), "
          f"wall at low load: replica {profile.replica_wall_s * 1e6:.0f} us, gateway "
          f"{profile.gateway_wall_s * 1e6:.0f} us, timer lag {profile.timer_lag_s * 1e6:.0f} us, engine calls in "
          f"service {profile.served_factor:.2f}x the timing alone; cold start {cold} "
          f"-> {options.out}")
    return 0
