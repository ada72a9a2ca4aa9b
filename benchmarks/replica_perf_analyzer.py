"""Drive a fleetserve replica with NVIDIA's ``perf_analyzer`` (part of ``benchmarks/replica.py``).

perf_analyzer (the binary in the ``tritonclient==2.50.0`` wheel; it needs ``libb64-0d`` from Debian and
``nvidia-cuda-runtime-cu12``'s lib dir on ``LD_LIBRARY_PATH``, so it lives in its own venv) sends KServe v2
requests with token-id tensors of the benchmark's length mix (``--input-data``, 64 rows cycled).

Before it sends anything it asks for the model's configuration, a Triton extension outside KServe v2
(``GET /v2/models/{m}/config``; gRPC ``ModelConfig``). When the replica does not answer it, perf_analyzer
talks to a small pass-through proxy in this process that answers that one call and forwards the rest;
the report says so, because the extra hop makes the replica look slower than it is.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from fleetserve.bench.workloads import token_count

FORWARDED = ("content-type", "inference-header-content-length")


def model_config(model: str, max_batch: int) -> dict[str, Any]:
    """The minilm engine described the way Triton's model-configuration extension does."""
    seq_inputs = ("input_ids", "attention_mask", "token_type_ids")
    return {
        "name": model, "platform": "onnxruntime_onnx", "max_batch_size": max_batch, "dynamic_batching": {},
        "input": [{"name": n, "data_type": "TYPE_INT64", "dims": [-1]} for n in seq_inputs],
        "output": [{"name": "last_hidden_state", "data_type": "TYPE_FP32", "dims": [-1, 384]},
                   {"name": "sentence_embedding", "data_type": "TYPE_FP32", "dims": [384]}],
    }


def _has_config(url: str, model: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/v2/models/{model}/config", timeout=5) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


async def _config_proxy(upstream: str, config: dict[str, Any]) -> tuple[web.AppRunner, str]:
    session = aiohttp.ClientSession()

    async def handle(request: web.Request) -> web.Response:
        if request.path.endswith("/config"):
            return web.json_response(config)
        headers = {k: v for k, v in request.headers.items() if k.lower() in FORWARDED}
        async with session.request(request.method, upstream + request.path_qs, data=await request.read(),
                                   headers=headers) as r:
            back = {k: v for k, v in r.headers.items() if k.lower() in FORWARDED}
            return web.Response(body=await r.read(), status=r.status, headers=back)

    async def close(_: web.Application) -> None:
        await session.close()

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    app.on_cleanup.append(close)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


def input_data(path: Path, seed: int, long_fraction: float, max_seq: int) -> None:
    rng = random.Random(seed)
    rows = []
    for _ in range(64):
        length = min(max_seq - 2, token_count(rng, long_fraction))
        ids = [101, *(rng.randrange(1000, 30000) for _ in range(length)), 102]
        rows.append({"input_ids": {"content": ids, "shape": [len(ids)]},
                     "attention_mask": {"content": [1] * len(ids), "shape": [len(ids)]},
                     "token_type_ids": {"content": [0] * len(ids), "shape": [len(ids)]}})
    path.write_text(json.dumps({"data": rows}))


async def run_perf_analyzer(
    binary: Path, url: str, model: str, workdir: Path, *, max_batch: int, seed: int, concurrency: tuple[int, ...]
) -> dict[str, Any]:
    """Run perf_analyzer at each ``concurrency`` and return its command, summary lines and full report."""
    if not binary.exists():
        return {"skipped": f"{binary} not found (pip install tritonclient==2.50.0 into its own venv)"}
    data = workdir / "perf_analyzer_input.json"
    input_data(data, seed, 0.1, 256)
    runner, target, path = None, url, "direct"
    if not _has_config(url, model):
        runner, target = await _config_proxy(url, model_config(model, max_batch))
        path = (f"through a pass-through proxy that answers GET /v2/models/{model}/config (the replica lacks "
                "Triton's model-configuration extension); the extra hop understates the replica")
    cuda = next(binary.parent.parent.glob("lib/python3*/site-packages/nvidia/cuda_runtime/lib"), None)
    env = {**os.environ, "LD_LIBRARY_PATH": str(cuda or "")}
    summary: list[str] = []
    reports: list[str] = []
    commands: list[str] = []
    try:
        for c in concurrency:
            cmd = [str(binary), "-m", model, "-i", "http", "-u", target.removeprefix("http://"), "--input-data",
                   str(data), "--concurrency-range", str(c), "--measurement-interval", "4000", "--max-trials", "6",
                   "--stability-percentage", "50"]
            proc = await asyncio.create_subprocess_exec(
                *cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env
            )
            out = (await asyncio.wait_for(proc.communicate(), 180))[0].decode()
            commands.append(" ".join(cmd))
            reports.append(out)
            summary += [line.strip() for line in out.splitlines() if line.startswith("Concurrency:")]
    finally:
        if runner is not None:
            await runner.cleanup()
    return {"commands": commands, "path": path, "summary": summary, "reports": reports}
