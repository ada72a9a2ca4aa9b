"""``fleetserve up --autoscale`` end to end: real gateway, actuator and replicas on 127.0.0.1 under real load."""

from __future__ import annotations

import asyncio
import json
import signal
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from fleetserve.bench.loadgen import LoadConfig, run_load
from fleetserve.deploy.local import free_port_block
from tests.support.procs import Proc, free_port, spawn, wait_http
from tests.support.waiting import until

# A replica of known capacity: 2 rows per 50 ms engine call, about 40 requests/s; one shape to warm.
REPLICA_ARGS = "--batch-latency-ms 50 --max-batch 2 --padding fixed --fixed-seq 16"


def _state(proc: Proc) -> dict[str, Any]:
    with urllib.request.urlopen(f"{proc.url}/gateway/autoscale", timeout=5) as r:
        state: dict[str, Any] = json.load(r)
        return state


def _members(proc: Proc) -> dict[str, list[str]]:
    members: dict[str, list[str]] = _state(proc)["members"]
    return members


@pytest.fixture
def fleet(request: pytest.FixtureRequest) -> Iterator[Proc]:
    """``fleetserve up`` autoscaled, with the test's further flags (indirect parameter)."""
    port, base = free_port(), free_port_block(8)
    extra = request.param
    proc = spawn(["up", "tiny", "--port", str(port), "--base-port", str(base), "--replica-args", REPLICA_ARGS,
                  "--autoscale", "hpa", "--max-replicas", "4", "--hpa-scale-down-stabilization-s", "3", *extra], port)
    try:
        wait_http(f"{proc.url}/healthz", timeout=120, proc=proc)
        yield proc
    finally:
        proc.signal(signal.SIGINT)
        code = proc.popen.wait(90)
        assert code == 0, proc.output()


@pytest.mark.slow
@pytest.mark.parametrize("fleet", [("--min-replicas", "1")], indirect=True)
async def test_a_fleet_at_one_grows_under_rising_load_and_shrinks_back_without_a_failed_request(fleet: Proc) -> None:
    await until(lambda: len(_members(fleet)["ready"]) == 1, 60, what="the first replica is ready")
    base = LoadConfig(url=fleet.url, rate=90.0, duration_s=60.0, workload="texts", long_fraction=0.0,
                      timeout_s=30.0, seed=3)
    grown = asyncio.Event()
    heavy = asyncio.create_task(run_load(base, stop=grown))
    await until(lambda: len(_members(fleet)["ready"]) >= 2, 45, what="the fleet grew to 2 or more")
    grown.set()
    first = await heavy
    shrunk = asyncio.Event()
    light = asyncio.create_task(run_load(LoadConfig(url=fleet.url, rate=5.0, duration_s=90.0, workload="texts",
                                                    long_fraction=0.0, timeout_s=30.0, seed=4), stop=shrunk))
    await until(lambda: (m := _members(fleet))["ready"] and len(m["ready"]) == 1 and not m["draining"]
                and not m["starting"], 60, what="the fleet shrank back to 1 and finished draining")
    shrunk.set()
    second = await light
    assert first.ok > 0 and second.ok > 0
    assert (first.errors, second.errors) == (0, 0), (first.errors_by_type, second.errors_by_type)
    decisions = [(d["from"], d["to"]) for d in _state(fleet)["decisions"]]
    assert any(to > frm >= 1 for frm, to in decisions) and any(frm > to >= 1 for frm, to in decisions), decisions
    assert "ready and receiving traffic" in fleet.output()


@pytest.mark.parametrize("fleet", [("--min-replicas", "0", "--idle-to-zero-s", "60")], indirect=True)
def test_a_fleet_at_zero_answers_its_first_request(fleet: Proc) -> None:
    assert _members(fleet)["ready"] == []
    request = urllib.request.Request(f"{fleet.url}/inference", data=json.dumps({"texts": ["hello"]}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as r:
        assert r.status == 200
        assert len(json.load(r)["embeddings"]) == 1
    assert len(_members(fleet)["ready"]) == 1
