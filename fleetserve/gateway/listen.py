"""The gateway's HTTP listener: every connection passes through the edge's :class:`ConnectionGuard`
(header-read deadline, connection cap), which acts below aiohttp where no middleware can.

One process listens through the edge's :class:`GuardedTCPSite`. Worker processes sharing one port need
``SO_REUSEPORT``, which that site does not set, so :class:`ReusePortGuardedSite` is the same guard on
a listener created with it (the kernel then spreads new connections across the workers).
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from fleetserve.gateway.edge import ConnectionGuard, GuardedTCPSite, InputLimits, RejectionObserver

BACKLOG = 1024


class ReusePortGuardedSite(web.BaseSite):
    """A guarded TCP listener bound with ``SO_REUSEPORT``."""

    __slots__ = ("_guard", "_host", "_limits", "_observer", "_port")

    def __init__(self, runner: web.BaseRunner, host: str, port: int, limits: InputLimits,
                 observer: RejectionObserver, *, backlog: int = BACKLOG) -> None:
        super().__init__(runner, backlog=backlog)
        self._host = host
        self._port = port
        self._limits = limits
        self._observer = observer
        self._guard: ConnectionGuard | None = None

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        if server is None:
            raise RuntimeError("call runner.setup() before starting a site")
        self._guard = ConnectionGuard(server, self._limits, self._observer)
        self._server = await asyncio.get_running_loop().create_server(
            self._guard, self._host, self._port, backlog=self._backlog, reuse_port=True)

    async def stop(self) -> None:
        await super().stop()
        if self._guard is not None:
            self._guard.close_rejected()


def guarded_site(runner: web.BaseRunner, host: str, port: int, limits: InputLimits, observer: RejectionObserver,
                 *, reuse_port: bool = False) -> web.BaseSite:
    """The listener for ``runner``: guarded always, shared through SO_REUSEPORT when ``reuse_port``."""
    if reuse_port:
        return ReusePortGuardedSite(runner, host, port, limits, observer)
    return GuardedTCPSite(runner, host, port, limits, observer, backlog=BACKLOG)
