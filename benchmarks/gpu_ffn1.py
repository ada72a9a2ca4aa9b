"""The fused FP8 FFN1 kernels against cuBLAS + a GELU/cast pass, per row count (issue 16, BENCHMARKS.md §10.2).

For each ``N×K`` of ``--shapes`` (BERT-base 3072×768, BERT-Large 4096×1024, MiniLM 1536×384) and each row count
of ``--rows``: the time of ``gelu(x·Wᵀ + b)`` cast to e4m3 with x, W e4m3 (random, calibrated-looking scales)
by (1) ``torch._scaled_mm`` then the Triton GELU + cast pass, (2) the one-tile-per-program Triton kernel and
(3) the persistent TMA kernel, each forced through ``TritonKernels(persistent_min_rows=...)``; Triton's
``do_bench`` (median µs). It is how ``PERSISTENT_MIN_ROWS`` was chosen. GPU only; prints a Markdown table and
writes ``gpu_ffn1.json`` / ``gpu_ffn1.md`` to ``--out`` (default ``$OUT``).

    python3 benchmarks/gpu_ffn1.py [--rows 1024,4096,16384] [--shapes 3072x768,4096x1024] [--rep-ms 60]
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import write_report

VARIANTS = ("cuBLAS + pass", "one tile per program", "persistent TMA")


def shapes(text: str) -> tuple[tuple[int, int], ...]:
    try:
        return tuple((int(n), int(k)) for n, k in (s.split("x") for s in text.split(",") if s))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected NxK[,...] like 3072x768, got {text!r}") from None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=lambda s: tuple(int(x) for x in s.split(",") if x),
                   default=(512, 1024, 2048, 4096, 8192, 16384, 49152))
    p.add_argument("--shapes", type=shapes, default=((3072, 768), (4096, 1024), (1536, 384)))
    p.add_argument("--rep-ms", type=float, default=60.0, help="do_bench's measuring time per point")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")))
    return p.parse_args(argv)


def render(rows: list[dict[str, Any]]) -> str:
    lines = ["| rows × N × K | " + " | ".join(f"{v} µs" for v in VARIANTS) + " |",
             "|---|" + "---:|" * len(VARIANTS)]
    for r in rows:
        best = min(r["us"].values())
        cells = [f"**{r['us'][v]:.1f}**" if r["us"][v] == best else f"{r['us'][v]:.1f}" for v in VARIANTS]
        lines.append(f"| {r['m']:,} × {r['n']:,} × {r['k']:,} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def call(kernels: Any, operands: tuple[Any, ...]) -> Callable[[], Any]:
    return lambda: kernels.fp8_linear_gelu(*operands)


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    import torch
    from triton.testing import do_bench

    from fleetserve.engine.torch_kernels import Fp8Scales, TritonKernels, quantize_reference

    kernels = {VARIANTS[0]: TritonKernels(fused_ffn1=False),
               VARIANTS[1]: TritonKernels(fused_ffn1=True, persistent_min_rows=1 << 62),
               VARIANTS[2]: TritonKernels(fused_ffn1=True, persistent_min_rows=0)}
    out = []
    for n, k in args.shapes:
        for m in args.rows:
            g = torch.Generator(device="cuda").manual_seed(0)
            x = torch.randn(m, k, device="cuda", generator=g)
            w = torch.randn(n, k, device="cuda", generator=g) * 0.05
            bias = torch.randn(n, device="cuda", generator=g).bfloat16()
            xs, ws = 0.02, float(w.abs().max()) / 448
            scales = Fp8Scales(torch.tensor(xs, device="cuda"), torch.tensor(ws, device="cuda"), xs * ws)
            operands = (quantize_reference(x, xs), quantize_reference(w, ws), scales, bias, 0.01)
            us = {name: do_bench(call(kern, operands), warmup=20, rep=args.rep_ms) * 1000
                  for name, kern in kernels.items()}
            out.append({"m": m, "n": n, "k": k, "us": us})
            print(render(out[-1:]).splitlines()[-1], flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows = measure(args)
    write_report(args.out, "gpu_ffn1", rows, render(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
