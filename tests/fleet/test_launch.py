"""Replicas forked from the pre-imported fork server: they serve, drain on SIGTERM and are awaited without threads."""

from __future__ import annotations

import asyncio
import pickle
import signal
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest

from fleetserve.fleet.config import replica_config
from fleetserve.fleet.launch import ForkServerLauncher
from tests.support.procs import free_port
from tests.support.waiting import until


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return bool(r.status == 200)
    except OSError:
        return False


async def test_a_forked_replica_serves_and_drains_to_exit_0_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    config = replace(replica_config("tiny", ("--drain-grace-s", "0.1")), host="127.0.0.1", port=port, grpc_port=0,
                     threads=1)
    path = tmp_path / "replica-0.pickle"
    path.write_bytes(pickle.dumps((config, "warning", "text")))
    launcher = ForkServerLauncher()
    await launcher.prepare()
    child = await launcher.start((), path, {"PATH": "/usr/bin:/bin"})
    try:
        url = f"http://127.0.0.1:{port}/v2/health/ready"
        await until(lambda: _ready(url), 60, what="the forked replica is ready")
        assert child.returncode is None
        child.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(child.wait(), 30) == 0
        assert child.returncode == 0
    finally:
        child.kill()


async def test_a_forked_child_cannot_take_a_command_prefix(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="command prefix"):
        await ForkServerLauncher().start(("ip", "netns", "exec", "a"), tmp_path / "x.pickle", {})
