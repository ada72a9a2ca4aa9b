"""The fused Triton attention against SDPA + an FP8 cast pass, per shape (issue 16, BENCHMARKS.md §10.2).

For each ``BATCHxSEQxHEADSxHEAD_DIM`` of ``--shapes`` (BERT-base, MiniLM and BERT-Large serving shapes): the
time of self-attention from the fused QKV product's output to the output projection's e4m3 input, by
(1) ``scaled_dot_product_attention`` (cuDNN on the H200) plus the Triton cast pass and (2) the Triton kernel
with each of its tile shapes forced (autotuning picks the fastest of them per sequence-length class at a
replica's start); Triton's ``do_bench`` (median µs). It is how the kernel's tile shapes were chosen. GPU
only; prints a Markdown table and writes ``gpu_attention.json`` / ``gpu_attention.md`` to ``--out`` (default ``$OUT``).

    python3 benchmarks/gpu_attention.py [--shapes 128x128x12x64,64x384x16x64] [--rep-ms 40]
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from _common import write_report

SDPA = "SDPA + cast"


def shapes(text: str) -> tuple[tuple[int, int, int, int], ...]:
    try:
        out = tuple(tuple(int(v) for v in s.split("x")) for s in text.split(",") if s)
    except ValueError:
        out = ()
    if not out or any(len(s) != 4 for s in out):
        raise argparse.ArgumentTypeError(f"expected BATCHxSEQxHEADSxHEAD_DIM[,...] like 128x128x12x64, got {text!r}")
    return out  # type: ignore[return-value]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", type=shapes,
                   default=((1, 128, 12, 64), (32, 128, 12, 64), (128, 128, 12, 64), (128, 32, 12, 64),
                            (128, 128, 12, 32), (64, 384, 16, 64), (64, 192, 16, 64)))
    p.add_argument("--rep-ms", type=float, default=40.0, help="do_bench's measuring time per point")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")))
    return p.parse_args(argv)


def config_name(cfg: Any) -> str:
    """``BMxBN/stages/warps`` of a ``triton.Config``."""
    return f"{cfg.kwargs['BM']}x{cfg.kwargs['BN']}/s{cfg.num_stages}/w{cfg.num_warps}"


def render(rows: list[dict[str, Any]]) -> str:
    lines = [f"| batch × seq × heads × head dim | {SDPA} µs | Triton, fastest tile µs | tile | Triton ÷ SDPA |",
             "|---|---:|---:|---|---:|"]
    for r in rows:
        tiles = {k: v for k, v in r["us"].items() if k != SDPA}
        best = min(tiles, key=tiles.__getitem__)
        b, s, h, d = r["shape"]
        lines.append(f"| {b} × {s} × {h} × {d} | {r['us'][SDPA]:.1f} | {tiles[best]:.1f} | {best} | "
                     f"{tiles[best] / r['us'][SDPA]:.2f} |")
    return "\n".join(lines) + "\n"


def time_shape(b: int, s: int, heads: int, head_dim: int, rep_ms: float) -> dict[str, float]:
    """µs of SDPA + cast and of every tile shape of the Triton kernel, for one shape (half precision in, e4m3 out)."""
    import torch
    import triton
    from triton.testing import do_bench

    from fleetserve.engine import torch_triton as tt
    from fleetserve.engine.torch_kernels import FP8, TritonKernels

    g = torch.Generator(device="cuda").manual_seed(0)
    hidden = heads * head_dim
    qkv = (torch.randn(b * s, 3 * hidden, device="cuda", generator=g) * 2).half()
    lengths = torch.randint(s // 2, s + 1, (b,), device="cuda", generator=g)
    bias = ((torch.arange(s, device="cuda")[None, :] >= lengths[:, None]).half() * -10000.0).contiguous()
    result = torch.empty((b * s, hidden), dtype=FP8, device="cuda")
    sdpa = TritonKernels(fused_attention=False)
    us = {SDPA: do_bench(lambda: sdpa.attention(qkv, bias, heads, 0.01), warmup=20, rep=rep_ms) * 1000}
    for cfg in tt.attention.configs:
        grid = (triton.cdiv(s, cfg.kwargs["BM"]) * b * heads,)

        def run(cfg: Any = cfg, grid: tuple[int] = grid) -> None:
            tt.attention.fn[grid](qkv, bias, result, s, 1 << (s - 1).bit_length(), heads, hidden, head_dim**-0.5,
                                  100.0, HD=head_dim, QUANT=True, **cfg.kwargs,
                                  num_warps=cfg.num_warps, num_stages=cfg.num_stages)

        us[config_name(cfg)] = do_bench(run, warmup=20, rep=rep_ms) * 1000
    return us


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    out = []
    for b, s, heads, head_dim in args.shapes:
        out.append({"shape": [b, s, heads, head_dim], "us": time_shape(b, s, heads, head_dim, args.rep_ms)})
        print(render(out[-1:]).splitlines()[-1], flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows = measure(args)
    write_report(args.out, "gpu_attention", rows, render(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
