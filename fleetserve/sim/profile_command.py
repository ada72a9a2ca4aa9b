"""``fleetserve profile MODEL --out P.json``: measure what one engine instance and one replica cost here.

Builds the engine as ``fleetserve build`` would (same flags), times every (batch size, sequence length) on
one instance (:mod:`fleetserve.sim.profiler`), tokenizes the benchmark's text mix, measures the replica's and
the gateway's CPU per request and the replica's cold start with real processes (:mod:`fleetserve.sim.costs`;
``--no-costs`` skips that), and writes the profile JSON that ``fleetserve plan`` and the simulator read.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import shlex
import sys
import time
from pathlib import Path

from fleetserve.engine.command import add_engine_arguments, engine_config
from fleetserve.sim.profile import LengthMix, Profile
from fleetserve.sim.profiler import (
    ProfileConfig,
    default_seq_lengths,
    feeds,
    length_mix,
    measure_capacity,
    measure_grid,
)


def _sizes(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma list of integers, got {text!r}") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_engine_arguments(parser)
    parser.add_argument("--out", type=Path, required=True, help="where to write the profile JSON")
    parser.add_argument("--threads", type=int, default=0,
                        help="intra-op threads of the instance (0: all cores, as a one-instance replica uses)")
    parser.add_argument("--batch-sizes", type=_sizes, default=(), help="comma list (default: the engine's buckets)")
    parser.add_argument("--seq-lengths", type=_sizes, default=(), help="comma list (default: 16, 32, … max-seq)")
    parser.add_argument("--repeats", type=int, default=20, help="most timed runs per shape")
    parser.add_argument("--budget-s", type=float, default=2.0, help="timed seconds per shape after 3 runs")
    parser.add_argument("--no-costs", action="store_true",
                        help="skip measuring replica/gateway CPU per request and cold start (real processes)")
    parser.add_argument("--cost-duration-s", type=float, default=5.0, help="load seconds per CPU-cost phase")
    parser.add_argument("--cost-per-hour", type=float, help="price of one replica per hour, stored for plan")
    parser.add_argument("--name", default="", help="short label for tables (default: model/precision/device)")


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


def run(args: argparse.Namespace) -> int:
    from fleetserve.engine.builder import build
    from fleetserve.engine.onnxruntime import threads_per_instance
    from fleetserve.models.tokenizer import TextTokenizer

    config = ProfileConfig(repeats=args.repeats, min_repeats=min(3, args.repeats), budget_s=args.budget_s,
                           batch_sizes=args.batch_sizes, seq_lengths=args.seq_lengths)
    if args.threads < 0:
        raise ValueError(f"--threads must be >= 0, got {args.threads}")
    econf = engine_config(args)
    built = build(econf, quiet=True)
    threads = args.threads or threads_per_instance(1)
    engine = built.load(threads)
    shape = built.profile
    batch_sizes = config.batch_sizes or shape.batch_buckets
    seq_lengths = config.seq_lengths or default_seq_lengths(shape.max_seq)
    if max(batch_sizes) > shape.max_batch or max(seq_lengths) > shape.max_seq:
        raise ValueError(f"shapes must fit the engine: batch <= {shape.max_batch}, seq <= {shape.max_seq}")
    inputs = {s.name: ("int32" if s.datatype == "INT32" else "int64", s.value_limit) for s in engine.inputs}
    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    instance = engine.instance()
    service = measure_grid(instance.infer, inputs, batch_sizes, seq_lengths, config, progress=say)
    capacity = 1.0
    if engine.device != "cpu":
        middle = (batch_sizes[len(batch_sizes) // 2], seq_lengths[len(seq_lengths) // 2])
        feed = feeds(inputs, *middle, random.Random(config.seed))
        capacity = measure_capacity(lambda: engine.instance().infer, feed, config)
    notes = [f"engine {built.key}; {threads} intra-op thread(s)"]
    if built.model.tokenizer_path is not None:
        tok = TextTokenizer(built.model.tokenizer_path, shape.max_seq)
        mix = length_mix(lambda texts: [int(n) for n in tok.encode(texts).attention_mask.sum(axis=1)], config)
    else:
        mix = LengthMix.fixed(min(32, shape.max_seq))
        notes.append("no tokenizer: request mix fixed at 32 tokens")
    costs = None
    if not args.no_costs:
        from fleetserve.sim.costs import CostConfig, measure_costs

        serve_args = ["--precision", str(econf.precision), "--backend", econf.backend, "--device", econf.device,
                      "--max-batch", str(econf.max_batch)]
        if econf.max_seq:
            serve_args += ["--max-seq", str(econf.max_seq)]
        costs = asyncio.run(measure_costs(args.model, serve_args, CostConfig(duration_s=args.cost_duration_s)))
    else:
        notes.append("CPU costs and cold start not measured (--no-costs)")
    engine.close()
    profile = Profile(
        model=built.model.name, precision=str(econf.precision), backend=built.backend.name,
        device="cpu" if engine.device == "cpu" else "cuda", device_name=_device_name(engine.device),
        batch_sizes=tuple(batch_sizes), seq_lengths=tuple(seq_lengths), service=service, threads=threads,
        device_capacity=capacity, replica_cpu_s=costs.replica_cpu_s if costs else 0.0,
        gateway_cpu_s=costs.gateway_cpu_s if costs else 0.0, cold_start_s=costs.cold_start_s if costs else None,
        lengths=mix, seq_buckets=shape.seq_buckets, pad_to_bucket=engine.device != "cpu",
        cost_per_hour=args.cost_per_hour, measured_at=time.strftime("%Y-%m-%d %H:%M %Z"),
        command="fleetserve profile " + shlex.join(sys.argv[2:] if sys.argv[1:2] == ["profile"] else sys.argv[1:]),
        notes=tuple(notes), name=args.name,
    )
    profile.save(args.out)
    print(f"profile {profile.name}: {len(batch_sizes)} batch sizes x {len(seq_lengths)} lengths, "
          f"batch 1 at {seq_lengths[0]} tokens {service[0][0].mean_s * 1e3:.3f} ms, "
          f"replica CPU {profile.replica_cpu_s * 1e6:.0f} us/request, gateway CPU {profile.gateway_cpu_s * 1e6:.0f} "
          f"us/request, cold start {profile.cold_start_s or float('nan'):.2f} s -> {args.out}")
    return 0
