from __future__ import annotations

import asyncio
import importlib.util

import pytest

from fleetserve.eventloop import loop_factory


def test_asyncio_loop_on_request() -> None:
    assert loop_factory("asyncio") is asyncio.new_event_loop


def test_auto_prefers_uvloop_when_installed() -> None:
    loop = loop_factory("auto")()
    try:
        expected = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
        assert type(loop).__module__.split(".")[0] == expected
    finally:
        loop.close()


def test_unknown_loop_is_named() -> None:
    with pytest.raises(ValueError, match="unknown event loop"):
        loop_factory("trio")
