"""Start and stop real fleetserve processes on 127.0.0.1 for integration tests (only PIDs we started)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from fleetserve.deploy.local import free_port


def accepts(port: int) -> bool:
    """Whether something listens on 127.0.0.1:``port``."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except ConnectionRefusedError:
        return False
    return True


def http_up_at_grpc_start(server: ModuleType, http_port: int, monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Wraps ``server.start_grpc_server`` (the gateway's or the replica's) so that each call first notes in the
    returned list whether something already listens on ``http_port``."""
    noted: list[bool] = []
    start = server.start_grpc_server

    async def start_grpc(*args: Any, **kwargs: Any) -> Any:
        noted.append(accepts(http_port))
        return await start(*args, **kwargs)

    monkeypatch.setattr(server, "start_grpc_server", start_grpc)
    return noted


@dataclass
class Proc:
    popen: subprocess.Popen[str]
    port: int
    grpc_port: int = 0
    lines: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def signal(self, sig: int) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)

    def stop(self, timeout: float = 30) -> int:
        self.signal(signal.SIGTERM)
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            return self.popen.wait(5)

    def output(self) -> str:
        return "".join(self.lines)


def _pump(proc: Proc) -> None:
    assert proc.popen.stdout is not None
    for line in proc.popen.stdout:
        proc.lines.append(line)


def spawn(args: list[str], port: int, grpc_port: int = 0, env: dict[str, str] | None = None,
          command: list[str] | None = None, cwd: Path | None = None) -> Proc:
    """Run ``fleetserve ARGS`` (this interpreter's, unless ``command`` names another), ``env`` on top of ours."""
    popen = subprocess.Popen(
        [*(command or [sys.executable, "-m", "fleetserve.cli"]), *args], stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, cwd=cwd, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )
    proc = Proc(popen, port, grpc_port)
    threading.Thread(target=_pump, args=(proc,), daemon=True).start()
    return proc


def wait_http(url: str, timeout: float = 60, status: int = 200, proc: Proc | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.popen.poll() is not None:
            raise RuntimeError(f"process exited {proc.popen.returncode}:\n{proc.output()}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == status:
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{url} not {status} after {timeout}s" + (f"\n{proc.output()}" if proc else ""))


@contextlib.contextmanager
def replica(model: str = "tiny", *extra: str, grpc: bool = True, ready: bool = True, env: dict[str, str] | None = None,
            command: list[str] | None = None, cwd: Path | None = None) -> Iterator[Proc]:
    port = free_port()
    grpc_port = free_port() if grpc else 0
    proc = spawn(["serve", model, "--host", "127.0.0.1", "--port", str(port), "--grpc-port", str(grpc_port),
                  "--drain-grace-s", "0.2", *extra], port, grpc_port, env=env, command=command, cwd=cwd)
    try:
        if ready:
            wait_http(f"{proc.url}/v2/health/ready", proc=proc)
        yield proc
    finally:
        proc.stop()


@contextlib.contextmanager
def gateway(backends: list[str], *extra: str) -> Iterator[Proc]:
    """``fleetserve gateway`` in front of ``backends``, ready once its ``/readyz`` answers 200."""
    port = free_port()
    args = ["gateway", "--host", "127.0.0.1", "--port", str(port), "--health-interval", "0.3"]
    for url in backends:
        args += ["--backend", url]
    proc = spawn([*args, *extra], port)
    try:
        wait_http(f"{proc.url}/readyz", timeout=60, proc=proc)  # as a replica's: a loaded 2-core box
        yield proc
    finally:
        proc.stop()
