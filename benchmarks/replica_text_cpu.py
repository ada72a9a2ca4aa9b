"""CPU per single-text ``/inference`` request in one replica, for two or more source trees, in one run.

Each ``--tree NAME=PATH`` starts ``fleetserve serve`` from that tree (``PYTHONPATH=PATH``), drives it with
``fleetserve bench --workload texts`` (one text per request, the search mix) closed-loop, and reads the
replica's CPU from ``/proc``: the event-loop thread (the thread whose id is the process id: HTTP, JSON,
tokenising, batching), the whole process (engine threads included) and the whole replica (with ``--serve-args
'--frontends N ...'``, its front-end processes too), each divided by the requests answered.
Trees alternate for ``--rounds`` rounds so that a busy box hurts each alike; the table gives per-round medians
and each tree's ratio to the first. Written as markdown to stdout and JSON to ``--out``.

    python3 benchmarks/replica_text_cpu.py --tree main=/work/main --tree branch=. --model minilm
    python3 benchmarks/replica_text_cpu.py --tree main=/tmp/main --tree branch=. --model tiny \
        --serve-args '--frontends 2 --frontend-batches 1 --max-delay-ms 1 --tokenize-threads 0' --concurrency 16
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))

from fleetserve.bench.cpu import tree_cpu_seconds  # noqa: E402
from fleetserve.deploy.local import free_port  # noqa: E402

from _common import http_get, markdown_table, process_cpu_s, scrape, stop_process, wait_ready  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def thread_cpu_s(pid: int, tid: int) -> float:
    """utime + stime of one thread (fields 14 and 15 of ``/proc/PID/task/TID/stat``)."""
    fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def parse_trees(items: list[str]) -> dict[str, Path]:
    trees: dict[str, Path] = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not Path(path, "fleetserve").is_dir():
            raise SystemExit(f"--tree wants NAME=PATH with PATH holding fleetserve/, got {item!r}")
        trees[name] = Path(path).resolve()
    return trees


def one_point(args: argparse.Namespace, tree: Path, work: Path) -> dict[str, float]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), *args.extra_path])}
    serve = [sys.executable, "-m", "fleetserve.cli", "serve", args.model, "--host", "127.0.0.1", "--port", str(port),
             "--grpc-port", "0", "--max-batch", str(args.max_batch), "--max-seq", str(args.max_seq),
             "--instances", str(args.instances), "--threads", str(args.threads), "--max-queue", "4096",
             *shlex.split(args.serve_args)]
    with (work / "replica.log").open("ab") as log:
        proc = subprocess.Popen(serve, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tree)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(lambda: http_get(base + "/v2/health/ready", 2.0)[0] == 200, [proc], 180.0, base)
        report = work / "bench.json"
        bench = [sys.executable, "-m", "fleetserve.cli", "bench", base, "--workload", "texts", "--concurrency",
                 str(args.concurrency), "--duration", str(args.duration), "--warmup", "1", "--timeout", "30",
                 "--out", str(report)]
        n0 = scrape(base).get("fleetserve_requests_total", 0.0)
        main0, all0, tree0 = thread_cpu_s(proc.pid, proc.pid), process_cpu_s(proc.pid), tree_cpu_seconds(proc.pid)
        t0 = time.monotonic()
        subprocess.run(bench, env=env, capture_output=True, check=True, timeout=args.duration + 60, cwd=tree)
        wall = time.monotonic() - t0
        main1, all1, tree1 = thread_cpu_s(proc.pid, proc.pid), process_cpu_s(proc.pid), tree_cpu_seconds(proc.pid)
        # Warm-up requests included: the CPU window holds them too.
        answered = max(scrape(base).get("fleetserve_requests_total", 0.0) - n0, 1.0)
        r = json.loads(report.read_text())
        return {"req_per_s": r["achieved_rps"], "errors": r["errors"], "p50_ms": (r["latency_s"]["p50"] or 0) * 1e3,
                "p99_ms": (r["latency_s"]["p99"] or 0) * 1e3, "loop_us_per_req": (main1 - main0) / answered * 1e6,
                "process_us_per_req": (all1 - all0) / answered * 1e6,
                "replica_us_per_req": (tree1 - tree0) / answered * 1e6, "wall_s": wall}
    finally:
        stop_process(proc, 10.0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tree", action="append", required=True, help="NAME=PATH of a source tree (first: baseline)")
    p.add_argument("--extra-path", action="append", default=[], help="more PYTHONPATH entries (e.g. a wheel site)")
    p.add_argument("--model", default="minilm")
    p.add_argument("--max-batch", type=int, default=32)
    p.add_argument("--max-seq", type=int, default=128)
    p.add_argument("--instances", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--duration", type=float, default=8.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--serve-args", default="", help="more `fleetserve serve` options, one string")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "out") / "replica_text_cpu.json")
    args = p.parse_args(argv)
    trees = parse_trees(args.tree)
    work = Path(tempfile.mkdtemp(prefix="replica-text-cpu-"))
    points: dict[str, list[dict[str, float]]] = {n: [] for n in trees}
    for _ in range(args.rounds):
        for name, tree in trees.items():
            points[name].append(one_point(args, tree, work))
    med = {n: {k: statistics.median(pt[k] for pt in pts) for k in pts[0]} for n, pts in points.items()}
    first = med[next(iter(trees))]

    def ratio(m: dict[str, float], key: str) -> str:  # with --frontends the engine process's loop idles: 0 µs
        return f"{m[key] / first[key]:.2f}" if first[key] else "—"

    rows = [[n, f"{m['req_per_s']:,.0f}", ratio(m, "req_per_s"), f"{m['p50_ms']:.1f}", f"{m['p99_ms']:.1f}",
             f"{m['errors']:.0f}", f"{m['loop_us_per_req']:.0f}", ratio(m, "loop_us_per_req"),
             f"{m['process_us_per_req']:.0f}", ratio(m, "process_us_per_req"), f"{m['replica_us_per_req']:.0f}",
             ratio(m, "replica_us_per_req")] for n, m in med.items()]
    print(markdown_table(["tree", "req/s", "ratio", "p50 ms", "p99 ms", "errors", "event-loop µs/req", "ratio",
                          "process µs/req", "ratio", "replica µs/req", "ratio"], rows, ["---", *["---:"] * 11]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "points": points,
                                    "median": med}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
