"""A real headless Chromium a test drives through several pages, as a person would: open an
address, type into a form, follow links, read the page's text, take screenshots. Over the
DevTools protocol with aiohttp's WebSocket client, like tests/browser_metrics.py (whose browser
start and stop it shares). The server's certificate is trusted by its public key alone
(`--ignore-certificate-errors-spki-list`), as a member who installed the cluster's CA would.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from infra.node import rayproc
from tests.browser_metrics import FLAGS, _stop_group, chromium, devtools_page


def spki_pin(cert_pem: bytes) -> str:
    """Chromium's pin of a certificate: base64 of the SHA-256 of its SubjectPublicKeyInfo."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    key = x509.load_pem_x509_certificate(cert_pem).public_key()
    der = key.public_bytes(serialization.Encoding.DER,
                           serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(hashlib.sha256(der).digest()).decode()


class Page:
    """One tab of the browser; every method waits for its answer (30 s at most)."""

    def __init__(self, ws_url: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.requests: list[tuple[str, int]] = []
        self._ids = iter(range(1, 1_000_000))
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self._loaded = asyncio.Event()
        self._run(self._connect(ws_url))

    def _run(self, coroutine: Any, timeout: float = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    async def _connect(self, ws_url: str) -> None:
        import aiohttp

        self._session = aiohttp.ClientSession()
        self._ws = await self._session.ws_connect(ws_url, max_msg_size=0)
        self._reader = asyncio.create_task(self._read())
        for domain in ("Page", "Runtime", "Network"):
            await self._call(f"{domain}.enable")
        await self._call("Emulation.setDeviceMetricsOverride", width=1280, height=900,
                         deviceScaleFactor=1, mobile=False)

    async def _read(self) -> None:
        async for message in self._ws:
            data = json.loads(message.data)
            if "id" in data and data["id"] in self._waiting:
                self._waiting.pop(data["id"]).set_result(data.get("result", data.get("error")))
            elif data.get("method") == "Network.responseReceived":
                response = data["params"]["response"]
                self.requests.append((response["url"], int(response["status"])))
            elif data.get("method") == "Page.loadEventFired":
                self._loaded.set()

    async def _call(self, method: str, **params: Any) -> Any:
        number = next(self._ids)
        self._waiting[number] = asyncio.get_running_loop().create_future()
        await self._ws.send_str(json.dumps({"id": number, "method": method, "params": params}))
        return await asyncio.wait_for(self._waiting[number], 30)

    async def _navigate(self, url: str) -> None:
        self._loaded.clear()
        started = await self._call("Page.navigate", url=url)
        # A new fragment of the same page (the dashboard's `#/jobs`) loads no new document: the
        # answer then names no loader, and no load event follows.
        if started.get("loaderId"):
            await asyncio.wait_for(self._loaded.wait(), 60)

    def open(self, url: str) -> None:
        self._run(self._navigate(url))

    def evaluate(self, expression: str) -> Any:
        result = self._run(self._call("Runtime.evaluate", expression=expression,
                                      returnByValue=True, awaitPromise=True))
        return result["result"].get("value")

    def submit_form(self, fields: dict[str, str]) -> None:
        """Fill the page's first form and submit it; waits for the page it leads to."""
        script = "".join(f"document.querySelector({json.dumps('#' + k)}).value = {json.dumps(v)};"
                         for k, v in fields.items())

        async def go() -> None:
            self._loaded.clear()
            await self._call("Runtime.evaluate", expression=script + "document.forms[0].submit()")
            await asyncio.wait_for(self._loaded.wait(), 60)

        self._run(go())

    def text(self) -> str:
        return str(self.evaluate("document.body ? document.body.innerText : ''"))

    def screenshot(self) -> bytes:
        shot = self._run(self._call("Page.captureScreenshot", format="png"))
        return base64.b64decode(shot["data"])

    def close(self) -> None:
        async def stop() -> None:
            self._reader.cancel()
            await self._ws.close()
            await self._session.close()

        with contextlib.suppress(Exception):
            self._run(stop(), timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)


@contextlib.contextmanager
def browser(trusted_cert_pem: bytes) -> Iterator[Page]:
    """A fresh headless Chromium (its own profile) trusting the given server certificate."""
    port = rayproc.free_port()
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        process = subprocess.Popen(
            [chromium(), *FLAGS, f"--user-data-dir={profile}", f"--remote-debugging-port={port}",
             f"--ignore-certificate-errors-spki-list={spki_pin(trusted_cert_pem)}",
             "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)
        page: Page | None = None
        try:
            page = Page(devtools_page(port))
            yield page
        finally:
            if page is not None:
                page.close()
            _stop_group(process)


def keep_screenshot(png: bytes, folder: Path, name: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(png)
    return path
