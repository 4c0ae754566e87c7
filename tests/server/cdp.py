"""A minimal Chrome DevTools Protocol client over ``--remote-debugging-pipe`` for the playground test.

It drives the Debian ``chromium`` binary directly: no browser download, no websocket library. Chromium reads
NUL-terminated JSON commands on fd 3 and writes replies and events on fd 4.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--disable-extensions", "--mute-audio", "--hide-scrollbars"]


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _above(fd: int, low: int = 10) -> int:
    high = fcntl.fcntl(fd, fcntl.F_DUPFD, low)
    os.close(fd)
    return high


class CDPError(RuntimeError):
    pass


class Browser:
    """One headless Chromium with a fresh profile; ``page()`` opens a tab to drive."""

    def __init__(self, executable: str, timeout: float = 30.0) -> None:
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="cinq-chromium-")
        cmd_r, self._cmd_w = os.pipe()  # we write commands, chromium reads them on fd 3
        self._out_r, out_w = os.pipe()  # chromium writes on fd 4, we read
        cmd_r, out_w = _above(cmd_r), _above(out_w)  # so that moving them onto 3 and 4 cannot clobber them
        argv = [executable, *CHROMIUM_FLAGS, "--remote-debugging-pipe", f"--user-data-dir={self.profile}",
                "about:blank"]
        # bash puts the pipe ends on the fd numbers chromium expects, then becomes chromium.
        shell = f'exec "$@" 3<&{cmd_r} 4>&{out_w} {cmd_r}<&- {out_w}>&-'
        self.proc = subprocess.Popen(["bash", "-c", shell, "chromium", *argv], pass_fds=(cmd_r, out_w),
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE)
        os.close(cmd_r)
        os.close(out_w)
        self._next_id = 0
        self._replies: dict[int, dict] = {}
        self.events: list[dict] = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        buf = b""
        while True:
            try:
                data = os.read(self._out_r, 1 << 16)
            except OSError:
                data = b""
            if not data:
                with self._cond:
                    self._cond.notify_all()
                return
            buf += data
            while b"\0" in buf:
                raw, buf = buf.split(b"\0", 1)
                msg = json.loads(raw)
                with self._cond:
                    if "id" in msg:
                        self._replies[msg["id"]] = msg
                    else:
                        self.events.append(msg)
                    self._cond.notify_all()

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        """Send a command and wait for its reply; raises CDPError on a protocol error."""
        with self._cond:
            self._next_id += 1
            msg_id = self._next_id
        msg: dict = {"id": msg_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        with self._cond:
            while msg_id not in self._replies:
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    raise CDPError(f"{method}: no reply (chromium exit code {self.proc.poll()})")
                self._cond.wait(min(left, 0.5))
            reply = self._replies.pop(msg_id)
        if "error" in reply:
            raise CDPError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    def page(self, width: int = 1200, height: int = 800) -> Page:
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        page = Page(self, session)
        page.send("Page.enable")
        page.send("Runtime.enable")
        page.send("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
        return page

    def close(self) -> None:
        try:
            self.send("Browser.close")
        except (CDPError, OSError):
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        for fd in (self._cmd_w, self._out_r):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.profile, ignore_errors=True)


class Page:
    """One tab: navigate, evaluate JavaScript, type, press keys, screenshot."""

    def __init__(self, browser: Browser, session: str) -> None:
        self.browser, self.session = browser, session

    def send(self, method: str, params: dict | None = None) -> dict:
        return self.browser.send(method, params, self.session)

    def navigate(self, url: str) -> None:
        self.send("Page.navigate", {"url": url})
        self.wait_for("document.readyState === 'complete'")

    def evaluate(self, expression: str) -> object:
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": True})
        if "exceptionDetails" in result:
            raise CDPError(f"JavaScript error in {expression!r}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30.0, interval: float = 0.05) -> object:
        """Poll a JavaScript expression until it is truthy; returns its value."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out waiting for {expression!r}")
            time.sleep(interval)

    def type_text(self, text: str) -> None:
        self.send("Input.insertText", {"text": text})

    def press_enter(self) -> None:
        key = {"key": "Enter", "code": "Enter", "windowsVirtualKeyCode": 13, "nativeVirtualKeyCode": 13}
        self.send("Input.dispatchKeyEvent", {"type": "keyDown", "text": "\r", **key})
        self.send("Input.dispatchKeyEvent", {"type": "keyUp", **key})

    def screenshot(self, path: str | Path) -> Path:
        data = self.send("Page.captureScreenshot", {"format": "png"})["data"]
        path = Path(path)
        path.write_bytes(base64.b64decode(data))
        return path
