"""Headless Chromium driven over the Chrome DevTools Protocol (CDP), for tests and benchmarks of the dashboard.

The browser is the Debian ``chromium`` package (browser automation packages on PyPI download a browser build
of their own, which this project cannot fetch). It starts with a fresh profile in a temporary folder and
``--remote-debugging-port=0``; the DevTools websocket address it prints on stderr is where
:class:`Browser` connects (aiohttp's websocket client). A page is a target attached in *flat* mode, so
every command names its session on the one browser connection
(https://chromedevtools.github.io/devtools-protocol/). Only what the callers need is here: open a page,
evaluate JavaScript, wait for a condition by polling it against a deadline, take a screenshot.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections import deque
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

CANDIDATES = ("chromium", "chromium-browser", "google-chrome")
_LISTENING = re.compile(r"DevTools listening on (ws://\S+)")
# What keeps a headless browser in a test from reaching out or doing background work.
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--disable-extensions", "--hide-scrollbars", "--mute-audio",
         "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0")


class BrowserUnavailable(RuntimeError):
    """No Chromium binary on this machine."""


class BrowserError(RuntimeError):
    """The browser answered a command with an error, or a page's script threw."""


def find_chromium() -> str:
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    raise BrowserUnavailable("chromium is not installed (Debian package chromium)")


class Page:
    """One tab, attached to the browser connection as a CDP session."""

    def __init__(self, browser: Browser, session_id: str) -> None:
        self._browser = browser
        self._session = session_id

    async def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return await self._browser.send(method, params, session_id=self._session)

    async def evaluate(self, expression: str) -> Any:
        """The JSON value of ``expression`` in the page (promises awaited)."""
        reply = await self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                     "awaitPromise": True})
        if "exceptionDetails" in reply:
            raise BrowserError(f"{expression!r} threw: {reply['exceptionDetails'].get('text')}")
        return reply["result"].get("value")

    async def wait_for(self, expression: str, timeout_s: float, poll_s: float = 0.05) -> Any:
        """Evaluate ``expression`` until it is truthy and return that value; TimeoutError past ``timeout_s``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            value = await self.evaluate(expression)
            if value:
                return value
            if loop.time() >= deadline:
                raise TimeoutError(f"{expression!r} still {value!r} after {timeout_s} s")
            await asyncio.sleep(poll_s)

    async def screenshot(self, path: Path) -> Path:
        reply = await self.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(reply["data"]))
        return path


class Browser:
    """A running headless Chromium and its DevTools connection; use :func:`launch`."""

    def __init__(self, process: subprocess.Popen[bytes], socket: aiohttp.ClientWebSocketResponse) -> None:
        self.process = process
        self._socket = socket
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for message in self._socket:
            if message.type is not aiohttp.WSMsgType.TEXT:
                break
            data = message.json()
            future = self._waiting.pop(data.get("id", -1), None)
            if future is not None and not future.done():
                future.set_result(data)
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(BrowserError("the browser closed its DevTools connection"))

    async def send(self, method: str, params: dict[str, Any] | None = None, *, session_id: str | None = None,
                   timeout_s: float = 30.0) -> dict[str, Any]:
        message: dict[str, Any] = {"id": next(self._ids), "method": method, "params": params or {}}
        if session_id is not None:
            message["sessionId"] = session_id
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[message["id"]] = future
        await self._socket.send_json(message)
        reply = await asyncio.wait_for(future, timeout_s)
        if "error" in reply:
            raise BrowserError(f"{method}: {reply['error'].get('message')}")
        result: dict[str, Any] = reply.get("result", {})
        return result

    async def open(self, url: str, width: int = 1280, height: int = 900) -> Page:
        """A new tab showing ``url`` (returns once the navigation is committed)."""
        target = await self.send("Target.createTarget", {"url": "about:blank"})
        attached = await self.send("Target.attachToTarget", {"targetId": target["targetId"], "flatten": True})
        page = Page(self, attached["sessionId"])
        await page.send("Page.enable")
        await page.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": height,
                                                               "deviceScaleFactor": 1, "mobile": False})
        navigated = await page.send("Page.navigate", {"url": url})
        if navigated.get("errorText"):
            raise BrowserError(f"cannot open {url}: {navigated['errorText']}")
        return page


def _pump(stream: Any, found: asyncio.Future[str], loop: asyncio.AbstractEventLoop, tail: deque[str]) -> None:
    """Read the browser's stderr to its end (so it never blocks on a full pipe); report the DevTools URL."""

    def settle(url: str | None) -> None:
        if found.done():
            return
        if url is None:
            found.set_exception(BrowserError("chromium exited before listening:\n" + "\n".join(tail)))
        else:
            found.set_result(url)

    for raw in stream:
        line = raw.decode(errors="replace").rstrip()
        tail.append(line)
        match = _LISTENING.search(line)
        if match:
            loop.call_soon_threadsafe(settle, match.group(1))
    with contextlib.suppress(RuntimeError):  # the loop is already closed: nobody waits any more
        loop.call_soon_threadsafe(settle, None)


@contextlib.asynccontextmanager
async def launch(binary: str | None = None, timeout_s: float = 60.0) -> AsyncIterator[Browser]:
    """Start headless Chromium with a fresh profile; stop it and remove the profile on exit."""
    binary = binary or find_chromium()
    profile = tempfile.mkdtemp(prefix="fleetserve-chromium-")
    env = {**os.environ, "HOME": profile}  # nothing of the user's (or root's) own profile is read or written
    process = subprocess.Popen([binary, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    loop = asyncio.get_running_loop()
    found: asyncio.Future[str] = loop.create_future()
    tail: deque[str] = deque(maxlen=40)
    threading.Thread(target=_pump, args=(process.stderr, found, loop, tail), daemon=True).start()
    session = aiohttp.ClientSession()
    browser: Browser | None = None
    try:
        url = await asyncio.wait_for(found, timeout_s)
        socket = await session.ws_connect(url, max_msg_size=64 * 1024 * 1024)
        browser = Browser(process, socket)
        yield browser
    finally:
        if browser is not None:
            with contextlib.suppress(BrowserError, asyncio.TimeoutError, aiohttp.ClientError):
                await browser.send("Browser.close", timeout_s=5.0)
            browser._reader.cancel()
        await session.close()
        try:
            await asyncio.to_thread(process.wait, 10)
        except subprocess.TimeoutExpired:
            process.kill()
            await asyncio.to_thread(process.wait, 5)
        shutil.rmtree(profile, ignore_errors=True)
