"""Opens a local HTML file in headless Chromium (Debian's `chromium`) over the DevTools protocol and reports what a
person would see: console errors, uncaught exceptions, network requests, images that failed to decode, a screenshot.

No browser download and no driver: Chromium's own `--remote-debugging-port`, and `websocket-client` for the socket.
`scripts/ensure_chromium.sh` installs the browser (`make test` runs it).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

# What headless Chromium needs on these machines (as root, no display, no network beyond loopback); both browser
# harnesses (this one and the reward calculator's selenium one) start from it.
BASE_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
              "--disable-background-networking", "--disable-component-update", "--disable-sync",
              "--disable-dev-shm-usage"]
FLAGS = [*BASE_FLAGS, "--hide-scrollbars", "--remote-debugging-port=0", "--remote-allow-origins=*"]


def find_chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def needs_chromium() -> None:
    """Skips off CI when the browser is missing; on CI (`make test` installs it) a missing browser fails."""
    import pytest

    if find_chromium():
        return
    reason = "headless chromium is not installed (scripts/ensure_chromium.sh; Debian: apt-get install chromium)"
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


class Page:
    """One Chromium tab driven over CDP; collects console/log/exception/network events as they arrive."""

    def __init__(self, ws_url: str):
        import websocket  # websocket-client

        self.ws = websocket.create_connection(ws_url, timeout=30, suppress_origin=True)
        self.next_id = 0
        self.events: list[dict] = []

    def send(self, method: str, **params) -> dict:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"CDP {method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def wait_for(self, method: str, timeout: float = 30) -> None:
        deadline = time.time() + timeout
        while not any(e.get("method") == method for e in self.events):
            if time.time() > deadline:
                raise TimeoutError(f"no {method} within {timeout} s")
            self.events.append(json.loads(self.ws.recv()))

    def close(self) -> None:
        self.ws.close()


def open_page(path: str | Path, screenshot: str | Path | None = None, width: int = 1200) -> dict:
    """Loads `path` and returns {errors, requests, broken_images, images, title, text}; saves a full-page PNG.

    `errors` are console.error/assert calls, uncaught exceptions and browser log entries of level error (CSP
    violations, failed loads); `requests` are URLs fetched that are neither the file itself nor data: URIs.
    """
    binary = find_chromium()
    if binary is None:
        raise FileNotFoundError("chromium is not installed; run scripts/ensure_chromium.sh (Debian: apt-get install "
                                "chromium)")
    url = Path(path).resolve().as_uri()
    # Chromium's helper processes may still write into the profile after the main process exits; a failed removal
    # of that scratch folder says nothing about the page, so it must not fail the test (seen once under load).
    with tempfile.TemporaryDirectory(prefix="vlrl-chromium-", ignore_cleanup_errors=True) as profile:
        proc = subprocess.Popen([binary, *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},900",
                                 "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            port_file = Path(profile) / "DevToolsActivePort"
            deadline = time.time() + 60
            while not (port_file.exists() and port_file.read_text().count("\n") >= 1):
                if proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"chromium did not start (exit code {proc.poll()})")
                time.sleep(0.1)
            port = int(port_file.read_text().splitlines()[0])
            targets = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10).read())
            page = Page(next(t for t in targets if t["type"] == "page")["webSocketDebuggerUrl"])
            try:
                for domain in ("Page", "Runtime", "Log", "Network"):
                    page.send(f"{domain}.enable")
                page.send("Page.navigate", url=url)
                page.wait_for("Page.loadEventFired")
                result = page.send("Runtime.evaluate", returnByValue=True, expression="""({
                    title: document.title,
                    text: document.body.innerText,
                    images: document.images.length,
                    broken: [...document.images].filter(i => !i.complete || i.naturalWidth === 0).map(i => i.alt),
                    height: document.documentElement.scrollHeight})""")["result"]["value"]
                if screenshot:
                    shot = page.send("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                                     clip={"x": 0, "y": 0, "width": width, "height": result["height"], "scale": 1})
                    Path(screenshot).write_bytes(base64.b64decode(shot["data"]))
                time.sleep(0.2)  # late console messages
                page.send("Runtime.evaluate", expression="1")  # drains events queued meanwhile
                events = page.events
            finally:
                page.close()
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
    errors = []
    for e in events:
        method, params = e.get("method"), e.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            errors.append("console: " + " ".join(str(a.get("value", a.get("description"))) for a in params["args"]))
        elif method == "Runtime.exceptionThrown":
            errors.append("exception: " + params["exceptionDetails"].get("text", ""))
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            errors.append(f"log ({params['entry']['source']}): {params['entry']['text']}")
    requests = [e["params"]["request"]["url"] for e in events if e.get("method") == "Network.requestWillBeSent"]
    requests = [u for u in requests if u != url and not u.startswith("data:")]
    return {"errors": errors, "requests": requests, "broken_images": result["broken"], "images": result["images"],
            "title": result["title"], "text": result["text"]}
