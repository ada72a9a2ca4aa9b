"""CPU time of processes and threads on this machine, from Linux's ``/proc``: what benchmarks and the profiler
charge to a replica, a gateway or a load generator."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def _processes() -> dict[int, tuple[int, float]]:
    """Each process's parent and CPU seconds (user + system), from /proc."""
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
    return stats


def _tree(pid: int, stats: dict[int, tuple[int, float]]) -> list[int]:
    """``pid`` and its descendants among ``stats``."""
    tree: list[int] = []
    frontier = {pid}
    while frontier:
        tree += [p for p in frontier if p in stats]
        frontier = {child for child, (parent, _) in stats.items() if parent in frontier}
    return tree


def tree_cpu_seconds(pid: int) -> float:
    """CPU time (user + system) of ``pid`` and all its descendants, from /proc (Linux)."""
    stats = _processes()
    return sum(stats[p][1] for p in _tree(pid, stats))


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


def tree_threads_cpu(pid: int) -> dict[tuple[int, int], tuple[str, float]]:
    """CPU seconds of every thread of ``pid`` and its descendants, keyed by (process, thread) and named
    ``comm`` (``(main)`` added for a process's first thread), from /proc (Linux)."""
    stats = _processes()
    out: dict[tuple[int, int], tuple[str, float]] = {}
    for p in _tree(pid, stats):
        with contextlib.suppress(OSError):
            for tid, seconds in thread_cpu_seconds(p).items():
                with contextlib.suppress(OSError):
                    name = Path(f"/proc/{p}/task/{tid}/comm").read_text().strip()
                    out[(p, tid)] = (f"{name} (main)" if tid == p else name, seconds)
    return out


def busiest_threads(before: dict[tuple[int, int], tuple[str, float]],
                    after: dict[tuple[int, int], tuple[str, float]], wall_s: float,
                    top: int = 3) -> list[tuple[str, float]]:
    """The ``top`` threads that spent the most CPU between two :func:`tree_threads_cpu` readings, as (name,
    cores): a thread near 1.0 core is a serial resource at its limit, whatever the process's total says."""
    spent = [(name, (cpu - before.get(key, (name, 0.0))[1]) / wall_s) for key, (name, cpu) in after.items()]
    return sorted(spent, key=lambda s: s[1], reverse=True)[:top]
