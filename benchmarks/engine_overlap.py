"""Engine calls that overlap on a shared box, timed against processor sharing's prediction (issue 15).

The simulator runs a local fleet's engines on one host of the box's cores under processor sharing
(``fleetserve.sim.host``): with ``n`` single-threaded engines calling at once on ``c`` cores, each call takes
``max(1, n / c)`` times as long as alone. Here each engine is a process of its own, as each replica is: it loads
the engine ``fleetserve serve`` would (from the build cache, ``--threads`` intra-op threads) and, once every
process is ready, calls it back to back for ``--seconds`` on its shape (``short``: one row of ``--short-tokens``,
``long``: one row of ``--long-tokens``). One row per kind per mix (``--mixes``, e.g. ``short+long+long``): the
calls' median and p90 in ms, their ratio to the same kind alone, and processor sharing's ratio for the mix.

    .venv/bin/python benchmarks/engine_overlap.py --mixes short,long,short+long,short+long+long,short+long+long+long
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import statistics
import sys
import time
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Barrier
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fleetserve.engine.config import EngineConfig, Precision

from _common import cpu_model, markdown_table, nearest_rank

KINDS = ("short", "long")
START_TIMEOUT_S = 120.0  # for every engine process of a mix to load and reach the start


def calls(config: EngineConfig, threads: int, tokens: int, seconds: float, seed: int, start: Barrier,
          out: Connection) -> None:
    """One engine process: load, wait for the others, call back to back for ``seconds``; send the call times."""
    from fleetserve.engine.builder import build
    from fleetserve.sim.profiler import engine_inputs, feeds

    engine = build(config, quiet=True).load(threads)
    feed = feeds(engine_inputs(engine), 1, tokens, random.Random(seed))
    infer = engine.instance().infer
    for _ in range(3):
        infer(feed)
    start.wait()
    times: list[float] = []
    end = time.perf_counter() + seconds
    while (t0 := time.perf_counter()) < end:
        infer(feed)
        times.append(time.perf_counter() - t0)
    out.send(times)
    out.close()


def run_mix(mix: list[str], args: argparse.Namespace) -> dict[str, list[float]]:
    """Every process of ``mix`` at once; each kind's call times, pooled over its processes."""
    config = EngineConfig(model=args.model, precision=Precision(args.precision))
    # Bounded: an engine process that dies while loading breaks the barrier for the others instead of
    # leaving them (and this process, waiting for their times) blocked for good.
    start = mp.Barrier(len(mix), timeout=START_TIMEOUT_S)
    procs, pipes = [], []
    for i, kind in enumerate(mix):
        recv, send = mp.Pipe(duplex=False)
        tokens = args.short_tokens if kind == "short" else args.long_tokens
        p = mp.Process(target=calls, args=(config, args.threads, tokens, args.seconds, args.seed + i, start, send))
        p.start()
        send.close()
        procs.append(p)
        pipes.append((kind, recv))
    out: dict[str, list[float]] = {k: [] for k in mix}
    try:
        for kind, recv in pipes:
            out[kind] += recv.recv()
    except EOFError:
        codes = [p.join(timeout=START_TIMEOUT_S) or p.exitcode for p in procs]
        raise SystemExit(f"mix {'+'.join(mix)}: an engine process ended without its call times "
                         f"(exit codes {codes})") from None
    for p in procs:
        p.join(timeout=60)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mixes", default="short,long,short+long,short+long+long,short+long+long+long",
                    help="comma-separated mixes of engine processes, each kinds joined by + (short, long)")
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--precision", default="int8")
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads per engine (default: 1)")
    ap.add_argument("--short-tokens", type=int, default=32)
    ap.add_argument("--long-tokens", type=int, default=256)
    ap.add_argument("--seconds", type=float, default=8.0, help="per mix (default: 8)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    mixes = [m.split("+") for m in args.mixes.split(",") if m]
    if not mixes or any(k not in KINDS for m in mixes for k in m) or args.seconds <= 0 or args.threads < 1:
        ap.error(f"--mixes takes kinds {' and '.join(KINDS)} joined by +; --seconds and --threads positive")
    cores = os.cpu_count() or 1
    results = [(mix, run_mix(mix, args)) for mix in mixes]
    alone = {k: statistics.median(times[k]) for mix, times in results if len(mix) == 1 for k in mix}
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"# overlapping engine calls, {cores} cores ({cpu_model()}), {when}; {args.model} {args.precision}, "
          f"{args.threads} thread(s) each, short {args.short_tokens} / long {args.long_tokens} tokens, "
          f"{args.seconds:g} s a mix")
    rows = []
    for mix, times in results:
        share = max(1.0, len(mix) * args.threads / cores)
        for kind in dict.fromkeys(mix):
            t = times[kind]
            median, p90 = statistics.median(t), nearest_rank(t, 90)
            ratio = f"{median / alone[kind]:.2f}" if kind in alone else "—"
            rows.append(["+".join(mix), kind, str(len(t)), f"{median * 1e3:.2f}", f"{p90 * 1e3:.2f}", ratio,
                         f"{share:.2f}"])
    print(markdown_table(["mix", "kind", "calls", "median ms", "p90 ms", "median / alone", "processor sharing"],
                         rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
