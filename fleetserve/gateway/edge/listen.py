"""The gateway's HTTP listener: every connection passes through the edge's :class:`ConnectionGuard`
(header-read deadline, connection cap), which acts below aiohttp where no middleware can. Worker processes
sharing one port bind it with ``SO_REUSEPORT``.
"""

from __future__ import annotations

from aiohttp import web

from fleetserve.gateway.edge import GuardedTCPSite, InputLimits, RejectionObserver

BACKLOG = 1024


def guarded_site(runner: web.BaseRunner, host: str, port: int, limits: InputLimits, observer: RejectionObserver,
                 *, reuse_port: bool = False) -> web.BaseSite:
    """The listener for ``runner``: guarded always, shared through SO_REUSEPORT when ``reuse_port``."""
    return GuardedTCPSite(runner, host, port, limits, observer, backlog=BACKLOG, reuse_port=reuse_port or None)
