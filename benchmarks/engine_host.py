"""CPU of the engine process per front-end batch (``serve --frontends N``), with an engine that costs nothing.

An :class:`~fleetserve.replica.engine_host.EngineHost` serves a no-op engine (it answers a 384-float embedding
per row at once) on a Unix socket; ``--clients`` processes, each holding ``--connections`` connections (a front
end's ``--frontend-batches``) on threads, send batches of ``--rows`` rows × ``--tokens`` tokens back to back for
``--duration`` seconds. Printed: batches/s, engine calls/s (batches merged per call), and the engine process's
CPU per batch (its own ``getrusage``, every thread): what one GPU's engine process can feed.

    python benchmarks/engine_host.py                      # 4 clients x 2 connections, 2 rows x 16 tokens
    python benchmarks/engine_host.py --rows 1 --clients 8
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import resource
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fleetserve.batching.observer import NullObserver  # noqa: E402
from fleetserve.engine.base import ShapeProfile, TensorSpec  # noqa: E402
from fleetserve.replica.engine_host import EngineHost  # noqa: E402
from fleetserve.replica.engine_link import RemoteEngine  # noqa: E402

INPUTS = (TensorSpec("input_ids", "INT64", (-1, -1), 30522), TensorSpec("attention_mask", "INT64", (-1, -1)))
OUTPUTS = (TensorSpec("sentence_embedding", "FP32", (-1, 384)),)
PROFILE = ShapeProfile(max_batch=128, max_seq=128, seq_buckets=(32, 128))


class _Instant:
    def infer(self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        return {"sentence_embedding": np.zeros((len(inputs["input_ids"]), 384), np.float32)}


class NoOpEngine:
    inputs = INPUTS
    outputs = OUTPUTS
    profile = PROFILE
    device = "cpu"

    def instance(self) -> _Instant:
        return _Instant()

    def close(self) -> None:
        pass


class Counter(NullObserver):
    def __init__(self) -> None:
        self.calls = 0
        self.batches = 0

    def on_batch(self, size: int, seq: int, queue_wait_s: list[float], compute_s: float) -> None:
        self.calls += 1
        self.batches += len(queue_wait_s)


def client(path: str, connections: int, rows: int, tokens: int, until: float) -> None:
    engine = RemoteEngine(path, INPUTS, OUTPUTS, PROFILE, "cpu")
    feeds = {"input_ids": np.ones((rows, tokens), np.int64), "attention_mask": np.ones((rows, tokens), np.int64)}

    def loop() -> None:
        instance = engine.instance()
        while time.monotonic() < until:
            instance.infer(feeds, ["sentence_embedding"])

    threads = [threading.Thread(target=loop) for _ in range(connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    engine.close()


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--connections", type=int, default=2)
    p.add_argument("--rows", type=int, default=2)
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--instances", type=int, default=1)
    p.add_argument("--duration", type=float, default=5.0)
    a = p.parse_args()
    counter = Counter()
    with tempfile.TemporaryDirectory() as directory:
        host = EngineHost(NoOpEngine(), os.path.join(directory, "engine.sock"), max_batch=128,
                          instances=a.instances, observer=counter)
        host.start()
        context = multiprocessing.get_context("spawn")
        until = time.monotonic() + 1.0 + a.duration  # the clients' imports take about a second
        procs = [context.Process(target=client, args=(host.path, a.connections, a.rows, a.tokens, until))
                 for _ in range(a.clients)]
        for proc in procs:
            proc.start()
        time.sleep(max(0.0, until - a.duration - time.monotonic()))
        c0, b0, k0, t0 = cpu_s(), counter.batches, counter.calls, time.monotonic()
        time.sleep(a.duration)
        c1, b1, k1, t1 = cpu_s(), counter.batches, counter.calls, time.monotonic()
        for proc in procs:
            proc.join()
        host.close(1.0)
    batches, calls, wall = b1 - b0, k1 - k0, t1 - t0
    print(f"| clients x connections | rows x tokens | batches/s | engine calls/s | batches per call | "
          f"engine-process CPU per batch |\n|---|---|---:|---:|---:|---:|\n"
          f"| {a.clients} x {a.connections} | {a.rows} x {a.tokens} | {batches / wall:,.0f} | {calls / wall:,.0f} | "
          f"{batches / max(calls, 1):.2f} | {(c1 - c0) / max(batches, 1) * 1e6:.0f} µs |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
