"""Running the gateway: in-process wiring (health checks, discovery, gRPC listener), the CLI options,
and real ``fleetserve gateway`` processes (one, and several workers on one port)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import aiohttp
import grpc
import grpc.aio
import pytest

from fleetserve import cli
from fleetserve.gateway.balance import BalancerConfig
from fleetserve.gateway.command import GatewayOptions
from fleetserve.gateway.config import SERVERS, GatewayConfig
from fleetserve.gateway.server import serve_gateway
from tests.support.fake_replica import FakeReplica
from tests.support.gateways import StartGateway, gateway_config
from tests.support.procs import accepts, free_port, http_up_at_grpc_start
from tests.support.waiting import until

StartReplicas = Callable[[int], Awaitable[list[FakeReplica]]]


async def test_health_checks_keep_traffic_off_unready_replicas(replicas: StartReplicas, gateway: StartGateway,
                                                               client: aiohttp.ClientSession) -> None:
    unready, ready = await replicas(2)
    unready.mode = "unready"
    gw = await gateway([unready.url, ready.url], health_checks=True,
                       balancer=BalancerConfig(health_interval_s=0.05))

    def states() -> dict[object, object]:
        return {row["url"]: row["state"] for row in gw.balancer.snapshot()}

    await until(lambda: states() == {unready.url: "unhealthy", ready.url: "healthy"})
    for _ in range(10):
        async with client.post(gw.url + "/v2/models/m/infer", data=b"{}") as res:
            assert res.status == 200
    assert (unready.hits, ready.hits) == (0, 10)


async def test_file_discovery_follows_the_file(tmp_path: Path, replicas: StartReplicas, gateway: StartGateway,
                                               client: aiohttp.ClientSession) -> None:
    first, second = await replicas(2)
    backends = tmp_path / "backends.txt"
    backends.write_text(f"{first.url}\n")
    gw = await gateway([], discovery="file", discovery_file=str(backends), discovery_poll_s=0.02)
    await until(lambda: [ep.url for ep in gw.balancer.endpoints()] == [first.url])
    backends.write_text(f"# moved\n{second.url}=2\n")
    await until(lambda: [ep.url for ep in gw.balancer.endpoints()] == [second.url])
    async with client.post(gw.url + "/inference", json={"texts": []}) as res:
        assert (await res.json())["replica"] == second.name
    assert first.hits == 0


async def test_grpc_listener_runs_with_the_gateway(replicas: StartReplicas, unused_tcp_port: int) -> None:
    (replica,) = await replicas(1)  # HTTP only: its gRPC port (HTTP + 1) refuses connections
    config = gateway_config([replica.url], grpc_port=unused_tcp_port)
    async with serve_gateway(config) as gw:
        assert gw.grpc_port == unused_tcp_port
        async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.grpc_port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await channel.unary_unary("/inference.GRPCInferenceService/ServerLive")(b"", timeout=5)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_the_grpc_listener_starts_before_http_so_readiness_means_both(
    replicas: StartReplicas, unused_tcp_port_factory: Callable[[], int], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A /readyz that answers (a probe, `fleetserve up`, the tests) must find the gRPC port taking calls too."""
    from fleetserve.gateway import server

    (replica,) = await replicas(1)
    http_port, grpc_port = unused_tcp_port_factory(), unused_tcp_port_factory()
    http_up_first = http_up_at_grpc_start(server, http_port, monkeypatch)
    async with serve_gateway(gateway_config([replica.url], port=http_port, grpc_port=grpc_port)):
        assert accepts(http_port) and accepts(grpc_port)
    assert http_up_first == [False]


def config_from_args(*argv: str) -> GatewayConfig:
    options: GatewayOptions = cli.parse("gateway", argv, {})[1]
    return options.config()


def test_cli_options_become_the_config() -> None:
    config = config_from_args(
        "--backend", "http://10.0.0.1:8000=2", "--backend", "http://10.0.0.2:8000", "--port", "9000",
        "--host", "127.0.0.1", "--grpc-port", "9001", "--policy", "least-pending", "--workers", "3",
        "--health-interval", "0.5", "--slow-start-s", "30", "--timeout-ms", "1500", "--max-body-bytes", "4096")
    assert config.backends == ("http://10.0.0.1:8000=2", "http://10.0.0.2:8000")
    assert [ep.weight for ep in config.endpoints()] == [2, 1]
    assert (config.port, config.host, config.grpc_port, config.workers) == (9000, "127.0.0.1", 9001, 3)
    assert (config.request_timeout_ms, config.max_body_bytes) == (1500, 4096)
    assert config.balancer.policy == "least-pending"
    assert (config.balancer.health_interval_s, config.balancer.slow_start_s) == (0.5, 30.0)
    dns = config_from_args("--discovery", "dns", "--dns-name", "replicas.svc", "--dns-port", "8000")
    assert (dns.discovery, dns.dns_name, dns.dns_port) == ("dns", "replicas.svc", 8000)
    assert not dns.autoscale.enabled  # off by default
    scaled = config_from_args("--discovery", "actuator", "--autoscale", "predictive", "--min-replicas", "0",
                              "--max-replicas", "6", "--hold-max-requests", "32", "--hold-timeout-ms", "4000")
    assert (scaled.autoscale.rule, scaled.autoscale.min_replicas, scaled.autoscale.max_replicas) == ("predictive", 0, 6)
    assert (scaled.discovery, scaled.backends, scaled.hold_max_requests, scaled.hold_timeout_ms) == (
        "actuator", (), 32, 4000)


@pytest.mark.parametrize(
    "argv, message",
    [((), "at least one --backend"), (("--discovery", "file"), "--discovery-file"),
     (("--backend", "https://a:1"), "only http://"), (("--backend", "http://a:1=x"), "weight .x. is not a number"),
     (("--backend", "http://a:1", "--workers", "2", "--port", "0"), "explicit --port"),
     (("--backend", "http://a:1", "--health-interval", "0"), "health_interval_s"),
     (("--discovery", "actuator"), "needs --autoscale"),
     (("--discovery", "actuator", "--autoscale", "hpa", "--backend", "http://a:1"),
      "only used with --discovery static"),
     (("--backend", "http://a:1", "--autoscale", "hpa", "--workers", "2", "--port", "9"), "needs --workers 1"),
     (("--discovery", "actuator", "--autoscale", "hpa", "--hold-max-requests", "0"), "hold_max_requests"),
     (("--discovery", "actuator", "--autoscale", "hpa", "--min-replicas", "3", "--max-replicas", "2"),
      "min_replicas <= max_replicas")],
)
def test_cli_errors_name_the_problem(argv: tuple[str, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        config_from_args(*argv)




@pytest.fixture(params=SERVERS)
def spawn(request: pytest.FixtureRequest) -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """Start ``fleetserve gateway`` processes, on each public server in turn; kill any left at the end."""
    started: list[subprocess.Popen[str]] = []

    def start(*argv: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen([sys.executable, "-m", "fleetserve.cli", "gateway", "--server", request.param, *argv],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def wait_listening(port: int, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 20
    while True:
        assert proc.poll() is None, proc.communicate()[0]
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            assert time.monotonic() < deadline, "gateway did not start listening"
            await asyncio.sleep(0.05)
            continue
        writer.close()
        return


def worker_pids(pid: int) -> list[int]:
    """Child processes running multiprocessing's spawn entry point (not its resource tracker)."""
    pids = [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    return [p for p in pids if b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()]


def listening_sockets(port: int) -> int:
    """TCP sockets listening on ``port`` (``/proc/net/tcp*``): one per worker under SO_REUSEPORT."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            count += fields[1].endswith(f":{port:04X}") and fields[3] == "0A"  # 0A: LISTEN
    return count


def running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


async def wait_exit(proc: subprocess.Popen[str], timeout_s: float = 15.0) -> int:
    await until(lambda: proc.poll() is not None, timeout_s, what="the gateway stopped")
    return proc.returncode


async def test_gateway_process_serves_and_stops_on_sigint(replicas: StartReplicas, client: aiohttp.ClientSession,
                                                          spawn: Callable[..., subprocess.Popen[str]]) -> None:
    (replica,) = await replicas(1)
    port = free_port()
    proc = spawn("--backend", replica.url, "--host", "127.0.0.1", "--port", str(port))
    await wait_listening(port, proc)
    async with client.post(f"http://127.0.0.1:{port}/v2/models/m/infer", data=b"{}") as res:
        assert res.status == 200, await res.text()
    proc.send_signal(signal.SIGINT)
    assert await wait_exit(proc) == 0


async def test_workers_share_one_port_and_stop_together(replicas: StartReplicas, client: aiohttp.ClientSession,
                                                        spawn: Callable[..., subprocess.Popen[str]]) -> None:
    (replica,) = await replicas(1)
    port = free_port()
    proc = spawn("--backend", replica.url, "--host", "127.0.0.1", "--port", str(port), "--workers", "2")
    await wait_listening(port, proc)
    workers = worker_pids(proc.pid)
    assert len(workers) == 2
    # Each worker listens once its SIGTERM handler is in place; a SIGTERM before then would kill it mid-start.
    await until(lambda: listening_sockets(port) == 2, 30, what="both workers listening")
    for _ in range(3):
        async with aiohttp.ClientSession() as fresh, \
                fresh.post(f"http://127.0.0.1:{port}/inference", json={"texts": []}) as res:
            assert res.status == 200  # a new connection each time: either worker may take it
    proc.send_signal(signal.SIGTERM)
    assert await wait_exit(proc) == 0
    assert not any(running(pid) for pid in workers)


async def test_port_in_use_fails_with_a_message(spawn: Callable[..., subprocess.Popen[str]]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = spawn("--backend", "http://127.0.0.1:1", "--host", "127.0.0.1", "--port", str(port))
        assert await wait_exit(proc) == 1
        output = proc.communicate()[0]
    assert "cannot start" in output and str(port) in output
    assert os.environ.get("FLEETSERVE_HOME")  # the suite's isolated home reaches the child too
