"""A real network namespace and veth link (root, iproute2, iptables): a server inside answers over the link,
stops answering once its packets are dropped, answers late once they are delayed, and everything is gone
after close. Skipped with the reason where namespaces cannot be made."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from fleetserve.bench.netns import PREFIX, NetworkNamespace, partition_unavailable


@pytest.fixture(scope="module")
def namespace() -> Iterator[NetworkNamespace]:
    reason = partition_unavailable()
    if reason:
        pytest.skip(f"network partitions cannot be made here: {reason}")
    with NetworkNamespace() as ns:
        yield ns


@pytest.fixture(scope="module")
def echo(namespace: NetworkNamespace) -> Iterator[tuple[str, int]]:
    """A TCP echo server inside the namespace, on its veth address."""
    code = ("import socket,sys\n"
            "s=socket.create_server((sys.argv[1],0));print(s.getsockname()[1],flush=True)\n"
            "while True:\n c,_=s.accept()\n c.sendall(c.recv(64));c.close()\n")
    proc = subprocess.Popen(namespace.wrap([sys.executable, "-c", code, namespace.address]), stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None
    port = int(proc.stdout.readline())
    try:
        yield namespace.address, port
    finally:
        proc.kill()
        proc.wait()


def round_trip(address: tuple[str, int], timeout_s: float) -> float:
    started = time.monotonic()
    with socket.create_connection(address, timeout=timeout_s) as conn:
        conn.sendall(b"ping")
        assert conn.recv(64) == b"ping"
    return time.monotonic() - started


def test_drop_then_delay_then_heal(namespace: NetworkNamespace, echo: tuple[str, int]) -> None:
    assert round_trip(echo, 2) < 1
    namespace.drop()
    with pytest.raises(TimeoutError):  # no refusal, no reset: nothing comes back
        round_trip(echo, 0.5)
    namespace.delay(250)
    # SYN and SYN-ACK, then the request and its answer: each held 250 ms on the way in and on the way out.
    assert 1.0 <= round_trip(echo, 5) < 3.0
    namespace.heal()
    assert round_trip(echo, 2) < 1


def test_close_removes_the_namespace_and_link() -> None:
    if partition_unavailable():
        pytest.skip("network partitions cannot be made here")
    ns = NetworkNamespace().create()
    ns.delay(50)
    ns.close()
    ns.close()  # twice is harmless
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    links = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True, check=True).stdout
    assert ns.name not in names and ns.host_if not in links
    assert PREFIX in ns.name
