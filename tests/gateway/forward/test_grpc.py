"""gRPC forwarding end to end: grpc.aio replicas behind a real in-process gateway, ONE client channel in
front; every call balanced, retried, capped and hedged by the forwarding core like an HTTP request."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc
import grpc.aio
import pytest

from fleetserve.gateway.balance import BalancerConfig, Endpoint
from fleetserve.gateway.edge import EdgeConfig, ShedConfig
from fleetserve.gateway.forward.channels import GrpcChannels, grpc_target
from fleetserve.gateway.forward.hedge import HedgeConfig
from fleetserve.telemetry.tracing import parse_traceparent
from tests.support.grpc_replica import GRPC_INFER, GRPC_STREAM, SERVICE, GrpcFront, GrpcReplica, StartGrpcFront

ROUND_ROBIN = BalancerConfig(policy="round-robin")
NO_RETRY_BUDGET = BalancerConfig(policy="round-robin", retry_budget_percent=0.0, retry_min_concurrency=0)
EAGER = HedgeConfig(percentile=99, min_samples=10, window=16, max_extra_percent=100, burst=5, min_delay_ms=20)


def sample(front: GrpcFront, name: str, labels: dict[str, str] | None = None) -> float:
    value = front.gateway.metrics.registry.get_sample_value(name, labels or {})
    return 0.0 if value is None else value


async def wait_for(condition: asyncio.Event, timeout_s: float = 5.0) -> None:
    await asyncio.wait_for(condition.wait(), timeout_s)


async def test_calls_on_one_channel_spread_across_replicas(grpc_front: StartGrpcFront) -> None:
    # Round-robin, so the spread shows per-call balancing alone, not how fast each replica answered.
    gw, fleet = await grpc_front(2, balancer=ROUND_ROBIN)
    replies = await asyncio.gather(*(gw.call(request=str(i).encode()) for i in range(20)))
    replies += [await gw.call(request=b"seq") for _ in range(20)]
    assert all(r.split(b"|")[1] == GRPC_INFER.encode() for r in replies)
    assert sorted(r.split(b"|")[2] for r in replies[:20]) == sorted(str(i).encode() for i in range(20))
    assert [len(fleet[0].calls), len(fleet[1].calls)] == [20, 20]
    assert sample(gw, "fleetserve_gateway_requests_total", {"backend": fleet[0].url, "code": "200"}) == len(
        fleet[0].calls)


async def test_every_service_method_is_forwarded(grpc_front: StartGrpcFront) -> None:
    gw, _ = await grpc_front(1)
    for method in ("ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata", "ModelInfer"):
        assert await gw.call(SERVICE + method, b"q") == f"g0|{SERVICE}{method}|q".encode()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await gw.call("/other.Service/Method")
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_a_stream_stays_on_one_replica(grpc_front: StartGrpcFront) -> None:
    gw, fleet = await grpc_front(2)

    async def requests() -> AsyncIterator[bytes]:
        for i in range(3):
            yield str(i).encode()

    replies = [reply async for reply in gw.channel.stream_stream(GRPC_STREAM)(requests())]
    (replica,) = [r for r in fleet if r.calls]
    assert replies == [f"{replica.name}|{i}".encode() for i in range(3)]
    assert replica.calls == [GRPC_STREAM]


async def test_unavailable_replica_is_retried_on_another(grpc_front: StartGrpcFront) -> None:
    gw, (busy, idle) = await grpc_front(2, balancer=ROUND_ROBIN)
    busy.mode = "unavailable"
    assert [await gw.call() for _ in range(6)] == [b"g1|" + GRPC_INFER.encode() + b"|x"] * 6
    assert len(busy.calls) >= 1 and len(idle.calls) == 6
    assert gw.gateway.metrics.retries._value.get() == len(busy.calls)


async def test_a_replica_that_answers_unavailable_is_retried_only_within_the_budget(
        grpc_front: StartGrpcFront) -> None:
    gw, fleet = await grpc_front(2, balancer=NO_RETRY_BUDGET)
    for replica in fleet:
        replica.mode = "unavailable"
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await gw.call()
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE and "is overloaded" in (info.value.details() or "")
    assert len(fleet[0].calls) + len(fleet[1].calls) == 1
    assert gw.gateway.metrics.retry_budget_exhausted._value.get() == 1


async def test_a_stopped_replica_is_retried_without_the_retry_budget(grpc_front: StartGrpcFront) -> None:
    gw, (dead, _) = await grpc_front(2, balancer=NO_RETRY_BUDGET)
    await dead.stop()  # nothing listens: the call reached no replica, so retrying it costs no budget
    assert [await gw.call() for _ in range(6)] == [b"g1|" + GRPC_INFER.encode() + b"|x"] * 6
    assert gw.gateway.metrics.retries._value.get() >= 1
    assert gw.gateway.metrics.retry_budget_exhausted._value.get() == 0
    (row,) = [r for r in gw.gateway.balancer.snapshot() if r["url"] == dead.url]
    assert row["state"] == "ejected"  # two refused connections in a row: the connect-error streak


async def test_other_errors_pass_through_and_are_not_retried(grpc_front: StartGrpcFront) -> None:
    gw, fleet = await grpc_front(2)
    for replica in fleet:
        replica.mode = "invalid"
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await gw.call()
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == "input 'x' has the wrong shape"
    assert len(fleet[0].calls) + len(fleet[1].calls) == 1


async def test_no_replica_is_unavailable_with_retry_after(grpc_front: StartGrpcFront) -> None:
    gw, _ = await grpc_front(0)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await gw.call()
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "no healthy replica" in (info.value.details() or "")
    assert dict(info.value.trailing_metadata())["retry-after"] == "1"


async def test_client_deadline_bounds_the_call(grpc_front: StartGrpcFront) -> None:
    gw, (replica,) = await grpc_front(1)
    replica.mode = "hang"
    started = time.monotonic()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await gw.call(timeout=0.2)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - started < 1.0
    await wait_for(replica.cancelled)  # the replica's call had the same deadline


async def test_metadata_trace_and_reported_load(grpc_front: StartGrpcFront) -> None:
    gw, (replica,) = await grpc_front(1)
    replica.queue_depth = 4
    trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    await gw.call(metadata=(("traceparent", trace), ("x-request-id", "abc"), ("x-tenant", "t1"),
                            ("x-fleetserve-subject", "mallory")))
    sent = parse_traceparent(replica.metadata["traceparent"])
    assert sent is not None and sent.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert sent.parent_id != "00f067aa0ba902b7"
    assert (replica.metadata["x-request-id"], replica.metadata["x-tenant"]) == ("abc", "t1")
    assert "x-fleetserve-subject" not in replica.metadata  # only the gateway asserts who a caller is
    (row,) = gw.gateway.balancer.snapshot()
    assert row["reported_queue_depth"] == 4
    assert row["pending"] == 0


async def test_a_replica_at_its_cap_is_passed_over_and_all_at_cap_is_unavailable_at_once(
        grpc_front: StartGrpcFront) -> None:
    edge = EdgeConfig(shedding=ShedConfig(max_inflight=100, retry_after_s=2.0, replica_max_inflight=1))
    gw, fleet = await grpc_front(2, edge=edge, balancer=ROUND_ROBIN)
    for replica in fleet:
        replica.mode = "hang"
    first = [asyncio.ensure_future(gw.call(request=str(i).encode())) for i in range(2)]
    for replica in fleet:  # round-robin alone would send both to the same replica only by chance; the cap never
        await wait_for(replica.received)
    started = time.monotonic()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await gw.call()
    assert time.monotonic() - started < 0.5
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "every replica is at its limit of 1" in (info.value.details() or "")
    assert dict(info.value.trailing_metadata())["retry-after"] == "2"
    assert sample(gw, "fleetserve_gateway_rejected_total", {"reason": "overloaded"}) == 1
    for call in first:
        call.cancel()
    await asyncio.gather(*first, return_exceptions=True)
    for replica in fleet:
        await wait_for(replica.cancelled)


async def test_a_client_that_cancels_cancels_the_replicas_call(grpc_front: StartGrpcFront) -> None:
    gw, (replica,) = await grpc_front(1)
    replica.mode = "hang"
    call = gw.channel.unary_unary(GRPC_INFER)(b"x", timeout=30)
    await wait_for(replica.received)
    call.cancel()
    await wait_for(replica.cancelled)
    balancer = gw.gateway.balancer

    async def settled() -> None:
        while balancer.active_requests:
            await asyncio.sleep(0.01)

    await asyncio.wait_for(settled(), 5.0)
    assert balancer.snapshot()[0]["pending"] == 0


async def test_a_stalled_replica_is_hedged_and_the_losing_call_is_cancelled(grpc_front: StartGrpcFront) -> None:
    gw, (slow, fast) = await grpc_front(2, balancer=ROUND_ROBIN, hedge=EAGER)
    for _ in range(21):
        await gw.call()
    if len(slow.calls) > len(fast.calls):  # round-robin: make the next call go to `slow`
        await gw.call()
    slow.mode = "hang"
    slow.received.clear()
    answer = await gw.call()
    assert answer.startswith(b"g1|")
    await wait_for(slow.cancelled)  # the lost attempt does not keep the stalled replica busy
    assert gw.gateway.metrics.hedges.labels("won")._value.get() == 1


def test_grpc_target_uses_label_or_port_offset() -> None:
    assert grpc_target(Endpoint.from_url("http://10.0.0.5:8000"), 1) == "10.0.0.5:8001"
    assert grpc_target(Endpoint.from_url("http://[::1]:8000"), 1) == "[::1]:8001"
    labelled = Endpoint.from_url("http://h:8000", labels={"grpc_port": "9000"})
    assert grpc_target(labelled, 1) == "h:9000"


async def test_a_replica_that_leaves_the_fleet_finishes_its_calls_in_flight() -> None:
    """Draining: the channel of a removed replica closes only after its calls end; closing all the gateway's
    channels (it stops) does not wait for them."""
    replica = await GrpcReplica("g0", mode="slow", delay_s=0.3).start()
    channels = GrpcChannels(0, 1 << 20, drain_s=30.0)
    ep = Endpoint.from_url(replica.url)
    try:
        call = asyncio.ensure_future(channels.unary(ep, GRPC_INFER)(b"x", timeout=10))
        await wait_for(replica.received)
        await channels.retain([])
        assert await call == f"g0|{GRPC_INFER}|x".encode()
        replica.mode = "hang"
        stuck = asyncio.ensure_future(channels.unary(ep, GRPC_INFER)(b"y", timeout=10))
        replica.received.clear()
        await wait_for(replica.received)
        await channels.retain([])
        await asyncio.wait_for(channels.close(), 5.0)  # stopping waits for no drain
        stuck.cancel()  # as the server cancels the handler that owns the call
    finally:
        await channels.close()
        await replica.stop()
