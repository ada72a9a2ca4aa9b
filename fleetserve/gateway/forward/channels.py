"""One long-lived gRPC channel per replica, through which every call to it is forwarded.

A replica's gRPC address is its endpoint label ``grpc_port`` if present, else its HTTP port +
``port_offset`` (8000 -> 8001). Channels reconnect to a restarted replica within a second (gRPC's default
backoff grows to two minutes) and never retry on their own: retries are the forwarding core's.

The channel of a replica that left the fleet closes in the background, after its calls in flight finish
(within ``drain_s``): a replica removed while draining (autoscaling down) must not have its last answers
cancelled by the gateway.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Iterable

import grpc
import grpc.aio

from fleetserve.gateway.balance import Endpoint

_MAX_CACHED = 1024  # (replica, method) callables kept; clients choose method names
_CHANNEL_OPTIONS = [("grpc.max_reconnect_backoff_ms", 1000), ("grpc.initial_reconnect_backoff_ms", 100),
                    ("grpc.enable_retries", 0)]


def grpc_target(ep: Endpoint, port_offset: int) -> str:
    port = int(ep.labels.get("grpc_port", ep.port + port_offset))
    host = f"[{ep.host}]" if ":" in ep.host else ep.host
    return f"{host}:{port}"


class GrpcChannels:
    """Channels by replica URL, opened on first use; unary callables cached per (replica, method)."""

    def __init__(self, port_offset: int, max_message_bytes: int, drain_s: float = 0.0) -> None:
        self._port_offset = port_offset
        self._drain_s = drain_s
        self._draining: dict[grpc.aio.Channel, asyncio.Task[None]] = {}
        self._options = [*_CHANNEL_OPTIONS, ("grpc.max_receive_message_length", max_message_bytes),
                         ("grpc.max_send_message_length", max_message_bytes)]
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._unary: dict[tuple[str, str], grpc.aio.UnaryUnaryMultiCallable] = {}

    def channel(self, ep: Endpoint) -> grpc.aio.Channel:
        channel = self._channels.get(ep.url)
        if channel is None:
            target = grpc_target(ep, self._port_offset)
            channel = self._channels[ep.url] = grpc.aio.insecure_channel(target, options=self._options)
        return channel

    def unary(self, ep: Endpoint, method: str) -> grpc.aio.UnaryUnaryMultiCallable:
        key = (ep.url, method)
        call = self._unary.get(key)
        if call is None:
            call = self.channel(ep).unary_unary(method)
            if len(self._unary) < _MAX_CACHED:
                self._unary[key] = call
        return call

    async def retain(self, urls: Iterable[str]) -> None:
        """Close the channels of replicas that left the fleet once their calls in flight finish."""
        keep = set(urls)
        for url in [u for u in self._channels if u not in keep]:
            channel = self._channels.pop(url)
            self._draining[channel] = task = asyncio.create_task(channel.close(self._drain_s))
            task.add_done_callback(functools.partial(self._closed, channel))
        for key in [k for k in self._unary if k[0] not in keep]:
            del self._unary[key]

    def _closed(self, channel: grpc.aio.Channel, task: asyncio.Task[None]) -> None:
        self._draining.pop(channel, None)

    async def close(self) -> None:
        """Close every channel now (the gateway is stopping: the calls still in flight belong to requests
        whose handlers the server cancels, which cancels their calls)."""
        channels = list(self._channels.values())
        self._channels.clear()
        self._unary.clear()
        await asyncio.gather(*(channel.close() for channel in channels))
        for task in list(self._draining.values()):
            task.cancel()
        await asyncio.gather(*self._draining.values(), return_exceptions=True)
