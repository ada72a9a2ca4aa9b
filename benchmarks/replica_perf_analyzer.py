"""Drive a fleetserve replica with NVIDIA's ``perf_analyzer`` (part of ``benchmarks/replica.py``).

perf_analyzer (the binary in the ``tritonclient==2.50.0`` wheel; it needs ``libb64-0d`` from Debian and
``nvidia-cuda-runtime-cu12``'s lib dir on ``LD_LIBRARY_PATH``, so it lives in its own venv) sends KServe v2
requests with token-id tensors of the benchmark's length mix (``--input-data``, 64 rows cycled).

Before it sends anything it reads the model's configuration (Triton's ``GET /v2/models/{m}/config``),
which the replica serves.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
from pathlib import Path
from typing import Any

from fleetserve.bench.workloads import token_count


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
    binary: Path, url: str, model: str, workdir: Path, *, seed: int, concurrency: tuple[int, ...]
) -> dict[str, Any]:
    """Run perf_analyzer at each ``concurrency`` and return its command, summary lines and full report."""
    if not binary.exists():
        return {"skipped": f"{binary} not found (pip install tritonclient==2.50.0 into its own venv)"}
    data = workdir / "perf_analyzer_input.json"
    input_data(data, seed, 0.1, 256)
    cuda = next(binary.parent.parent.glob("lib/python3*/site-packages/nvidia/cuda_runtime/lib"), None)
    env = {**os.environ, "LD_LIBRARY_PATH": str(cuda or "")}
    summary: list[str] = []
    reports: list[str] = []
    commands: list[str] = []
    for c in concurrency:
        cmd = [str(binary), "-m", model, "-i", "http", "-u", url.removeprefix("http://"), "--input-data",
               str(data), "--concurrency-range", str(c), "--measurement-interval", "4000", "--max-trials", "6",
               "--stability-percentage", "50"]
        proc = await asyncio.create_subprocess_exec(*cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
        out = (await asyncio.wait_for(proc.communicate(), 180))[0].decode()
        commands.append(" ".join(cmd))
        reports.append(out)
        summary += [line.strip() for line in out.splitlines() if line.startswith("Concurrency:")]
    return {"commands": commands, "path": "direct", "summary": summary, "reports": reports}
