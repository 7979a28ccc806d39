"""The built book in a real browser: each chapter page loads, and its figures are decoded images.

Headless Chromium (Debian's `chromium`) is driven over the DevTools protocol; one screenshot per chapter
page is kept in build/artifacts/. Without Chromium the test skips and says why.
"""
import base64
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

from engine.course.paths import chapter_files
from fixtures.course_support import REPO, built_book, solutions_dir

pytestmark = [pytest.mark.browser, pytest.mark.slow]
CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
ARTIFACTS = REPO / "build" / "artifacts"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--remote-debugging-port=0", "--remote-allow-origins=*", "--window-size=1280,1600"]
FIGURES_JS = """JSON.stringify({
  title: document.title,
  heading: (document.querySelector('main h1') || {}).textContent || '',
  figures: Array.from(document.querySelectorAll('.cell_output img')).map(
      img => ({src: img.getAttribute('src'), width: img.naturalWidth, complete: img.complete}))
})"""


class Browser:
    """One headless Chromium with a fresh profile, and a DevTools connection to its page."""

    def __enter__(self):
        import websocket  # websocket-client, installed with Jupyter

        self.profile = tempfile.mkdtemp(prefix="course-chromium-")
        self.process = subprocess.Popen([CHROMIUM, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = Path(self.profile) / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            assert time.monotonic() < deadline and self.process.poll() is None, "Chromium did not start"
            time.sleep(0.2)
        port = port_file.read_text().split()[0]
        targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10))
        page = next(t for t in targets if t["type"] == "page")
        self.socket = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=60, suppress_origin=True)
        self.next_id = 0
        self.call("Page.enable")
        return self

    def __exit__(self, *exc):
        self.socket.close()
        self.process.terminate()
        self.process.wait(timeout=30)
        shutil.rmtree(self.profile, ignore_errors=True)

    def call(self, method, **params):
        """Send one DevTools command and return its result (events in between are dropped)."""
        self.next_id += 1
        self.socket.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv())
            if message.get("id") == self.next_id:
                assert "error" not in message, f"{method}: {message['error']}"
                return message["result"]

    def load(self, url):
        """Navigate and wait for the page's load event (images included)."""
        self.call("Page.navigate", url=url)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            message = json.loads(self.socket.recv())
            if message.get("method") == "Page.loadEventFired":
                return
        raise AssertionError(f"{url} did not finish loading")

    def evaluate(self, expression):
        return self.call("Runtime.evaluate", expression=expression, returnByValue=True)["result"]["value"]

    def screenshot(self, path: Path):
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=False)["data"]
        path.write_bytes(base64.b64decode(data))


@pytest.mark.skipif(CHROMIUM is None, reason="needs headless Chromium: apt-get install chromium (.ci/run does)")
def test_each_chapter_page_loads_with_its_figures():
    book = built_book()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with Browser() as browser:
        for chapter in chapter_files(solutions_dir()):
            executed = nbformat.read(book["executed"] / f"{chapter.stem}.ipynb", as_version=4)
            expected = sum("image/png" in o.get("data", {}) for c in executed.cells for o in c.get("outputs", []))
            page = book["learner"] / "chapters" / f"{chapter.stem}.html"
            browser.load(page.as_uri())
            found = json.loads(browser.evaluate(FIGURES_JS))
            shot = ARTIFACTS / f"{chapter.stem}.png"
            browser.screenshot(shot)
            assert found["heading"].strip(), f"{chapter.stem}: the page has no title heading"
            assert len(found["figures"]) == expected > 0, f"{chapter.stem}: {found['figures']}"
            broken = [f["src"] for f in found["figures"] if not (f["complete"] and f["width"] > 0)]
            assert not broken, f"{chapter.stem}: figures that did not load: {broken}"
            assert shot.stat().st_size > 10_000, f"{shot} looks empty"
