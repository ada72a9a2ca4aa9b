"""CPU time of processes and threads on this machine, from Linux's ``/proc``: what benchmarks and the profiler
charge to a replica, a gateway or a load generator."""

from __future__ import annotations

import os
from pathlib import Path


def tree_cpu_seconds(pid: int) -> float:
    """CPU time (user + system) of ``pid`` and all its descendants, from /proc (Linux)."""
    tick = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[int, float]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2 :].split()
        stats[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    total, frontier = 0.0, {pid}
    while frontier:
        total += sum(stats[p][1] for p in frontier if p in stats)
        frontier = {child for child, (parent, _) in stats.items() if parent in frontier}
    return total


def thread_cpu_seconds(pid: int) -> dict[int, float]:
    """User + system CPU seconds of each thread of ``pid`` (Linux ``/proc``); threads gone meanwhile are skipped."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                raw = f.read()
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2 :].split()
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / tick
    return out


def replica_overhead(pid: int, before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds of every thread but the engine's (the busiest one other than the main thread) in between."""
    spent = {tid: cpu - before.get(tid, 0.0) for tid, cpu in after.items()}
    engine = max((cpu for tid, cpu in spent.items() if tid != pid), default=0.0)
    return sum(spent.values()) - engine
