"""The dashboard in a real headless Chromium (Debian's `chromium` package).

Chromium is driven over `--remote-debugging-pipe`: the DevTools protocol as NUL-separated
JSON on file descriptors 3 (commands in) and 4 (replies and events out), so no Python
package beyond the standard library is needed. The page must load with no console errors
and no request beyond itself, run its script (which sets `data-dashboard="ready"`), show
its tables and figures, sort a table on a header click, and render to a non-blank screenshot.

Without chromium these tests skip, except under CI (the CI variable set), where they fail.
"""

from __future__ import annotations

import base64
import fcntl
import io
import json
import os
import select
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from matplotlib import image as mpimg
from support.reports import grid_sweep, optuna_sweep, probe_sweep

from dpo_sweeps.analysis.report import main

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic", "--no-first-run",
    "--no-default-browser-check", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--disable-extensions", "--remote-debugging-pipe",
)


def chromium_binary() -> str:
    for name in ("chromium", "chromium-browser"):
        if path := shutil.which(name):
            return path
    message = "chromium not found: apt-get install -y --no-install-recommends chromium"
    if os.environ.get("CI"):
        pytest.fail(message + " (CI must run the browser tests, not skip them)")
    pytest.skip(message)


class DevToolsPipe:
    """A headless Chromium and the DevTools protocol session with one page of it."""

    def __init__(self, binary: str, profile: Path, width: int = 1400, height: int = 1600, timeout: float = 60):
        self.timeout = timeout
        self.events: list[dict[str, Any]] = []
        self._buffer = b""
        self._next_id = 0
        commands_read, self._commands = os.pipe()
        self._replies, replies_write = os.pipe()

        def onto_fds_3_and_4() -> None:
            # In the child: Chromium reads commands on fd 3 and writes replies on fd 4. Lift both
            # above 10 first so that neither dup2 clobbers the other.
            high_read = fcntl.fcntl(commands_read, fcntl.F_DUPFD, 10)
            high_write = fcntl.fcntl(replies_write, fcntl.F_DUPFD, 10)
            os.dup2(high_read, 3)
            os.dup2(high_write, 4)

        self._log_path = profile / "chromium.log"
        self._log = self._log_path.open("wb")
        self.process = subprocess.Popen([binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
                                        preexec_fn=onto_fds_3_and_4, close_fds=False,
                                        stdout=self._log, stderr=subprocess.STDOUT)
        os.close(commands_read)
        os.close(replies_write)
        try:
            target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
            self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            for domain in ("Page", "Runtime", "Log", "Network"):
                self.call(f"{domain}.enable", session=self.session)
            self.call("Emulation.setDeviceMetricsOverride",
                      {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
                      session=self.session)
        except BaseException:
            self.close()  # never leave a browser behind
            raise

    def _receive(self, wanted: Callable[[dict[str, Any]], bool], timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            while b"\0" in self._buffer:
                raw, self._buffer = self._buffer.split(b"\0", 1)
                message = json.loads(raw)
                if "method" in message:
                    self.events.append(message)
                if wanted(message):
                    return message
            ready, _, _ = select.select([self._replies], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise TimeoutError(f"chromium did not answer within {timeout}s")
            chunk = os.read(self._replies, 1 << 20)
            if not chunk:
                raise EOFError(f"chromium exited (status {self.process.poll()}): {self._log_tail()}")
            self._buffer += chunk

    def _log_tail(self, lines: int = 5) -> str:
        """The end of Chromium's own output: why it stopped (a FATAL line names the check that failed)."""
        self._log.flush()
        output = self._log_path.read_text(errors="replace").splitlines()
        return " | ".join([line for line in output if ":FATAL:" in line] or output[-lines:]) or "(no output)"

    def call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._commands, json.dumps(message).encode() + b"\0")
        reply = self._receive(lambda m, i=self._next_id: m.get("id") == i, self.timeout)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply["result"]

    def open(self, url: str) -> None:
        """Navigate and wait for the load event."""
        self.call("Page.navigate", {"url": url}, session=self.session)
        self._receive(lambda m: m.get("method") == "Page.loadEventFired", self.timeout)

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True},
                           session=self.session)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 15) -> Any:
        deadline = time.monotonic() + timeout
        while not (value := self.evaluate(expression)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{expression} still false after {timeout}s")
            time.sleep(0.1)
        return value

    def screenshot(self, full_page: bool = False) -> bytes:
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            size = self.call("Page.getLayoutMetrics", session=self.session)["cssContentSize"]
            params.update(captureBeyondViewport=True,
                          clip={"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1})
        return base64.b64decode(self.call("Page.captureScreenshot", params, session=self.session)["data"])

    def console_errors(self) -> list[str]:
        """Uncaught exceptions, console.error/assert calls and error log entries so far."""
        errors = []
        for event in self.events:
            method, params = event["method"], event.get("params", {})
            if method == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                errors.append(f"{details.get('text')} {details.get('exception', {}).get('description', '')}")
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                errors.append(" ".join(str(a.get("value", a.get("description"))) for a in params.get("args", [])))
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                errors.append(f"{params['entry'].get('text')} {params['entry'].get('url', '')}")
        return errors

    def requested_urls(self) -> list[str]:
        return [e["params"]["request"]["url"] for e in self.events if e["method"] == "Network.requestWillBeSent"]

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except (EOFError, TimeoutError, RuntimeError, OSError):
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._commands)
        os.close(self._replies)
        self._log.close()


@pytest.fixture
def browser(tmp_path):
    profile = tmp_path / "chromium-profile"
    profile.mkdir()
    pipe = DevToolsPipe(chromium_binary(), profile)
    yield pipe
    pipe.close()


def screenshot_pixels(png: bytes) -> np.ndarray:
    return mpimg.imread(io.BytesIO(png), format="png")[..., :3]


@pytest.mark.parametrize("make_sweep", [grid_sweep, optuna_sweep, probe_sweep], ids=["grid", "optuna", "probe"])
def test_dashboard_loads_offline_without_console_errors_and_shows_tables_and_plots(tmp_path, browser, make_sweep):
    sweep = make_sweep(tmp_path / "sweep")
    assert main([str(sweep)]) == 0
    page = sweep / "report" / "report.html"

    browser.open(page.resolve().as_uri())
    assert browser.wait_for("document.documentElement.getAttribute('data-dashboard') === 'ready'")

    assert browser.console_errors() == []
    fetched = [url for url in browser.requested_urls() if not url.startswith("data:")]
    assert fetched == [page.resolve().as_uri()], "the page must fetch nothing but itself"
    ranking_rows = (sweep / "report" / "ranking.csv").read_text().strip().count("\n")
    assert browser.evaluate("document.querySelectorAll('#configs-table tbody tr').length") == ranking_rows
    assert browser.evaluate("document.querySelectorAll('#runs-table tbody tr').length") == len(
        [p for p in sweep.iterdir() if (p / ".hydra").is_dir()])
    images = browser.evaluate(
        "Array.from(document.images).map(i => [i.alt, i.complete && i.naturalWidth > 0, i.width])")
    if make_sweep is probe_sweep:  # probes have no accuracy: no Pareto scatter, and the page says why
        assert {alt for alt, _, _ in images} >= {"Effects per setting", "Training curves"}
        assert "probes measure no accuracy" in browser.evaluate("document.querySelector('#pareto').innerText")
        assert "probes" in browser.evaluate("document.querySelector('#best-accuracies').innerText")
    else:
        assert {alt for alt, _, _ in images} >= {"Pareto scatter", "Effects per setting", "Training curves"}
    assert all(loaded and width > 100 for _, loaded, width in images), images

    pixels = screenshot_pixels(browser.screenshot())
    assert pixels.shape[0] > 1000 and pixels.shape[1] > 1000
    assert pixels.std() > 0.05, "the screenshot is blank"
    assert (pixels.mean(axis=2) < 0.9).mean() > 0.05, "almost nothing is drawn on the screenshot"


def test_clicking_a_column_header_sorts_the_table_by_it(tmp_path, browser):
    sweep = grid_sweep(tmp_path / "sweep")
    assert main([str(sweep)]) == 0
    browser.open((sweep / "report" / "report.html").resolve().as_uri())
    browser.wait_for("document.documentElement.getAttribute('data-dashboard') === 'ready'")
    column = "eval/rewards/accuracies"
    script = f"""(() => {{
        const table = document.getElementById('configs-table');
        const index = Array.from(table.tHead.rows[0].cells).findIndex(th => th.textContent === '{column}');
        table.tHead.rows[0].cells[index].click();
        table.tHead.rows[0].cells[index].click();  // second click: descending
        return Array.from(table.tBodies[0].rows).map(r => r.cells[index].getAttribute('data-value'));
    }})()"""
    values = browser.evaluate(script)
    numbers = [float(v) for v in values if v is not None]
    assert numbers == sorted(numbers, reverse=True)
    assert values[len(numbers):] == [None] * (len(values) - len(numbers)), "empty cells sort last"
    assert browser.console_errors() == []


# `DPO_SWEEPS_SCREENSHOTS=docs` saves the dashboard at each width there (docs/report.md shows them);
# `DPO_SWEEPS_SCREENSHOT_SWEEP=multirun/quickstart` reports that sweep instead of the test's own grid.
SCREENSHOTS = "DPO_SWEEPS_SCREENSHOTS"
SCREENSHOT_SWEEP = "DPO_SWEEPS_SCREENSHOT_SWEEP"

LAYOUT = """(() => {
    const page = document.documentElement;
    const box = r => [r.left, r.right];
    return {
        page: [page.scrollWidth, page.clientWidth],
        images: Array.from(document.images).map(i => [i.alt, i.width, i.naturalWidth, i.getBoundingClientRect().right]),
        tables: Array.from(document.querySelectorAll('.table-frame')).map(frame => {
            const scroll = frame.querySelector('.scroll'), hint = frame.previousElementSibling;
            const overflows = scroll.scrollWidth > scroll.clientWidth + 1;
            const before = {more: frame.classList.contains('more-right'), hint: hint.hidden ? '' : hint.textContent};
            scroll.scrollLeft = scroll.scrollWidth;  // to the last column
            const cells = scroll.querySelector('thead tr').cells;
            return {id: scroll.querySelector('table').id, overflows, before, frame: box(scroll.getBoundingClientRect()),
                    first: box(cells[0].getBoundingClientRect()), last: box(cells[cells.length - 1].getBoundingClientRect()),
                    columns: cells.length};
        }),
    };
})()"""


@pytest.mark.parametrize("width", [1000, 1400])
def test_the_dashboard_fits_the_window_at_1000_and_1400_px(tmp_path, width):
    """No part of the page is cut: it never scrolls sideways itself; each figure shows at its own size (its
    text as legible as test_report_figures pins it down); a table wider than the window scrolls sideways
    inside its frame, says so, and shows its last column when scrolled, its first still in view."""
    sweep = Path(os.environ[SCREENSHOT_SWEEP]) if os.environ.get(SCREENSHOT_SWEEP) else grid_sweep(tmp_path / "sweep")
    assert main([str(sweep), "--out", str(tmp_path / "report")]) == 0
    profile = tmp_path / "chromium-profile"
    profile.mkdir()
    browser = DevToolsPipe(chromium_binary(), profile, width=width, height=1000)
    try:
        browser.open((tmp_path / "report" / "report.html").resolve().as_uri())
        browser.wait_for("document.documentElement.getAttribute('data-dashboard') === 'ready'")
        layout = browser.evaluate(LAYOUT)
        # Scrolled to their ends, no table has columns hidden on the right: the shade goes.
        browser.wait_for("Array.from(document.querySelectorAll('.table-frame'))"
                         ".every(frame => !frame.classList.contains('more-right'))", timeout=5)
        assert browser.console_errors() == []
        if os.environ.get(SCREENSHOTS):  # the page as it opens: the tables scrolled back, their shade back
            browser.evaluate("document.querySelectorAll('.scroll').forEach(s => { s.scrollLeft = 0; })")
            browser.wait_for("Array.from(document.querySelectorAll('.table-frame')).every(frame => { "
                             "const s = frame.querySelector('.scroll'); "
                             "return (s.scrollWidth > s.clientWidth + 1) === frame.classList.contains('more-right'); })",
                             timeout=5)
            save_screenshot(browser, Path(os.environ[SCREENSHOTS]) / f"dashboard-{width}px.png")
    finally:
        browser.close()
    scroll_width, client_width = layout["page"]
    assert scroll_width <= client_width, "the page itself scrolls sideways: something is cut off"
    assert {alt for alt, *_ in layout["images"]} >= {"Pareto scatter", "Effects per setting", "Training curves"}
    for alt, shown, natural, right in layout["images"]:
        assert shown == natural and right <= client_width, f"{alt}: {shown} px of {natural}, right edge at {right}"
    assert {t["id"] for t in layout["tables"]} >= {"configs-table", "runs-table"}
    assert any(t["overflows"] for t in layout["tables"]), "no table is wider than the window: nothing to check"
    for table in layout["tables"]:
        left, right = table["frame"]
        assert right <= client_width, f"{table['id']}: its frame ends past the window"
        if not table["overflows"]:
            assert not table["before"]["more"] and table["before"]["hint"] == ""
            continue
        assert table["before"]["more"], f"{table['id']}: no shade where columns are hidden on the right"
        assert f"for all {table['columns']} columns" in table["before"]["hint"]
        assert left - 1 <= table["last"][0] and table["last"][1] <= right + 1, f"{table['id']}: last column not shown"
        assert abs(table["first"][0] - left) <= 2, f"{table['id']}: the first column scrolled away"


def save_screenshot(browser: DevToolsPipe, path: Path) -> None:
    """From the Pareto figure to the end of the Configs table: the parts a window's width changes most."""
    top, bottom = browser.evaluate("[document.getElementById('pareto').getBoundingClientRect().top + scrollY - 8,"
                                   " document.getElementById('configs').getBoundingClientRect().bottom + scrollY + 8]")
    width = browser.evaluate("document.documentElement.clientWidth")
    png = base64.b64decode(browser.call("Page.captureScreenshot", {
        "format": "png", "captureBeyondViewport": True,
        "clip": {"x": 0, "y": top, "width": width, "height": bottom - top, "scale": 1}}, session=browser.session)["data"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(png)
