"""The CPU-cost arithmetic of ``fleetserve profile`` (the measurement itself runs in test_commands)."""

from __future__ import annotations

import os

import pytest

from fleetserve.sim.costs import replica_overhead, thread_cpu_seconds


def test_the_engine_thread_is_the_busiest_one_besides_the_main_thread() -> None:
    before = {100: 1.0, 101: 5.0, 102: 0.5}
    after = {100: 1.8, 101: 9.0, 102: 0.7, 103: 0.1}  # 103 started meanwhile
    # main +0.8, engine (101) +4.0 left out, helpers +0.2 and +0.1
    assert replica_overhead(100, before, after) == pytest.approx(1.1)


def test_a_process_without_other_threads_is_all_overhead() -> None:
    assert replica_overhead(7, {7: 1.0}, {7: 1.5}) == pytest.approx(0.5)


def test_thread_cpu_reads_this_process() -> None:
    threads = thread_cpu_seconds(os.getpid())
    assert os.getpid() in threads and all(cpu >= 0 for cpu in threads.values())
