"""A real headless Chromium (Debian's `chromium`) opening a report page, watched over the DevTools
protocol: every request the page makes, every console message and uncaught error, what the page's
charts drew, and a screenshot. Driven with aiohttp's WebSocket client (Ray brings aiohttp).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infra.node import rayproc
from tests.waiting import wait_until

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
         "--remote-allow-origins=*")

#: Counts what each chart drew: the report marks its charts with `data-chart`.
CHARTS_JS = """JSON.stringify([...document.querySelectorAll('svg[data-chart]')].map(s => ({
  name: s.dataset.chart, drawn: Number(s.dataset.drawn),
  marks: s.querySelectorAll('path, rect').length,
  width: s.getBoundingClientRect().width})))"""


@dataclass
class PageVisit:
    requests: list[str] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)
    charts: list[dict[str, Any]] = field(default_factory=list)
    screenshot: bytes = b""


def chromium() -> str:
    found = shutil.which("chromium")
    assert found, "Debian's chromium is not installed (apt-get install chromium; .ci/run does)"
    return found


async def _visit(ws_url: str, page: str, width: int, height: int) -> PageVisit:
    import aiohttp

    visit = PageVisit()
    async with aiohttp.ClientSession() as session, session.ws_connect(ws_url,
                                                                       max_msg_size=0) as ws:
        ids = iter(range(1, 10_000))
        waiting: dict[int, asyncio.Future[Any]] = {}
        loaded = asyncio.Event()

        async def reader() -> None:
            async for message in ws:
                data = json.loads(message.data)
                if "id" in data and data["id"] in waiting:
                    waiting.pop(data["id"]).set_result(data.get("result", data.get("error")))
                    continue
                method, params = data.get("method"), data.get("params", {})
                if method == "Network.requestWillBeSent":
                    visit.requests.append(params["request"]["url"])
                elif method == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert"):
                    visit.console_errors.append(json.dumps(params["args"])[:300])
                elif method == "Runtime.exceptionThrown":
                    visit.console_errors.append(params["exceptionDetails"].get("text", "?"))
                elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
                    visit.console_errors.append(params["entry"].get("text", "?"))
                elif method == "Page.loadEventFired":
                    loaded.set()

        async def call(method: str, **params: Any) -> Any:
            number = next(ids)
            waiting[number] = asyncio.get_running_loop().create_future()
            await ws.send_str(json.dumps({"id": number, "method": method, "params": params}))
            return await asyncio.wait_for(waiting[number], 30)

        task = asyncio.create_task(reader())
        for domain in ("Page", "Runtime", "Log", "Network"):
            await call(f"{domain}.enable")
        await call("Emulation.setDeviceMetricsOverride", width=width, height=height,
                   deviceScaleFactor=1, mobile=False)
        await call("Page.navigate", url=page)
        await asyncio.wait_for(loaded.wait(), 60)
        await asyncio.sleep(0.5)  # late console messages and requests, if any
        result = await call("Runtime.evaluate", expression=CHARTS_JS, returnByValue=True)
        visit.charts = json.loads(result["result"]["value"])
        shot = await call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        visit.screenshot = base64.b64decode(shot["data"])
        task.cancel()
    return visit


def open_page(path: Path, width: int = 1000, height: int = 1500) -> PageVisit:
    """Open `path` in a fresh headless Chromium and report what happened."""

    port = rayproc.free_port()
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        # Its own process group: the renderer, GPU and crash-handler processes write into the
        # profile until they exit, so the whole group is stopped before the profile goes.
        browser = subprocess.Popen(
            [chromium(), *FLAGS, f"--user-data-dir={profile}", f"--remote-debugging-port={port}",
             "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)
        try:
            return asyncio.run(_visit(devtools_page(port), path.resolve().as_uri(), width, height))
        finally:
            _stop_group(browser)


def devtools_page(port: int) -> str:
    """The WebSocket address of the first page of the Chromium listening on `port`."""
    import requests

    def tab() -> str | None:
        with contextlib.suppress(requests.RequestException):
            for target in requests.get(f"http://127.0.0.1:{port}/json/list", timeout=2).json():
                if target.get("type") == "page":
                    return str(target["webSocketDebuggerUrl"])
        return None

    return str(wait_until(tab, "Chromium's DevTools endpoint", timeout=60, interval=0.5))


def _stop_group(browser: subprocess.Popen[bytes]) -> None:
    """SIGTERM to Chromium's process group, SIGKILL after 20 s, until no process of it is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(browser.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        browser.wait(timeout=20)

    def gone() -> bool:
        try:
            os.killpg(browser.pid, 0)
        except ProcessLookupError:
            return True
        return False

    try:
        wait_until(gone, "Chromium's processes to exit", timeout=20, interval=0.2)
    except AssertionError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(browser.pid, signal.SIGKILL)
        wait_until(gone, "Chromium's processes to exit after SIGKILL", timeout=20, interval=0.2)
    browser.wait(timeout=20)


def check_report_page(out: Path) -> PageVisit:
    """`invoke report`'s page in a real browser: small, no request leaves it, no console error,
    every chart drawn."""
    from infra.core.metrics.report import CHARTS

    assert out.stat().st_size < 2 * 1024 * 1024
    visit = open_page(out)
    assert visit.requests == [out.resolve().as_uri()], f"the page requested: {visit.requests}"
    assert visit.console_errors == []
    drawn = {c["name"]: c for c in visit.charts}
    assert set(drawn) == set(CHARTS)
    for name, chart in drawn.items():
        assert chart["drawn"] >= 1 and chart["marks"] >= 1 and chart["width"] > 0, (name, chart)
    assert visit.screenshot.startswith(b"\x89PNG")
    return visit


def docs_screenshot(name: str, png: bytes) -> None:
    """With RAYFLEET_DOCS_SCREENSHOTS set, keep `png` as docs/img/<name> (docs/metrics.md shows
    what a real cluster's tests saw)."""
    if os.environ.get("RAYFLEET_DOCS_SCREENSHOTS"):
        folder = Path(__file__).resolve().parents[1] / "docs" / "img"
        folder.mkdir(exist_ok=True)
        (folder / name).write_bytes(png)


def terminal_screenshot(text: str, work: Path, height: int) -> bytes:
    """What a terminal shows of `text` (e.g. `invoke top --once`), drawn by the same browser."""
    import html

    page = work / "terminal.html"
    page.write_text("<!DOCTYPE html><html><body style='background:#111;color:#eee;margin:8px'>"
                    f"<pre style='font-size:13px'>{html.escape(text)}</pre></body></html>")
    return open_page(page, 1000, height).screenshot
