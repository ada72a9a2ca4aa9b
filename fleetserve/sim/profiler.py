"""``fleetserve profile``'s measurements: one engine instance's service time per (batch size, sequence length).

Method: the engine is built (or found in the cache) exactly as ``fleetserve serve`` would, loaded with ``threads``
intra-op threads, and each shape runs on one instance with token ids drawn like the load generator's (``[CLS] ids…
[SEP]``, attention mask of ones): ``warmup`` untimed calls and one more that sizes the shape's runs (``repeats``, or
as many as fit in ``budget_s``, at least ``min_repeats``). Shapes are the engine's batch buckets up to ``max_batch``
× sequence lengths from 16 to ``max_seq`` (doubling). Each call is timed with ``perf_counter`` around ``infer`` (the
same span the batcher's compute metric measures, minus padding and splitting). Each shape is timed twice: calls back
to back (a busy replica) and calls that each follow ``idle_gap_s`` of sleep (a replica at low load, whose engine
thread waits between requests: the core idles or runs other work, and the next call starts with cooled caches and a
core waking up). The shapes take turns: each of ``rounds`` rounds runs every shape's share of its calls, so every
figure spans the whole measurement. A shared machine's speed drifts (the development VM: batch 1 at 32 tokens in
5-second medians from 0.91 to 1.10 times its profiled time within three minutes, with nothing else running), and a
shape timed in one go, its 20 small calls inside 40 ms, took whatever speed that moment had: two profiles ten
minutes apart differed by up to 32% on one shape (BENCHMARKS.md §8.2). A short wait does not cost the after-idle
penalty: :func:`after_waits` times one small shape after waits from half a millisecond to ``idle_gap_s``, and
:func:`idle_threshold` finds the shortest wait that costs at least half the after-idle penalty (on the 2-core
development VM, batch 1 at 32 tokens: within 3% of back to back after waits up to 5 ms, +13% after 10 and 20 ms),
which the simulator takes as the start of an idle spell. On a GPU, ``device_capacity`` comes from running 1, 2 and 4
instances at once on one mid-sized shape: the best aggregate throughput over one instance's.

The request mix is the load generator's ``texts`` workload tokenized by the model's own tokenizer (truncated
at ``max_seq``), so simulated batches pad to the lengths real ones do. Per-request CPU costs of the replica
and the gateway come from :mod:`fleetserve.sim.costs`.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import math
import random
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from fleetserve.bench.workloads import WorkloadConfig, make_payloads, token_ids
from fleetserve.sim.profile import LengthMix, ShapeTiming

if TYPE_CHECKING:
    from fleetserve.engine.base import Engine

MIN_SEQ = 16


@dataclass(frozen=True)
class ProfileConfig:
    repeats: int = 20
    min_repeats: int = 3
    warmup: int = 2
    budget_s: float = 2.0  # timed seconds per shape (beyond min_repeats)
    batch_sizes: tuple[int, ...] = ()  # empty: the engine's batch buckets
    seq_lengths: tuple[int, ...] = ()  # empty: 16, 32, ... up to max_seq
    mix_texts: int = 2000
    idle_gap_s: float = 0.02  # sleep before each "after idle" call: well past the batcher's max delay
    short_gaps_s: tuple[float, ...] = (0.0005, 0.001, 0.002, 0.005, 0.01)  # waits tried by after_waits
    gap_rounds: int = 12  # rounds of after_waits, each timing two calls after every wait
    rounds: int = 5  # rounds of measure_grid: the shapes take turns, each running its share of calls per round
    seed: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.min_repeats <= self.repeats:
            raise ValueError("profile needs 1 <= min_repeats <= repeats")
        if (self.warmup < 0 or self.budget_s <= 0 or self.mix_texts < 1 or self.idle_gap_s < 0
                or min(self.gap_rounds, self.rounds) < 1):
            raise ValueError("profile warmup must be >= 0, budget_s > 0, mix_texts >= 1, idle_gap_s >= 0, "
                             "gap_rounds >= 1 and rounds >= 1")
        if any(not 0 < g < self.idle_gap_s for g in self.short_gaps_s):
            raise ValueError("profile short gaps must lie between 0 and idle_gap_s")
        if any(b < 1 for b in self.batch_sizes) or any(s < 2 for s in self.seq_lengths):
            raise ValueError("profile batch sizes must be >= 1 and sequence lengths >= 2")


def default_seq_lengths(max_seq: int) -> tuple[int, ...]:
    lengths, s = [], MIN_SEQ
    while s < max_seq:
        lengths.append(s)
        s *= 2
    return (*lengths, max_seq)


Inputs = Mapping[str, tuple[str, int | None]]  # input name -> (numpy dtype, exclusive upper bound of values)


def engine_inputs(engine: Engine) -> Inputs:
    """An engine's inputs as :func:`feeds` takes them: each name with its numpy dtype and value bound."""
    return {s.name: ("int32" if s.datatype == "INT32" else "int64", s.value_limit) for s in engine.inputs}


def feeds(inputs: Inputs, rows: int, seq: int, rng: random.Random) -> dict[str, np.ndarray]:
    """Inputs of ``rows`` × ``seq`` for an encoder: token ids like the load generator's, a full mask."""
    out: dict[str, np.ndarray] = {}
    for name, (dtype, limit) in inputs.items():
        if name == "input_ids":
            ids = token_ids(rng, seq, rows)
            out[name] = (ids % limit if limit else ids).astype(dtype)
        elif name == "attention_mask":
            out[name] = np.ones((rows, seq), dtype=dtype)
        else:
            out[name] = np.zeros((rows, seq), dtype=dtype)
    return out


def timing_of(samples: list[float]) -> ShapeTiming:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    std = statistics.stdev(samples) if len(samples) > 1 else 0.0
    return ShapeTiming(statistics.fmean(samples), std, statistics.median(samples), p99, len(samples))


def measure_grid(
    instance_infer: Callable[[dict[str, np.ndarray]], object], inputs: Inputs,
    batch_sizes: tuple[int, ...], seq_lengths: tuple[int, ...], config: ProfileConfig,
    progress: Callable[[str], None] = lambda _: None, clock: Callable[[], float] = time.perf_counter,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[tuple[ShapeTiming, ...], ...]:
    """Every shape's timing, back to back and after idling, its calls spread over ``config.rounds`` rounds in
    which the shapes take turns (the module's method)."""
    rng = random.Random(config.seed)
    shapes = [(b, s) for b in batch_sizes for s in seq_lengths]
    calls = {shape: functools.partial(instance_infer, feeds(inputs, *shape, rng)) for shape in shapes}
    runs: dict[tuple[int, int], int] = {}
    for shape, call in calls.items():
        for _ in range(config.warmup):
            call()
        t0 = clock()
        call()
        first = max(clock() - t0, 1e-9)
        runs[shape] = max(config.min_repeats, min(config.repeats, math.ceil(config.budget_s / first)))
    hot: dict[tuple[int, int], list[float]] = {shape: [] for shape in shapes}
    idle: dict[tuple[int, int], list[float]] = {shape: [] for shape in shapes}
    for r in range(config.rounds):
        for shape, call in calls.items():
            share = runs[shape] * (r + 1) // config.rounds - runs[shape] * r // config.rounds
            for samples, gap in ((hot[shape], 0.0), (idle[shape], config.idle_gap_s)):
                for _ in range(share):
                    if gap:
                        sleep(gap)
                    t0 = clock()
                    call()
                    samples.append(clock() - t0)
    rows: list[tuple[ShapeTiming, ...]] = []
    for b in batch_sizes:
        row = []
        for s in seq_lengths:
            back, after = timing_of(hot[b, s]), timing_of(idle[b, s])
            progress(f"batch {b:>4} seq {s:>4}: mean {back.mean_s * 1e3:8.3f} ms  std {back.std_s * 1e3:7.3f} ms"
                     f"  ({back.n} runs); after idling {after.mean_s * 1e3:8.3f} ms  std {after.std_s * 1e3:7.3f} ms")
            row.append(dataclasses.replace(back, idle_mean_s=after.mean_s, idle_std_s=after.std_s))
        rows.append(tuple(row))
    return tuple(rows)


def after_waits(call: Callable[[], object], config: ProfileConfig, clock: Callable[[], float] = time.perf_counter,
                sleep: Callable[[float], None] = time.sleep) -> dict[float, float]:
    """Median time of ``call`` after each wait: none (back to back), ``config.short_gaps_s`` and ``idle_gap_s``.
    The waits take turns within each of ``gap_rounds`` rounds, so a drift of the machine's speed during the
    measurement reaches all of them alike."""
    gaps = (0.0, *config.short_gaps_s, config.idle_gap_s)
    for _ in range(config.warmup):
        call()
    samples: dict[float, list[float]] = {g: [] for g in gaps}
    for _ in range(config.gap_rounds):
        for gap in gaps:
            for _ in range(2):
                if gap:
                    sleep(gap)
                t0 = clock()
                call()
                samples[gap].append(clock() - t0)
    return {g: statistics.median(v) for g, v in samples.items()}


def idle_threshold(medians: dict[float, float]) -> float:
    """The shortest wait of :func:`after_waits` whose median exceeds the back-to-back one by at least half of what
    the longest wait adds; 0.0 when that adds nothing (then every wait may count as idle)."""
    gaps = sorted(medians)
    penalty = medians[gaps[-1]] - medians[0.0]
    if penalty <= 0:
        return 0.0
    return next(g for g in gaps[1:] if medians[g] - medians[0.0] >= penalty / 2)


def measure_capacity(make_infer: Callable[[], Callable[[dict[str, np.ndarray]], object]],
                     feed: dict[str, np.ndarray], config: ProfileConfig, counts: tuple[int, ...] = (1, 2, 4)) -> float:
    """Aggregate throughput of k instances running at once, over one instance's, at the best k."""
    rates: dict[int, float] = {}
    for k in counts:
        infers = [make_infer() for _ in range(k)]
        for infer in infers:
            infer(feed)
        calls = max(config.min_repeats, config.repeats // 2)

        def repeat(infer: Callable[[dict[str, np.ndarray]], object], n: int = calls) -> None:
            for _ in range(n):
                infer(feed)

        with concurrent.futures.ThreadPoolExecutor(k) as pool:
            t0 = time.perf_counter()
            list(pool.map(repeat, infers))
            rates[k] = k * calls / (time.perf_counter() - t0)
    return max(rates.values()) / rates[counts[0]]


def length_mix(tokenize: Callable[[list[str]], list[int]], config: ProfileConfig,
               long_fraction: float = WorkloadConfig.long_fraction) -> LengthMix:
    """Token counts of the load generator's ``texts`` workload (``long_fraction`` of them long) under the model's
    tokenizer."""
    import json

    payloads = make_payloads(WorkloadConfig(name="texts", pool_size=config.mix_texts, long_fraction=long_fraction),
                             random.Random(config.seed))
    texts = [json.loads(p.body)["texts"][0] for p in payloads]
    return LengthMix.from_samples(tokenize(texts))
