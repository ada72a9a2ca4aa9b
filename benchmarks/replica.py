"""Replica benchmark: fleetserve's batcher and padding modes against NVIDIA PyTriton, one run, this machine.

Six servers of the ``minilm`` int8 engine, one after the other, each one instance with the same threads,
max batch and max delay, answer the same text-length mix (most texts 5–30 tokens, 10 % 100–300):

    (a)  fleetserve, sequence buckets + length grouping (``--padding bucket``, the default)
    (a-promote) (a) with ``--promote-overdue``: overdue short requests ride, padded up, in a long batch
    (b)  fleetserve, every request truncated and padded to 128 tokens (``--padding fixed``)
    (b') fleetserve, a batch padded to its longest request, no grouping (``--padding longest``)
    (c)  fleetserve, batching off (``--max-batch 1 --max-delay-ms 0``)
    (d)  NVIDIA PyTriton (``benchmarks/pytriton_server.py``): Triton's dynamic batcher, the same ONNX file

fleetserve gets ``POST /inference {"texts": [t]}``; Triton gets the same text as a KServe v2 ``BYTES``
tensor. Both tokenize on the server and return one 384-float embedding as JSON. Each setup runs closed
loop at concurrency 1, 8, 32, 64, then open loop (Poisson arrivals, at most ``--max-inflight``
outstanding, latency from the scheduled send time) at the same absolute rates for every setup: fractions
of the first setup's (by default (a)'s) best closed-loop throughput. Every point records the generator's,
the server's and everyone else's CPU (this is a shared 2-core box); a point where others used more than
``--noisy-cores`` is run again once and the quieter attempt kept. ``perf_analyzer`` (tritonclient 2.50.0,
its own venv) then drives (a) over KServe v2 HTTP with token-id tensors of the same mix.

    .venv/bin/python benchmarks/replica.py --out replica.json            # about 10 minutes
    .venv/bin/python benchmarks/replica.py --setups a,c --duration 5      # a quick look

PyTriton and perf_analyzer live in their own venvs (see ``pytriton_server.py`` and ``--perf-analyzer``);
a setup whose tool is missing is skipped with a note.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import random
import subprocess
import sys
import sysconfig
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from replica_load import LoadSettings, measure
from replica_perf_analyzer import run_perf_analyzer
from replica_report import label, progress, ratios, tables

from fleetserve.bench.workloads import Payload, sentence, token_count
from fleetserve.deploy.local import free_port
from fleetserve.models.store import ModelStore

from _common import NotReady, cpu_model, http_get, scrape, stop_process, wait_ready

HERE = Path(__file__).resolve().parent
MODEL = "minilm"
MAX_SEQ = 256  # the minilm engine's profile
SETUPS: dict[str, tuple[str, tuple[str, ...]]] = {
    "a": ("fleetserve, buckets + length grouping", ("--padding", "bucket")),
    "a-promote": ("fleetserve, (a) with overdue promotion", ("--padding", "bucket", "--promote-overdue")),
    "b": ("fleetserve, fixed 128 tokens", ("--padding", "fixed", "--fixed-seq", "128")),
    "b'": ("fleetserve, padded to longest in batch", ("--padding", "longest")),
    "c": ("fleetserve, batching off", ("--max-batch", "1", "--max-delay-ms", "0")),
    "d": ("NVIDIA PyTriton, dynamic batcher", ()),
}
OPEN_FRACTIONS = (0.3, 0.6, 0.9)


@dataclass
class Server:
    setup: str
    popen: subprocess.Popen[bytes]
    url: str
    triton: bool

    def payload(self, text: str) -> Payload:
        """One text as this server's request: ``/inference`` for fleetserve, a v2 BYTES tensor for Triton."""
        if self.triton:
            body = {"inputs": [{"name": "text", "shape": [1, 1], "datatype": "BYTES", "data": [text]}]}
            return Payload(f"/v2/models/{MODEL}/infer", json.dumps(body).encode())
        return Payload("/inference", json.dumps({"texts": [text]}).encode())

    def embed(self, text: str) -> np.ndarray:
        body = self.payload(text)
        req = urllib.request.Request(self.url + body.path, body.body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            result = json.loads(r.read())
        return np.asarray(result["outputs"][0]["data"] if self.triton else result["embeddings"][0])

    def counters(self) -> tuple[float, float, float, float]:
        """(engine calls, rows, padded-sequence sum, sequence count) so far, from the server's own stats."""
        if self.triton:
            stats = json.loads(http_get(f"{self.url}/v2/models/{MODEL}/stats")[1] or b"{}")
            model = (stats.get("model_stats") or [{}])[0]
            return float(model.get("execution_count", 0)), float(model.get("inference_count", 0)), 0.0, 0.0
        found = scrape(self.url)
        names = ("batch_size_count", "batch_size_sum", "batch_sequence_length_sum", "batch_sequence_length_count")
        calls, rows, padded, sequences = (found.get(f"fleetserve_{name}", 0.0) for name in names)
        return calls, rows, padded, sequences

    def stop(self) -> None:
        stop_process(self.popen, 30.0, kill_group=True)


def start_server(setup: str, args: argparse.Namespace, engine: Path, tokenizer: Path, logs: Path) -> Server:
    port = free_port()
    common = ["--max-batch", str(args.max_batch), "--max-delay-ms", str(args.max_delay_ms), "--threads",
              str(args.threads)]
    env = dict(os.environ)
    if setup == "d":
        cmd = [args.pytriton_python, str(HERE / "pytriton_server.py"), "--onnx", str(engine), "--tokenizer",
               str(tokenizer), "--http-port", str(port), "--grpc-port", str(free_port()), "--metrics-port",
               str(free_port()), "--max-seq", str(MAX_SEQ), *common]
        # Triton's python backend stub loads libpython at run time.
        env["LD_LIBRARY_PATH"] = f"{sysconfig.get_config_var('LIBDIR')}:{env.get('LD_LIBRARY_PATH', '')}"
        ready = f"/v2/models/{MODEL}/ready"
    else:
        cmd = [sys.executable, "-m", "fleetserve.cli", "serve", MODEL, "--precision", "int8", "--host", "127.0.0.1",
               "--port", str(port), "--grpc-port", "0", "--instances", "1", "--drain-grace-s", "0", *common,
               *SETUPS[setup][1]]
        ready = "/v2/health/ready"
    log = logs / f"server-{setup.replace(chr(39), 'p')}.log"
    with log.open("wb") as out:
        popen = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    server = Server(setup, popen, f"http://127.0.0.1:{port}", setup == "d")
    try:
        wait_ready(lambda: http_get(server.url + ready)[0] == 200, [popen], 180.0, f"setup {setup}", poll_s=0.2)
    except NotReady as exc:
        server.stop()
        raise RuntimeError(f"{exc}; log {log}:\n{log.read_text()[-3000:]}") from None
    return server


def make_texts(n: int, seed: int, long_fraction: float) -> list[str]:
    rng = random.Random(seed)
    return [sentence(rng, token_count(rng, long_fraction)) for _ in range(n)]


def token_mix(texts: list[str], tokenizer: Path) -> dict[str, Any]:
    """What the texts are once tokenized (truncated at the engine's maximum), to check the mix."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer))
    tok.no_padding()
    tok.enable_truncation(MAX_SEQ)
    lengths = np.array([len(e.ids) for e in tok.encode_batch(texts)])
    return {
        "texts": len(texts), "mean": float(lengths.mean()), "p50": float(np.median(lengths)),
        "p90": float(np.percentile(lengths, 90)), "max": int(lengths.max()),
        "share_at_most": {str(e): round(float(np.mean(lengths <= e)), 3) for e in (16, 32, 64, 128, 256)},
    }


async def sweep(
    server: Server, texts: list[str], settings: LoadSettings, concurrency: tuple[int, ...], rates: list[float],
    points: list[dict[str, Any]],
) -> list[float]:
    """Closed loop at each concurrency, then open loop at ``rates`` (if empty: fractions of the best
    closed-loop throughput just measured, returned for the next setups)."""
    payloads = [server.payload(t) for t in texts]

    async def one(concurrency: int | None = None, rate: float | None = None) -> float:
        found = await measure(server.url, payloads, server.popen.pid, server.counters, settings,
                              concurrency=concurrency, rate=rate)
        points.append({"setup": server.setup, **found})
        print(progress(server.setup, found), file=sys.stderr, flush=True)
        return float(found["throughput_rps"])

    best = max([await one(concurrency=c) for c in concurrency], default=0.0)
    rates = rates or [float(round(f * best)) for f in OPEN_FRACTIONS if round(f * best) > 0]
    for r in rates:
        await one(rate=r)
    return rates


async def run(args: argparse.Namespace) -> dict[str, Any]:
    build = [sys.executable, "-m", "fleetserve.cli", "build", MODEL, "--precision", "int8", "--json"]
    built = json.loads(subprocess.run(build, check=True, capture_output=True, text=True).stdout)
    engine = Path(built["path"]) / "model.onnx"
    tokenizer = ModelStore().resolve(MODEL).tokenizer_path
    assert tokenizer is not None
    texts = make_texts(args.pool, args.seed, args.long_fraction)
    probes = [t for t in texts if len(t.split()) <= 30][:4]  # short, so fixed-128 truncation cannot differ
    logs = Path(tempfile.mkdtemp(prefix="fleetserve-replica-bench-"))
    settings = LoadSettings(args.duration, args.warmup, args.max_inflight, args.noisy_cores, seed=args.seed)
    result: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "loadavg_at_start": os.getloadavg()},
        "command": " ".join(["python", *sys.argv]),
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "engine": {"path": str(engine), "method": built.get("method"), "profile": built.get("profile")},
        "token_mix": token_mix(texts, tokenizer), "points": [], "skipped": {}, "embedding_check": {},
        "logs": str(logs),
    }
    rates = list(args.rates)
    reference: list[np.ndarray] = []
    for setup in args.setups:
        if setup == "d" and not Path(args.pytriton_python).exists():
            result["skipped"]["d"] = f"{args.pytriton_python} not found; see benchmarks/pytriton_server.py"
            continue
        print(f"== {label(setup)} {SETUPS[setup][0]}", file=sys.stderr, flush=True)
        server = start_server(setup, args, engine, tokenizer, logs)
        try:
            vectors = [server.embed(t) for t in probes]
            reference = reference or vectors
            result["embedding_check"][setup] = min(
                float(v @ r / (np.linalg.norm(v) * np.linalg.norm(r))) for v, r in zip(vectors, reference, strict=True)
            )
            rates = await sweep(server, texts, settings, args.concurrency, rates, result["points"])
            if setup == "a" and args.perf_analyzer:
                print("== perf_analyzer against (a)", file=sys.stderr, flush=True)
                result["perf_analyzer"] = await run_perf_analyzer(
                    Path(args.perf_analyzer), server.url, MODEL, logs, seed=args.seed,
                    concurrency=(1, 32),
                )
        finally:
            server.stop()
    result["ratios"] = ratios(result["points"])
    return result


def parse_args() -> argparse.Namespace:
    def numbers(kind: type[float] | type[int]) -> Any:
        return lambda text: tuple(kind(x) for x in text.split(",") if x.strip())

    def setups(text: str) -> tuple[str, ...]:
        names = tuple(x.strip() for x in text.split(",") if x.strip())
        if unknown := [n for n in names if n not in SETUPS]:
            raise argparse.ArgumentTypeError(f"unknown setups {unknown}; choose from {list(SETUPS)}")
        return names

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--setups", type=setups, default=tuple(SETUPS), help="comma list of " + ",".join(SETUPS))
    p.add_argument("--concurrency", type=numbers(int), default=(1, 8, 32, 64))
    p.add_argument("--rates", type=numbers(float), default=(), help="open-loop req/s (default 0.3/0.6/0.9 × best)")
    p.add_argument("--duration", type=float, default=10.0, help="measured seconds per point")
    p.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds before each point")
    p.add_argument("--threads", type=int, default=2, help="engine intra-op threads, every setup")
    p.add_argument("--max-batch", type=int, default=32)
    p.add_argument("--max-delay-ms", type=float, default=2.0)
    p.add_argument("--max-inflight", type=int, default=256, help="open-loop bound on outstanding requests")
    p.add_argument("--long-fraction", type=float, default=0.1, help="share of 100–300-token texts")
    p.add_argument("--pool", type=int, default=512, help="distinct texts, cycled")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--noisy-cores", type=float, default=0.3, help="run a point again if others used more CPU")
    p.add_argument("--pytriton-python", default="/tmp/pytriton-venv/bin/python")
    p.add_argument("--perf-analyzer", default="/tmp/pa-venv/bin/perf_analyzer", help="'' skips it")
    p.add_argument("--out", type=Path, help="write the full result as JSON")
    return p.parse_args()


def report(result: dict[str, Any]) -> str:
    m = result["machine"]
    lines = [
        f"## Replica benchmark, {result['date']}",
        f"{m['cpu']}, {m['cores']} cores; load average at start {', '.join(f'{x:.2f}' for x in m['loadavg_at_start'])}",
        f"`{result['command']}`",
        f"Token mix (tokenized): {json.dumps(result['token_mix'])}",
        tables(result["points"], result["ratios"]),
        f"Embedding check, min cosine vs the first setup on short texts: {json.dumps(result['embedding_check'])}",
    ]
    if result["skipped"]:
        lines.append(f"Skipped: {json.dumps(result['skipped'])}")
    pa = result.get("perf_analyzer")
    if pa:
        body = pa.get("skipped") or f"Path: {pa['path']}\n\n```\n" + "\n".join(pa["summary"]) + "\n```"
        lines.append(f"### perf_analyzer against (a)\n\n{body}")
    return "\n\n".join(lines)


def main() -> None:
    args = parse_args()
    factory: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop
    with contextlib.suppress(ImportError):
        import uvloop

        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        result = runner.run(run(args))
    print(report(result))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
