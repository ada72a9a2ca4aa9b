"""The one event-loop chooser for every server and the load generator: ``auto`` → uvloop if installed → asyncio.

uvloop (libuv) spends less CPU per request on socket I/O than asyncio's selector loop, which matters for
the gateway, the replicas and a load generator that must keep up with them. Callers run the loop with
``asyncio.Runner(loop_factory=loop_factory(name))``, never by installing a global policy.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Callable

LOOPS = ("auto", "asyncio", "uvloop")


def loop_factory(name: str = "auto") -> Callable[[], asyncio.AbstractEventLoop]:
    """A factory for a new event loop of kind ``name`` (ValueError for an unknown or absent one)."""
    if name not in LOOPS:
        raise ValueError(f"unknown event loop {name!r}; choose one of {', '.join(LOOPS)}")
    if name == "asyncio" or (name == "auto" and importlib.util.find_spec("uvloop") is None):
        return asyncio.new_event_loop
    try:
        import uvloop
    except ImportError as exc:
        raise ValueError("the uvloop event loop needs uvloop: pip install 'fleetserve[fast]'") from exc
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory
