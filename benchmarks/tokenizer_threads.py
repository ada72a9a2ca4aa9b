"""CPU per ``encode_batch`` call with the ``tokenizers`` library's thread pool on and off (BENCHMARKS.md §10.8).

Each setting runs in its own process (``TOKENIZERS_PARALLELISM`` is read by the library at every call, but one
process per setting keeps a pool that was started from serving the other). A call tokenises TEXTS texts of the
search mix's short queries with ``--gap-ms`` of sleep between calls, as a front end sees them; the table gives
the process CPU and the wall time per call, medians of ``--rounds`` alternating rounds.

    python3 benchmarks/tokenizer_threads.py --texts 2,32
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))

from _common import machine, markdown_table  # noqa: E402

QUERIES = ("wireless noise cancelling headphones", "cheap flights to lisbon in may", "how to descale a kettle",
           "best budget mirrorless camera 2026")
SETTINGS = {"pool on": "true", "pool off": "false"}


def child(model: str, texts: int, calls: int, gap_s: float) -> None:
    """Runs in the measured process: prints {"cpu_us", "wall_us"} per call."""
    from fleetserve.models.store import ModelStore
    from fleetserve.models.tokenizer import TextTokenizer

    path = ModelStore().resolve(model).tokenizer_path
    assert path is not None
    tok = TextTokenizer(path, 128)
    batch = [QUERIES[i % len(QUERIES)] for i in range(texts)]
    for _ in range(100):
        tok.encode(batch)
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(calls):
        tok.encode(batch)
        time.sleep(gap_s)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall - calls * gap_s
    print(json.dumps({"cpu_us": cpu / calls * 1e6, "wall_us": wall / calls * 1e6}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--texts", default="2,32", help="texts per call, comma-separated")
    ap.add_argument("--calls", type=int, default=4000)
    ap.add_argument("--gap-ms", type=float, default=0.3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--child", nargs=3, metavar=("TEXTS", "CALLS", "GAP_S"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.model, int(args.child[0]), int(args.child[1]), float(args.child[2]))
        return
    results: dict[tuple[int, str], list[dict[str, float]]] = {}
    sizes = [int(t) for t in args.texts.split(",")]
    for _ in range(args.rounds):
        for texts in sizes:
            for name, value in SETTINGS.items():
                out = subprocess.run(
                    [sys.executable, __file__, "--model", args.model, "--child", str(texts),
                     str(max(1, args.calls // texts)), str(args.gap_ms / 1000)],
                    env={**os.environ, "TOKENIZERS_PARALLELISM": value}, capture_output=True, text=True, check=True,
                )
                results.setdefault((texts, name), []).append(json.loads(out.stdout))
    rows = [(str(texts), name, f"{statistics.median(r['cpu_us'] for r in runs):,.0f}",
             f"{statistics.median(r['wall_us'] for r in runs):,.0f}") for (texts, name), runs in results.items()]
    print(f"# tokenizer thread pool — {machine()}, model {args.model}, "
          f"{args.gap_ms} ms between calls, medians of {args.rounds}\n")
    print(markdown_table(("texts per call", "tokenizer pool", "CPU µs per call", "wall µs per call"), rows,
                         ("---:", "---", "---:", "---:")))


if __name__ == "__main__":
    main()
