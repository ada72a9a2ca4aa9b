from __future__ import annotations

import os
import subprocess
import sys

from fleetserve.bench.cpu import busiest_threads, tree_cpu_seconds, tree_threads_cpu

# Told to go, spends 0.3 s of its own CPU time, says so, then waits for stdin to close.
BURN = ("import sys, time\nsys.stdin.readline()\nend = time.process_time() + 0.3\n"
        "while time.process_time() < end: pass\nprint('done', flush=True)\nsys.stdin.read()")


def test_a_child_that_burns_cpu_is_the_busiest_thread_of_the_tree() -> None:
    child = subprocess.Popen([sys.executable, "-c", BURN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        before = tree_threads_cpu(os.getpid())
        whole = tree_cpu_seconds(os.getpid())
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout is not None and child.stdout.readline().strip() == "done"
        after = tree_threads_cpu(os.getpid())
        assert (child.pid, child.pid) in after
        name, cores = busiest_threads(before, after, wall_s=1.0, top=1)[0]
        assert name.endswith("(main)") and cores >= 0.25
        assert tree_cpu_seconds(os.getpid()) - whole >= 0.25
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=10)


def test_busiest_threads_ranks_by_cpu_spent_between_readings_and_counts_new_threads_from_zero() -> None:
    before = {(1, 1): ("a (main)", 10.0), (1, 2): ("b", 1.0)}
    after = {(1, 1): ("a (main)", 10.5), (1, 2): ("b", 2.0), (1, 3): ("c", 0.75)}
    assert busiest_threads(before, after, wall_s=2.0, top=2) == [("b", 0.5), ("c", 0.375)]
