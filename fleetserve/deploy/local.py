"""Run NGINX or HAProxy in the foreground on 127.0.0.1 in front of local replicas (benchmarks and tests).

Each process gets a private prefix folder holding its config, logs and temp files; output goes to a file
there (never a pipe nobody drains, which would block the proxy). ``stop`` signals only the PID it started
and, if that does not end it, that PID's own process group (NGINX workers), which was created for it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

from fleetserve.deploy.haproxy import render_haproxy_config
from fleetserve.deploy.nginx import render_nginx_config
from fleetserve.deploy.proxy import ProxyConfig

# Debian installs both proxies in sbin folders that a non-root PATH often lacks.
_SBIN = ("/usr/sbin", "/usr/local/sbin", "/sbin")


class ProxyUnavailable(RuntimeError):
    """The proxy binary is not installed."""


def find_binary(name: str) -> str:
    """The path of ``name`` on PATH or in the sbin folders; :class:`ProxyUnavailable` if absent."""
    found = shutil.which(name) or shutil.which(name, path=os.pathsep.join(_SBIN))
    if found is None:
        raise ProxyUnavailable(f"{name} is not installed (apt-get install -y {name})")
    return found


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class ProxyProcess(ABC):
    """A proxy process; use as a context manager or call :meth:`start` / :meth:`stop`.

    ``backends`` are ``(url, weight)`` pairs; ``port`` 0 picks a free one; ``workers`` is NGINX's worker
    processes or HAProxy's threads (0 = one per core; 1, the default, keeps round-robin order exact);
    ``access_log`` off spares the disk under heavy load; ``health_interval_s`` paces HAProxy's checks.
    """

    binary_name: str
    config_name: str

    def __init__(
        self,
        backends: Sequence[tuple[str, float]],
        *,
        port: int = 0,
        policy: str = "round-robin",
        workers: int = 1,
        access_log: bool = True,
        health_interval_s: float = 2.0,
        maxconn: int = 4096,
        startup_timeout_s: float = 10.0,
        binary: str | None = None,
    ) -> None:
        self.config = ProxyConfig.from_pairs(
            backends, host="127.0.0.1", port=port or free_port(), policy=policy, workers=workers,
            access_log=access_log, health_interval_s=health_interval_s, maxconn=maxconn,
        )
        self.startup_timeout_s = startup_timeout_s
        self.binary = binary or find_binary(self.binary_name)
        self.prefix: Path | None = None
        self.popen: subprocess.Popen[bytes] | None = None

    @property
    def port(self) -> int:
        return self.config.port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.config.port}"

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen is not None else None

    @property
    def config_path(self) -> Path:
        return self._prefix() / self.config_name

    @property
    def output_path(self) -> Path:
        """The proxy's stdout and stderr (HAProxy's request log, NGINX's start-up errors)."""
        return self._prefix() / "output.log"

    def _prefix(self) -> Path:
        if self.prefix is None:
            raise RuntimeError(f"{self.binary_name} has not been started")
        return self.prefix

    @abstractmethod
    def render(self, prefix: Path) -> str: ...

    @abstractmethod
    def argv(self, prefix: Path) -> list[str]: ...

    def start(self) -> Self:
        prefix = Path(tempfile.mkdtemp(prefix=f"fleetserve-{self.binary_name}-"))
        # NGINX started by root runs its workers as nobody; they must reach the temp folders in here.
        prefix.chmod(0o755)
        self.prefix = prefix
        self.config_path.write_text(self.render(prefix))
        with self.output_path.open("wb") as out:
            self.popen = subprocess.Popen(self.argv(prefix), stdin=subprocess.DEVNULL, stdout=out,
                                          stderr=subprocess.STDOUT, start_new_session=True)
        try:
            self._wait_answering()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_answering(self) -> None:
        assert self.popen is not None
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise RuntimeError(f"{self.binary_name} exited with {self.popen.returncode}:\n{self.output()}")
            with contextlib.suppress(OSError), urllib.request.urlopen(f"{self.url}/healthz", timeout=1) as r:
                if r.status == 200:
                    return
            time.sleep(0.02)
        raise TimeoutError(f"{self.binary_name} did not answer on {self.url} within "
                           f"{self.startup_timeout_s}s:\n{self.output()}")

    def output(self) -> str:
        try:
            return self.output_path.read_text(errors="replace")
        except (OSError, RuntimeError):
            return ""

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the process (SIGTERM, then SIGKILL to its own group) and remove the prefix folder."""
        popen, self.popen = self.popen, None
        if popen is not None and popen.poll() is None:
            popen.send_signal(signal.SIGTERM)
            try:
                popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(popen.pid, signal.SIGKILL)
                popen.wait(5)
        if self.prefix is not None:
            shutil.rmtree(self.prefix, ignore_errors=True)
            self.prefix = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


class NginxProcess(ProxyProcess):
    """``nginx -g 'daemon off;'`` with its pid, logs and temp files in the prefix folder."""

    binary_name = "nginx"
    config_name = "nginx.conf"

    @property
    def access_log_path(self) -> Path:
        return self._prefix() / "access.log"

    def render(self, prefix: Path) -> str:
        return render_nginx_config(self.config, prefix)

    def argv(self, prefix: Path) -> list[str]:
        # -e: the compiled-in error log (/var/log/nginx) is not writable without root.
        return [self.binary, "-p", f"{prefix}/", "-c", str(self.config_path), "-e", "stderr",
                "-g", "daemon off;"]


class HaproxyProcess(ProxyProcess):
    """``haproxy -db`` (foreground, no daemon); its request log is :attr:`output_path`."""

    binary_name = "haproxy"
    config_name = "haproxy.cfg"

    def render(self, prefix: Path) -> str:
        return render_haproxy_config(self.config)

    def argv(self, prefix: Path) -> list[str]:
        return [self.binary, "-f", str(self.config_path), "-db"]
