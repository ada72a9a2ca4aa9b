"""The public HTTP listener on Granian (``--server granian``, the default): Granian's embedded server in the
gateway's own event loop, serving the RSGI application of :mod:`fleetserve.gateway.forward.rsgi`.

The embedded server (``granian.server.embed``, marked experimental by Granian; the range in ``pyproject.toml``
pins the API) runs one Granian worker as a task of this loop, so the gateway's balancer, guards and metrics
stay one per process as on aiohttp, and ``--workers N`` shares the port the same way: Granian binds every
listener with ``SO_REUSEPORT``. Port 0 is resolved here first, by binding (not listening on) a port with
``SO_REUSEPORT`` and holding it until Granian listens on it.

What the input limits become on Granian (HTTP/1.1 only, like the aiohttp front):
- ``header_read_timeout_s``: Granian's (hyper's) header-read timeout, which also bounds how long an idle
  kept-alive connection waits for its next request; ``keepalive_timeout_s`` has no other counterpart here.
- ``max_header_bytes``: the application answers 431 beyond it; hyper's read buffer is sized to it as well
  (at least 8 KiB), so a larger head is refused before it is buffered.
- ``max_connections``: Granian has no connection cap; it becomes Granian's ``backpressure``, the most
  requests one worker serves at once (the rest wait in the kernel's accept queue).

Granian reads and writes the sockets on threads of its own, which hand each request to the event loop and take
its answer back: a thread wakes about twice per request. Where it shares a CPU with the loop (one CPU per
worker, or a pinned process), the scheduler lets each wake-up preempt the loop, so at saturation the two
threads switch about twice per request and each switch costs both of them their caches. With ``batch_threads``
(the default) Granian's threads run under ``SCHED_BATCH`` (sched(7)): Linux does not let a waking batch thread
preempt the running one, so the loop runs until it waits, and Granian's thread then does the I/O of every
request that became ready meanwhile. A batch thread gets its fair share of CPU as before; an idle CPU still
runs it at once. Measured at saturation on one CPU (BENCHMARKS.md §4.3): 0.06 instead of 1.8 context switches
per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading
from typing import Any

from fleetserve.gateway.edge.config import InputLimits

log = logging.getLogger(__name__)

BACKLOG = 1024
_MIN_BUFFER = 8192
_READY_TIMEOUT_S = 10.0


def _reserve(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` with SO_REUSEPORT (and SO_REUSEADDR) and not listening: it holds the port
    (port 0: a free one) for a listener that binds it the same way; OSError when it is taken.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    # SO_REUSEADDR as every server sets it: connections of an earlier listener in TIME_WAIT do not block the port.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def thread_ids() -> set[int]:
    """This process's thread ids (Linux; empty elsewhere)."""
    try:
        return {int(tid) for tid in os.listdir("/proc/self/task")}
    except OSError:
        return set()


def batch_schedule(tids: set[int]) -> int:
    """Put threads ``tids`` under ``SCHED_BATCH``; how many it could (a thread gone meanwhile, or a system that
    refuses, is left as it was)."""
    policy = getattr(os, "SCHED_BATCH", None)
    if policy is None:
        return 0
    done = 0
    for tid in tids:
        try:
            os.sched_setscheduler(tid, policy, os.sched_param(0))
        except OSError as exc:
            log.debug("thread %d stays under its scheduling policy: %s", tid, exc)
        else:
            done += 1
    return done


def _loopback(host: str) -> str:
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    return "::1" if host == "::" else host


class GranianListener:
    """One embedded Granian server serving ``app`` on ``host:port`` until :meth:`stop`."""

    def __init__(self, server: Any, task: asyncio.Task[None], port: int) -> None:
        self._server = server
        self._task = task
        self.port = port

    @classmethod
    async def start(cls, app: Any, host: str, port: int, limits: InputLimits, *,
                    batch_threads: bool = True) -> GranianListener:
        """Listen, or OSError naming the address; ``batch_threads``: see the module docstring."""
        from granian.constants import HTTPModes, Interfaces
        from granian.http import HTTP1Settings
        from granian.server.embed import Server

        reserved = _reserve(host, port)
        try:
            port = reserved.getsockname()[1]
            settings = HTTP1Settings(header_read_timeout=max(1, int(limits.header_read_timeout_s * 1000)),
                                     keep_alive=True, max_buffer_size=max(_MIN_BUFFER, limits.max_header_bytes))
            server = Server(app, address=host, port=port, interface=Interfaces.RSGI, http=HTTPModes.http1,
                            websockets=False, backlog=BACKLOG, backpressure=limits.max_connections,
                            http1_settings=settings, log_enabled=False)
            before = thread_ids()
            task = asyncio.create_task(server.serve())
            await cls._ready(task, _loopback(host), port)
            if batch_threads:
                # The threads Granian started; the loop's own thread (this one) stays as it is.
                batch_schedule(thread_ids() - before - {threading.get_native_id()})
        finally:
            reserved.close()
        return cls(server, task, port)

    @staticmethod
    async def _ready(task: asyncio.Task[None], host: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _READY_TIMEOUT_S
        while True:
            await asyncio.sleep(0.005)
            if task.done():
                raise OSError(f"Granian cannot listen on {host}:{port}")
            with contextlib.suppress(OSError):
                _, writer = await asyncio.open_connection(host, port)
                writer.close()
                return
            if loop.time() > deadline:
                task.cancel()
                raise OSError(f"Granian did not listen on {host}:{port} within {_READY_TIMEOUT_S:g} s")

    async def stop(self, grace_s: float) -> None:
        """Stop accepting, let requests in progress finish for up to ``grace_s``, then stop."""
        self._server.stop()
        try:
            await asyncio.wait_for(asyncio.shield(self._task), grace_s)
        except TimeoutError:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
