"""The CPU-cost arithmetic of ``fleetserve profile`` (the measurement itself runs in test_commands)."""

from __future__ import annotations

import asyncio
import os
import sys

import pytest

from fleetserve.bench.cpu import replica_overhead, thread_cpu_seconds
from fleetserve.bench.replica_metrics import stage_mean, stage_sums
from fleetserve.deploy.local import free_port
from fleetserve.errors import FleetserveError
from fleetserve.sim.costs import LowLoad, _process


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


def test_stage_means_come_from_the_replicas_histogram_between_two_scrapes() -> None:
    def text(queue: tuple[float, int], compute: tuple[float, int]) -> str:
        lines = ["# HELP fleetserve_request_duration_seconds Request time by stage",
                 "# TYPE fleetserve_request_duration_seconds histogram"]
        for stage, (total, count) in (("queue", queue), ("compute", compute)):
            lines += [f'fleetserve_request_duration_seconds_bucket{{le="+Inf",model="m",stage="{stage}"}} {count}',
                      f'fleetserve_request_duration_seconds_count{{model="m",stage="{stage}"}} {count}',
                      f'fleetserve_request_duration_seconds_sum{{model="m",stage="{stage}"}} {total}']
        return "\n".join(lines) + "\n"

    before = stage_sums(text((0.5, 100), (1.0, 100)))
    after = stage_sums(text((0.75, 200), (1.5, 200)))
    assert stage_mean(before, after, "queue") == pytest.approx(0.0025)
    assert stage_mean(before, after, "compute") == pytest.approx(0.005)
    with pytest.raises(FleetserveError, match="no 'queue' time"):
        stage_mean(after, after, "queue")
    # What a request spent outside the batcher's queue and the engine.
    assert LowLoad(0.010, 0.0025, 0.005, 50, 1.0).outside_s == pytest.approx(0.0025)


def test_a_process_that_exits_before_ready_names_its_last_error_line() -> None:
    async def start() -> None:
        code = "import sys; sys.stderr.write('warming up\\nport is taken\\n'); sys.exit(3)"
        async with _process([sys.executable, "-c", code], f"http://127.0.0.1:{free_port()}/", 10):
            pass

    with pytest.raises(FleetserveError, match="exited with 3: port is taken"):
        asyncio.run(start())


def test_a_process_that_logs_more_than_a_pipe_holds_still_gets_ready() -> None:
    port = free_port()
    code = ("import sys, http.server; sys.stderr.write('x' * (1 << 20)); "
            f"http.server.test(http.server.SimpleHTTPRequestHandler, port={port}, bind='127.0.0.1')")

    async def serve() -> float:
        async with _process([sys.executable, "-c", code], f"http://127.0.0.1:{port}/", 20) as (_pid, ready_s):
            return ready_s

    assert asyncio.run(serve()) < 20
