"""The edge guards on the gRPC listener: JWT from the ``authorization`` metadata, rate limits, the in-flight
cap and the adaptive concurrency limit, shared with HTTP, in a real in-process gateway in front of grpc.aio
replicas."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import grpc
import grpc.aio
import pytest

from fleetserve.gateway.edge import EdgeConfig, JwtConfig, KeySpec, RateLimitRule, RouteScope, ShedConfig
from fleetserve.gateway.edge.config import AdaptiveConcurrencyConfig
from fleetserve.gateway.edge.grpc import grpc_status, peer_address
from fleetserve.gateway.edge.rejection import Rejection
from tests.support.grpc_replica import GRPC_INFER, SERVICE, GrpcFront, StartGrpcFront
from tests.support.jwt_keys import AUDIENCE, ISSUER, SigningKey, claims, write


def test_peer_address_is_the_ip_of_a_grpc_peer() -> None:
    assert peer_address("ipv4:10.0.0.5:41234") == "10.0.0.5"
    assert peer_address("ipv6:[::1]:41234") == "::1"
    assert peer_address("unix:/run/gw.sock") == "unix:/run/gw.sock"
    assert peer_address(None) is None


def test_a_rejection_becomes_the_grpc_status_of_its_http_one() -> None:
    assert grpc_status(Rejection(401, "missing_token", "no", {"WWW-Authenticate": "Bearer"})) == (
        "UNAUTHENTICATED", (("www-authenticate", "Bearer"),))
    assert grpc_status(Rejection(429, "rate_limited", "slow down", {"Retry-After": "3"}))[0] == "RESOURCE_EXHAUSTED"
    assert grpc_status(Rejection(503, "overloaded", "busy"))[0] == "UNAVAILABLE"



async def first_admitted(gw: GrpcFront) -> bytes:
    """The answer to the first call the gateway admits, retrying its UNAVAILABLE refusals for up to 5 s: a
    cancelled call's slot comes back when the gateway's handler unwinds, a moment after the replica saw it go."""

    async def attempt() -> bytes:
        while True:
            try:
                return await gw.call()
            except grpc.aio.AioRpcError as err:
                assert err.code() == grpc.StatusCode.UNAVAILABLE
                await asyncio.sleep(0.01)

    return await asyncio.wait_for(attempt(), 5.0)

def jwt_edge(tmp_path: Path, key: SigningKey) -> EdgeConfig:
    pem = write(tmp_path, "rsa.pem", key.public_pem)
    jwt = JwtConfig(keys=(KeySpec("pem", pem, ("RS256",)),), issuers=(ISSUER,), audiences=(AUDIENCE,),
                    route_scopes=(RouteScope(SERVICE + "ModelInfer", scopes=("infer",)),))
    return EdgeConfig(jwt=jwt)


async def test_jwt_guards_grpc_calls(grpc_front: StartGrpcFront, tmp_path: Path,
                                     signing_keys: dict[str, SigningKey]) -> None:
    key = signing_keys["rsa"]
    gw, (replica,) = await grpc_front(1, edge=jwt_edge(tmp_path, key))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await gw.call()
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED and "missing bearer token" in info.value.details()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await gw.call(metadata=(("authorization", "Bearer " + key.sign(claims(exp=1))),))
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED and "expired" in info.value.details()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await gw.call(metadata=(("authorization", "Bearer " + key.sign(claims(scope="read"))),))
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED and "infer" in info.value.details()
    assert replica.calls == []
    token = key.sign(claims(sub="alice", scope="infer"))
    forged = (("authorization", "Bearer " + token), ("x-fleetserve-subject", "mallory"))
    assert await gw.call(metadata=forged) == b"g0|" + GRPC_INFER.encode() + b"|x"
    assert replica.metadata["x-fleetserve-subject"] == "alice"  # the verified caller, never the client's claim
    assert await gw.call(SERVICE + "ServerLive") == f"g0|{SERVICE}ServerLive|x".encode()  # probes need no token
    rejected = gw.gateway.metrics.registry.get_sample_value
    assert rejected("fleetserve_gateway_rejected_total", {"reason": "missing_token"}) == 1
    assert rejected("fleetserve_gateway_rejected_total", {"reason": "insufficient_scope"}) == 1


async def test_rate_limits_guard_grpc_calls(grpc_front: StartGrpcFront) -> None:
    edge = EdgeConfig(rate_limits=(RateLimitRule(rate=0.01, burst=2),))
    gw, (replica,) = await grpc_front(1, edge=edge)
    for _ in range(2):
        await gw.call()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await gw.call()
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    trailer = dict(info.value.trailing_metadata())
    assert int(trailer["retry-after"]) >= 1 and trailer["ratelimit-limit"] == "2"
    assert len(replica.calls) == 2


async def test_the_in_flight_cap_counts_both_listeners(grpc_front: StartGrpcFront,
                                                      client: aiohttp.ClientSession) -> None:
    edge = EdgeConfig(shedding=ShedConfig(max_inflight=1, retry_after_s=3.0))
    gw, (replica,) = await grpc_front(1, edge=edge)
    replica.mode = "hang"
    held = asyncio.ensure_future(gw.call())
    await asyncio.wait_for(replica.received.wait(), 5.0)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await gw.call()
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert dict(info.value.trailing_metadata())["retry-after"] == "3"
    async with client.post(gw.gateway.url + "/v2/models/m/infer", data=b"{}") as res:
        assert res.status == 503 and res.headers["Retry-After"] == "3"  # the gRPC call holds the one slot
    held.cancel()
    await asyncio.gather(held, return_exceptions=True)
    await asyncio.wait_for(replica.cancelled.wait(), 5.0)
    replica.mode = "ok"

    assert (await first_admitted(gw)).startswith(b"g0|")


async def test_the_adaptive_limit_refuses_grpc_calls_at_once_and_counts_both_listeners(
        grpc_front: StartGrpcFront, client: aiohttp.ClientSession) -> None:
    adaptive = AdaptiveConcurrencyConfig(enabled=True, min_concurrency=1, initial_concurrency=1, max_concurrency=1,
                                         retry_after_s=2.0)
    gw, (replica,) = await grpc_front(1, edge=EdgeConfig(adaptive=adaptive))
    replica.mode = "hang"
    held = asyncio.ensure_future(gw.call())
    await asyncio.wait_for(replica.received.wait(), 5.0)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await gw.call()
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE and "adaptive concurrency limit" in info.value.details()
    assert dict(info.value.trailing_metadata())["retry-after"] == "2"
    async with client.post(gw.gateway.url + "/v2/models/m/infer", data=b"{}") as res:
        assert res.status == 503 and res.headers["Retry-After"] == "2"  # the gRPC call holds the one slot
    assert len(replica.calls) == 1
    rejected = gw.gateway.metrics.registry.get_sample_value
    assert rejected("fleetserve_gateway_rejected_total", {"reason": "concurrency_limited"}) == 2
    held.cancel()
    await asyncio.gather(held, return_exceptions=True)
    await asyncio.wait_for(replica.cancelled.wait(), 5.0)
    replica.mode = "ok"

    assert (await first_admitted(gw)).startswith(b"g0|")  # the cancelled call gave its slot back
    assert await gw.call(SERVICE + "ServerLive") == f"g0|{SERVICE}ServerLive|x".encode()
