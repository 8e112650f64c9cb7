"""Headless Chromium driven over the DevTools protocol on a pipe
(--remote-debugging-pipe: commands on fd 3, replies on fd 4), as the web
view's tests drive it (see/test_see.py, webview_auth.py)."""
import base64
import json
import os
import select
import shutil
import subprocess
import time

WAIT = 60  # seconds one DevTools command may take on a loaded machine


def chromium_binary():
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    raise FileNotFoundError("no chromium on PATH")


class PageError(AssertionError):
    """An evaluation failed: during a navigation, the page may not be there yet."""


class DevTools:
    """Chromium's DevTools protocol over --remote-debugging-pipe (fd 3 in, fd 4 out)."""

    KEEP = ("Network.requestWillBeSent", "Network.loadingFinished", "Network.loadingFailed")

    def __init__(self, profile, log_path, chromium=None, extra_args=(), window="1280,1000"):
        to_r, self.to_w = os.pipe()
        self.from_r, from_w = os.pipe()

        def fds():
            a, b = os.dup(to_r), os.dup(from_w)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(
            [chromium or chromium_binary(), "--headless", "--no-sandbox", "--disable-gpu",
             "--disable-dev-shm-usage", "--no-first-run", "--no-default-browser-check",
             "--password-store=basic", "--remote-debugging-pipe", f"--user-data-dir={profile}",
             f"--window-size={window}", *extra_args, "about:blank"],
            preexec_fn=fds, close_fds=False, stdout=subprocess.DEVNULL, stderr=self.log)
        os.close(to_r)
        os.close(from_w)
        self.buf = b""
        self.next_id = 0
        self.events = []
        targets = self.call("Target.getTargets")["targetInfos"]
        page = next(t for t in targets if t["type"] == "page")
        self.session = self.call("Target.attachToTarget", targetId=page["targetId"], flatten=True)["sessionId"]

    def _read(self, deadline):
        while b"\0" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError("chromium did not answer in time")
            ready, _, _ = select.select([self.from_r], [], [], left)
            if not ready:
                continue
            chunk = os.read(self.from_r, 1 << 20)
            if not chunk:
                raise AssertionError("chromium closed the DevTools pipe (see its log)")
            self.buf += chunk
        raw, self.buf = self.buf.split(b"\0", 1)
        return json.loads(raw)

    def call(self, method, session=None, timeout=WAIT, **params):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        os.write(self.to_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise AssertionError(f"{method}: {reply['error']}")
                return reply["result"]
            if reply.get("method") in self.KEEP:
                self.events.append(reply)

    def page(self, method, **params):
        return self.call(method, session=self.session, **params)

    def navigate(self, url):
        return self.page("Page.navigate", url=url)

    def js(self, expression):
        try:
            r = self.page("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        except AssertionError as e:  # "Execution context was destroyed" and the like
            raise PageError(str(e)) from None
        if "exceptionDetails" in r:
            d = r["exceptionDetails"]
            raise PageError(f"{expression[:80]!r}: {d.get('exception', {}).get('description') or d.get('text')}")
        return r["result"].get("value")

    def screenshot(self, path):
        png = self.page("Page.captureScreenshot", format="png")["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(png))

    def close(self):
        try:
            self.call("Browser.close", timeout=5)
        except (AssertionError, OSError):
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self.to_w, self.from_r):
            try:
                os.close(fd)
            except OSError:
                pass
        self.log.close()
