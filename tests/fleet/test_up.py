"""``fleetserve up`` as a user runs it: a real fleet from the command line, configured through the environment."""

from __future__ import annotations

import json
import signal
import urllib.request

from fleetserve.deploy.local import free_port_block
from tests.support.procs import Proc, free_port, spawn, wait_http
from tests.support.waiting import until_sync


def test_an_engine_backend_in_the_environment_reaches_the_replicas_and_not_the_gateway() -> None:
    """``FLEETSERVE_BACKEND`` names an engine backend to ``up``; the gateway once read it as a replica URL."""
    port, base = free_port(), free_port_block(2)
    proc = spawn(["up", "tiny", "--replicas", "1", "--port", str(port), "--base-port", str(base)], port,
                 env={"FLEETSERVE_BACKEND": "onnxruntime", "FLEETSERVE_MAX_QUEUE": "1"})
    try:
        wait_http(f"{proc.url}/readyz", timeout=120, proc=proc)
        with urllib.request.urlopen(f"{proc.url}/gateway/backends", timeout=5) as r:
            backends = [b["url"] for b in json.load(r)["backends"]]
        assert backends == [f"http://127.0.0.1:{base}"]
        request = urllib.request.Request(f"{proc.url}/inference", data=json.dumps({"texts": ["hello"]}).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as r:
            assert len(json.load(r)["embeddings"]) == 1
        _wait_for_line(proc, f"dashboard {proc.url}/dashboard")
    finally:
        proc.signal(signal.SIGINT)
        code = proc.popen.wait(60)
    assert code == 0, proc.output()
    # FLEETSERVE_MAX_QUEUE is `up`'s environment, not the replicas': had it leaked, max_queue 1 < max_batch 32
    # would have stopped the replica at start.
    assert "max_queue" not in proc.output()


def _wait_for_line(proc: Proc, text: str, timeout_s: float = 30.0) -> None:
    until_sync(lambda: text in proc.output(), timeout_s, what=f"{text!r} printed")


def _refused(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_the_fleet_stops_with_its_supervisor_even_when_it_is_killed() -> None:
    port, base = free_port(), free_port_block(2)
    proc = spawn(["up", "tiny", "--replicas", "1", "--port", str(port), "--base-port", str(base)], port)
    try:
        wait_http(f"{proc.url}/readyz", timeout=120, proc=proc)
    finally:
        proc.signal(signal.SIGKILL)
        proc.popen.wait(10)
    until_sync(lambda: _refused(port) and _refused(base), 30, what="the gateway and replica stopped with `up`")

