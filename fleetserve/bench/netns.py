"""A network namespace joined to this one by a veth pair: a replica that can be cut off at the network.

:class:`NetworkNamespace` creates a uniquely named namespace (``fs-part-<pid>-<hex>``), a veth pair with a
/30 of the benchmarking range 198.18.0.0/15 (RFC 2544: never routed, so no real host is ever addressed),
and runs commands inside it (:meth:`wrap`: ``ip netns exec NAME ...``, which keeps the PID, so signals and
``PR_SET_PDEATHSIG`` work as for any child). A process there listening on :attr:`address` is reachable
from here only over the veth, and the faults act on that link inside the namespace:

- :meth:`drop`: iptables ``DROP`` on everything in and out — connects and requests get no answer at all,
  neither a refusal nor a reset, as when a node or its link vanishes;
- :meth:`delay`: every packet into and out of the namespace is held ``ms`` milliseconds
  (:mod:`fleetserve.bench.nfdelay` behind ``NFQUEUE`` rules), so a round trip takes ``2 × ms`` longer: a link
  so slow that health checks and requests time out, while nothing is lost or refused;
- :meth:`heal`: both undone.

``tc qdisc ... netem`` would be the usual tool, but ``sch_netem`` is an optional kernel module that some
kernels lack (this project's CI VM among them); iptables and nfnetlink_queue are the common denominator.
:meth:`close` removes the namespace and the host's end of the veth, whatever happened before (use it as a
context manager); namespaces left behind by a killed run are removed by the next one (their PID is gone).
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import os
import re
import secrets
import select
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

PREFIX = "fs-part-"
NETWORK = ipaddress.ip_network("198.18.0.0/15")
_OURS = re.compile(rf"^{PREFIX}(\d+)-[0-9a-f]+$")
_SBIN = ("/usr/sbin", "/sbin", "/usr/local/sbin")
_QUEUE = 0  # netfilter queues are per namespace, so every namespace can use queue 0
_READY_TIMEOUT_S = 10.0


class PartitionUnavailable(RuntimeError):
    """Network namespaces cannot be made here (not root, no iproute2/iptables, or the kernel refused)."""


def _tool(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path=os.pathsep.join(_SBIN))
    if found is None:
        raise PartitionUnavailable(f"{name} is not installed (apt-get install -y iproute2 iptables)")
    return found


def _run(argv: Sequence[str]) -> str:
    result = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise PartitionUnavailable(f"{' '.join(argv)} failed: {(result.stderr or result.stdout).strip()}")
    return result.stdout


@functools.cache
def partition_unavailable() -> str | None:
    """Why a partition cannot be made here, or None when it can (a namespace is made, both faults set and the
    namespace removed, to know; once per process)."""
    if os.geteuid() != 0:
        return "network namespaces and iptables need root"
    try:
        with NetworkNamespace() as probe:
            probe.drop()
            probe.delay(1)
    except PartitionUnavailable as exc:
        return str(exc)
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale() -> list[str]:
    """Remove namespaces of this module whose creating process is gone; returns their names."""
    ip = _tool("ip")
    removed = []
    for line in _run([ip, "netns", "list"]).splitlines():
        name = line.split()[0] if line.strip() else ""
        match = _OURS.match(name)
        if match and not _alive(int(match.group(1))):
            subprocess.run([ip, "netns", "delete", name], capture_output=True, timeout=30)
            removed.append(name)
    return removed


def _free_subnet(ip: str) -> ipaddress.IPv4Network:
    used = _run([ip, "-4", "-o", "addr", "show"])
    for _ in range(100):
        index = secrets.randbelow(NETWORK.num_addresses // 4)
        subnet = ipaddress.ip_network(f"{NETWORK.network_address + 4 * index}/30")
        if not any(str(host) in used for host in subnet.hosts()):
            return subnet  # type: ignore[return-value]
    raise PartitionUnavailable(f"no free /30 left in {NETWORK}")


class NetworkNamespace:
    """One namespace and its veth link; see the module docstring."""

    def __init__(self) -> None:
        token = secrets.token_hex(3)
        self.name = f"{PREFIX}{os.getpid()}-{token}"
        self.host_if, self.ns_if = f"fsp{token}h", f"fsp{token}n"  # interface names: 15 characters at most
        self.host_address = ""
        self.address = ""
        self._ip = ""
        self._iptables = ""
        self._created = False
        self._delayer: subprocess.Popen[str] | None = None
        self.fault = "none"

    def create(self) -> Self:
        self._ip, self._iptables = _tool("ip"), _tool("iptables")
        sweep_stale()
        subnet = _free_subnet(self._ip)
        host, inside = (str(a) for a in subnet.hosts())
        self.host_address, self.address = host, inside
        ip = self._ip
        _run([ip, "netns", "add", self.name])
        self._created = True
        try:
            for argv in (
                [ip, "link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if],
                [ip, "link", "set", self.ns_if, "netns", self.name],
                [ip, "addr", "add", f"{host}/30", "dev", self.host_if],
                [ip, "link", "set", self.host_if, "up"],
                [ip, "-n", self.name, "addr", "add", f"{inside}/30", "dev", self.ns_if],
                [ip, "-n", self.name, "link", "set", self.ns_if, "up"],
                [ip, "-n", self.name, "link", "set", "lo", "up"],
            ):
                _run(argv)
        except BaseException:
            self.close()
            raise
        return self

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside the namespace (same PID: ``ip netns exec`` execs it)."""
        return [self._ip or _tool("ip"), "netns", "exec", self.name, *argv]

    def _iptables_in(self, *args: str) -> None:
        _run(self.wrap([self._iptables, "-w", *args]))

    def drop(self) -> None:
        """Every packet into and out of the namespace is dropped from now on."""
        self.heal()
        self._iptables_in("-I", "INPUT", "-j", "DROP")
        self._iptables_in("-I", "OUTPUT", "-j", "DROP")
        self.fault = "drop"

    def delay(self, ms: float) -> None:
        """Every packet into and out of the namespace is held ``ms`` milliseconds from now on."""
        self.heal()
        argv = self.wrap([sys.executable, "-m", "fleetserve.bench.nfdelay", "--queue", str(_QUEUE),
                          "--delay-ms", f"{ms:g}"])
        # cwd: this package's parent, so ``-m`` finds the same fleetserve as this process uses.
        package_root = Path(__file__).resolve().parents[2]
        self._delayer = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                         stdin=subprocess.DEVNULL, cwd=package_root)
        assert self._delayer.stdout is not None
        ready, _, _ = select.select([self._delayer.stdout], [], [], _READY_TIMEOUT_S)
        line = self._delayer.stdout.readline() if ready else ""  # "ready", or the first line of its error
        if line.strip() != "ready":
            exited = self._delayer.poll() is not None
            rest = line + (self._delayer.stdout.read() if exited else "")
            self._stop_delayer()
            raise PartitionUnavailable(f"the packet delayer did not start: {rest.strip() or 'no answer'}")
        for chain in ("INPUT", "OUTPUT"):
            self._iptables_in("-I", chain, "-j", "NFQUEUE", "--queue-num", str(_QUEUE))
        self.fault = f"delay {ms:g} ms"

    def heal(self) -> None:
        """Packets flow again (held ones are let through)."""
        if self.fault != "none" and self._created:
            for chain in ("INPUT", "OUTPUT"):
                self._iptables_in("-F", chain)
        self._stop_delayer()
        self.fault = "none"

    def _stop_delayer(self) -> None:
        delayer, self._delayer = self._delayer, None
        if delayer is None:
            return
        if delayer.poll() is None:
            delayer.terminate()
            try:
                delayer.wait(_READY_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                delayer.kill()
                delayer.wait()
        if delayer.stdout is not None:
            delayer.stdout.close()

    def close(self) -> None:
        """Heal, then remove the namespace and the host's end of the veth; safe to call more than once."""
        with contextlib.suppress(PartitionUnavailable):
            self.heal()
        self._stop_delayer()
        if self._created:
            subprocess.run([self._ip, "netns", "delete", self.name], capture_output=True, timeout=30)
            # The pair goes with the namespace once no process is left in it; do not wait for that.
            subprocess.run([self._ip, "link", "delete", self.host_if], capture_output=True, timeout=30)
            self._created = False

    def __enter__(self) -> Self:
        return self.create()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
