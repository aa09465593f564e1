"""Headless Chromium driven over the DevTools protocol (websocket-client): what the browser
tests (tests/serve/test_report.py and the explorer's) and the explorer's benchmark share.

No network: every name resolves to nothing (`host_rules`), and a proxy that answers nothing
catches the rest; the explorer's callers exclude 127.0.0.1, where its server listens.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

OFFLINE = "MAP * ~NOTFOUND"
# Chromium starts slowly on a loaded machine: generous waits, never a verdict on speed.
WAIT_SECONDS = 120


class DevTools:
    """A minimal DevTools protocol client: commands, and the events seen meanwhile."""

    def __init__(self, url: str) -> None:
        import websocket

        self.socket = websocket.create_connection(url, timeout=WAIT_SECONDS, suppress_origin=True)
        self.events: list[dict[str, Any]] = []
        self.next_id = 0

    def _call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        self.socket.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message: dict[str, Any] = json.loads(self.socket.recv())
            if message.get("id") == self.next_id:
                return message
            self.events.append(message)

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        message = self._call(method, **params)
        if "error" in message:
            raise RuntimeError(f"DevTools {method}: {message['error']}")
        return dict(message["result"])

    def evaluate(self, expression: str) -> Any:
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        return result["result"].get("value")

    def evaluate_soft(self, expression: str) -> Any:
        """None while the page is between two documents (DevTools answers with an error)."""
        message = self._call("Runtime.evaluate", expression=expression, returnByValue=True)
        return message.get("result", {}).get("result", {}).get("value")


@contextmanager
def browser(chromium: str, profile: Path, host_rules: str = OFFLINE) -> Iterator[DevTools]:
    """Chromium at `chromium` with its profile in `profile`, one blank page to drive; ended on
    leaving."""
    process = subprocess.Popen(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", f"--user-data-dir={profile}", "--remote-debugging-port=0",
         "--remote-debugging-address=127.0.0.1", "--proxy-server=127.0.0.1:9",
         f"--host-resolver-rules={host_rules}", "--window-size=1280,900", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + WAIT_SECONDS
        while not port_file.is_file() or not port_file.read_text().strip():
            if time.monotonic() > deadline:
                raise RuntimeError("Chromium did not open its DevTools port")
            time.sleep(0.1)
        port = port_file.read_text().split()[0]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=30) as answer:
            page = next(t for t in json.load(answer) if t["type"] == "page")
        tools = DevTools(page["webSocketDebuggerUrl"])
        try:
            yield tools
        finally:
            tools.socket.close()
    finally:
        process.terminate()
        process.wait(timeout=30)
