"""How long a hand-off between two processes waits on a shared box, by how busy its cores are (issue 15).

The simulator shares a host's cores by egalitarian processor sharing (``fleetserve.sim.host``): below full load
a job runs at full speed, so a request handed from one process to another (load generator → gateway → replica →
back) waits for nothing. On the 2-core box the real fleet's time outside the engines grows with load while the
cores are far from full (BENCHMARKS.md §8.2: client ↔ gateway 0.44 → 2.27 ms with the box 35% busy). This
measures that wait alone: process A sends one byte over a Unix socket pair to process B, which answers at once,
at Poisson times (so B sleeps between pings and each ping wakes it), while ``--busy`` other processes keep the
cores busy in bursts like engine calls (exponential bursts of ``--burst-ms`` mean, idle gaps sized for the
duty cycle). One row per busy share of the box: the round trip's mean, p50, p99 and p99.9 in µs, and how much
each exceeds the round trip on an idle box.

    .venv/bin/python benchmarks/handoff_wait.py --shares 0,0.2,0.35,0.5,0.7,0.9 --seconds 10
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import socket
import statistics
import time

from _common import cpu_model, markdown_table, nearest_rank


def _spin_until(t: float) -> None:
    while time.perf_counter() < t:
        pass


def busy(duty: float, burst_s: float, seed: int, stop: float) -> None:
    """Busy bursts (exponential, mean ``burst_s``) and idle gaps, ``duty`` of the time busy, until ``stop``
    (a ``time.time()``)."""
    rng = random.Random(seed)
    while time.time() < stop:
        on = rng.expovariate(1 / burst_s)
        _spin_until(time.perf_counter() + on)
        time.sleep(rng.expovariate(duty / ((1 - duty) * burst_s)) if duty < 1 else 0)


def echo(conn: socket.socket, other_end: socket.socket) -> None:
    """Answer every byte at once, until the peer closes (the forked copy of its end closed first, or it never
    would)."""
    other_end.close()
    while data := conn.recv(1):
        conn.sendall(data)


def round_trips(conn: socket.socket, rate: float, seconds: float, seed: int) -> list[float]:
    """Round trips (s) of one byte at Poisson times of ``rate`` a second, for ``seconds``."""
    rng = random.Random(seed)
    out: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        time.sleep(rng.expovariate(rate))
        t0 = time.perf_counter()
        conn.sendall(b"x")
        conn.recv(1)
        out.append(time.perf_counter() - t0)
    return out


def measure(share: float, args: argparse.Namespace) -> dict[str, float]:
    """One row: the box ``share`` busy (over ``--busy`` processes) while the round trips run."""
    cores = os.cpu_count() or 1
    duty = min(1.0, share * cores / args.busy)
    stop = time.time() + args.seconds + 1.0
    workers = [mp.Process(target=busy, args=(duty, args.burst_ms / 1e3, args.seed + i, stop), daemon=True)
               for i in range(args.busy)] if duty > 0 else []
    for w in workers:
        w.start()
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    peer = mp.Process(target=echo, args=(b, a), daemon=True)
    peer.start()
    b.close()  # the peer's copy stays open; this one would keep its recv from seeing the end
    try:
        time.sleep(0.5)
        trips = round_trips(a, args.rate, args.seconds, args.seed)
    finally:
        a.close()
        peer.join(timeout=5)
        for w in workers:
            w.join(timeout=args.seconds + 5)
    us = [t * 1e6 for t in trips]
    return {"share": share, "n": len(us), "mean": statistics.fmean(us), "p50": nearest_rank(us, 50),
            "p99": nearest_rank(us, 99), "p999": nearest_rank(us, 99.9)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shares", type=lambda s: [float(x) for x in s.split(",") if x], default=[0, 0.2, 0.35, 0.5, 0.7],
                    help="busy shares of the box's cores, 0..1 (default: 0,0.2,0.35,0.5,0.7)")
    ap.add_argument("--busy", type=int, default=4, help="busy processes sharing that load (default: 4)")
    ap.add_argument("--burst-ms", type=float, default=5.0, help="mean busy burst (default: 5 ms, an engine call)")
    ap.add_argument("--rate", type=float, default=200.0, help="round trips a second (default: 200)")
    ap.add_argument("--seconds", type=float, default=10.0, help="per row (default: 10)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    if not args.shares or any(not 0 <= s <= 1 for s in args.shares) or args.busy < 1 or min(
            args.burst_ms, args.rate, args.seconds) <= 0:
        ap.error("shares must be in 0..1; --busy, --burst-ms, --rate and --seconds positive")
    rows = [measure(share, args) for share in args.shares]
    idle = next((r for r in rows if r["share"] == 0), None)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"# hand-off round trips, {os.cpu_count()} cores ({cpu_model()}), {when}; {args.busy} busy processes, "
          f"bursts of {args.burst_ms:g} ms, {args.rate:g} round trips/s, {args.seconds:g} s a row")
    head = ["busy share", "round trips", "mean µs", "p50 µs", "p99 µs", "p99.9 µs", "mean over idle µs",
            "p99 over idle µs"]
    print(markdown_table(head, [[f"{r['share']:.2f}", f"{r['n']:.0f}", f"{r['mean']:.0f}", f"{r['p50']:.0f}",
                                 f"{r['p99']:.0f}", f"{r['p999']:.0f}",
                                 f"{r['mean'] - idle['mean']:.0f}" if idle else "—",
                                 f"{r['p99'] - idle['p99']:.0f}" if idle else "—"] for r in rows]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
