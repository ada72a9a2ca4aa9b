"""Picks the event loop the generator runs on: uvloop when installed (``auto``), else asyncio's.

uvloop (libuv) spends less CPU per request on socket I/O than asyncio's selector loop, which
matters when one generator core must keep up with a fast gateway. The loadgen never sleeps below
timer resolution, so uvloop does not busy-poll between sends.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Callable

LOOPS = ("auto", "asyncio", "uvloop")


def loop_factory(name: str = "auto") -> Callable[[], asyncio.AbstractEventLoop]:
    if name not in LOOPS:
        raise ValueError(f"unknown event loop {name!r}; choose one of {list(LOOPS)}")
    if name == "asyncio" or (name == "auto" and importlib.util.find_spec("uvloop") is None):
        return asyncio.new_event_loop
    try:
        import uvloop
    except ImportError as exc:
        raise ValueError("--loop uvloop needs uvloop: pip install 'fleetserve[fast]'") from exc
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory
