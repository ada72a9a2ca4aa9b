"""The dashboard in a real browser: headless Chromium opens ``/dashboard`` of a real gateway process in front
of two real ``tiny`` replicas under light load, and sees the replica rows, the charts drawn (the replicas
chart: the ready count, autoscaling off) and a killed replica leave the healthy state. Saves
``out/dashboard.png`` (the README's screenshot comes from here)."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

import aiohttp
import pytest

from fleetserve.bench.browser import BrowserUnavailable, Page, find_chromium, launch
from tests.steady_load import steady_load
from tests.support.procs import gateway, replica

OUT = Path(__file__).parents[2] / "out"
RATE = 25.0  # requests/s of load: enough for every replica to show traffic and latency, light on 2 cores


@pytest.fixture(scope="module")
def chromium() -> str:
    try:
        return find_chromium()
    except BrowserUnavailable as exc:
        pytest.skip(f"{exc}; `make setup` installs it")


async def fleet_frame(url: str) -> dict[str, object]:
    async with aiohttp.ClientSession() as session, session.get(url + "/gateway/fleet") as res:
        frame: dict[str, object] = (await res.json())["frame"]
        return frame


async def wait_until_every_replica_served(url: str, count: int, timeout_s: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        rows = (await fleet_frame(url))["replicas"]
        assert isinstance(rows, list)
        if len(rows) == count and all(row["rps"] > 0 for row in rows):
            return
        assert asyncio.get_running_loop().time() < deadline, rows
        await asyncio.sleep(0.2)


_INKED_PIXELS = """(() => {
  const c = document.getElementById(%s);
  const data = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
  let inked = 0;
  for (let i = 3; i < data.length; i += 4) if (data[i] > 0) inked++;
  return inked;
})()"""


async def rows_by_url(page: Page) -> dict[str, list[str]]:
    rows = await page.evaluate("[...document.querySelectorAll('#replicas tr')]"
                               ".map(tr => [tr.dataset.url, [...tr.cells].map(c => c.innerText)])")
    return {url: cells for url, cells in rows}


async def test_the_dashboard_shows_a_live_fleet_in_chromium(chromium: str) -> None:
    with replica("tiny", grpc=False) as first, replica("tiny", grpc=False) as second, \
            gateway([first.url, second.url]) as front:
        async with steady_load(front.url, RATE):
            await wait_until_every_replica_served(front.url, 2)
            async with launch(chromium) as browser:
                page = await browser.open(front.url + "/dashboard", width=1280, height=560)
                rendered_ms = int(await page.wait_for("document.body?.dataset.renderedAt", timeout_s=10))
                assert rendered_ms < 1000, f"first render {rendered_ms} ms after navigation started"
                await page.wait_for("Number(document.body?.dataset.frames) >= 3", timeout_s=15)
                rows = await rows_by_url(page)
                assert set(rows) == {first.url, second.url}
                assert all(cells[1].startswith("healthy") for cells in rows.values()), rows
                for chart in ("traffic", "latency", "scaling"):
                    assert int(await page.evaluate(f"document.getElementById('{chart}').dataset.points")) >= 2
                    assert await page.evaluate(_INKED_PIXELS % json.dumps(chart)) > 500
                assert float(await page.evaluate("document.getElementById('rps').innerText")) > 0

                first.popen.send_signal(signal.SIGKILL)  # a crash: the gateway ejects it, probes mark it down
                await page.wait_for(f"""[...document.querySelectorAll('#replicas tr')]
                    .some(tr => tr.dataset.url === {json.dumps(first.url)}
                                && !tr.cells[1].innerText.startsWith("healthy"))""", timeout_s=20)
                assert (await rows_by_url(page))[second.url][1].startswith("healthy")
                await page.wait_for("Number(document.body?.dataset.frames) >= 6", timeout_s=15)
                shot = await page.screenshot(OUT / "dashboard.png")
    assert shot.stat().st_size > 10_000
