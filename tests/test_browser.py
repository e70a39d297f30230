"""In a real browser: headless Chromium opens TensorBoard's PyTorch Profiler page; the run
selector must list our runs, and a screenshot of it is saved under the test's tmp dir.

Chromium is driven with the DevTools protocol over a pipe (--remote-debugging-pipe: JSON messages,
each ended by a NUL byte, on file descriptors 3 and 4), so no extra Python package is needed.
The plugin's UI is a React app in an iframe inside TensorBoard's shadow DOM; the page script below
finds it there. The test runs offline on purpose (every host but 127.0.0.1 fails to resolve): the
UI loads Google Charts from www.gstatic.com, and offline its views stay a spinner while the
sidebar (run, view and worker selectors) works, which is what this test reads."""
from __future__ import annotations

import base64
import json
import os
import select
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass

import pytest

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")  # Debian, Ubuntu, Google's
# Set by .ci/run, which installs Chromium: in CI a missing browser is a failure, not a skip.
REQUIRE_CHROMIUM_ENV = "REQUIRE_CHROMIUM"
# Limits that only stop a hang, each with a wide margin over what was measured on 2 busy cores,
# and each its own budget (one shared deadline let a slow browser start eat the page's time):
# Chromium's first answer comes once a new profile is set up (~20 s measured), a DevTools command
# is answered in well under a second after that, the plugin's sidebar renders in a few seconds.
BROWSER_START_TIMEOUT_S = 180
PAGE_TIMEOUT_S = 120
POLL_S = 0.5
WINDOW_PX = "1400,1000"
SCREENSHOT = "tensorboard_pytorch_profiler.png"
PNG_MAGIC = b"\x89PNG"
# Flags that work in this container (no GPU, no sandbox support, no network).
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", f"--window-size={WINDOW_PX}",
                  "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1"]

# Page scripts. deepFind looks through open shadow roots, where TensorBoard puts the plugin iframe.
DEEP_FIND_JS = """
function deepFind(root, selector) {
  const hit = root.querySelector(selector);
  if (hit) return hit;
  for (const element of root.querySelectorAll('*')) {
    if (element.shadowRoot) {
      const found = deepFind(element.shadowRoot, selector);
      if (found) return found;
    }
  }
  return null;
}
function pluginDocument() {
  const frame = deepFind(document, 'iframe');
  return frame && frame.contentDocument && frame.contentDocument.body ? frame.contentDocument
                                                                        : null;
}
"""
# The sidebar's first select (Material UI: a div with role=button) is "Runs"; mousedown opens it.
# Until a run is chosen it holds only a zero-width space.
SELECTED_RUN_JS = DEEP_FIND_JS + """
(() => {
  const doc = pluginDocument();
  const select = doc && doc.querySelector('[role=button][aria-haspopup=listbox]');
  const text = select ? select.textContent.replace(/\\u200b/g, '').trim() : '';
  return text || null;
})()
"""
OPEN_RUN_SELECTOR_JS = DEEP_FIND_JS + """
(() => {
  const select = pluginDocument().querySelector('[role=button][aria-haspopup=listbox]');
  select.dispatchEvent(new MouseEvent('mousedown', {bubbles: true, button: 0}));
  return true;
})()
"""
# The list's options, once its opening animation has finished (so the screenshot shows them).
LISTED_RUNS_JS = DEEP_FIND_JS + """
(() => {
  const doc = pluginDocument();
  const listbox = doc.querySelector('[role=listbox]');
  const paper = listbox && listbox.closest('.MuiPaper-root');
  if (!paper || doc.defaultView.getComputedStyle(paper).opacity !== '1') return null;
  return [...listbox.querySelectorAll('[role=option]')].map(option => option.textContent.trim());
})()
"""
PAGE_TEXT_JS = DEEP_FIND_JS + "(pluginDocument() || document).body.innerText"


@dataclass
class DevTools:
    """One DevTools connection: commands go out on `to_browser`, replies come on `from_browser`."""
    to_browser: int
    from_browser: int
    pending: bytes = b""
    last_id: int = 0


def find_chromium() -> str | None:
    for name in CHROMIUM_NAMES:
        if path := shutil.which(name):
            return path
    return None


def next_message(devtools: DevTools) -> dict:
    # The first answer waits for Chromium to start; later ones only for the command itself.
    timeout_s = BROWSER_START_TIMEOUT_S if devtools.last_id <= 1 else PAGE_TIMEOUT_S
    deadline = time.monotonic() + timeout_s
    while b"\0" not in devtools.pending:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([devtools.from_browser], [], [], remaining)[0]:
            pytest.fail(f"Chromium did not answer within {timeout_s} s")
        chunk = os.read(devtools.from_browser, 1 << 16)
        if not chunk:
            pytest.fail("Chromium closed the DevTools pipe (it exited)")
        devtools.pending += chunk
    message, devtools.pending = devtools.pending.split(b"\0", 1)
    return json.loads(message)


def call(devtools: DevTools, method: str, session: str | None = None, **params) -> dict:
    """Send one command and return its result, skipping the events that arrive meanwhile."""
    devtools.last_id += 1
    command = {"id": devtools.last_id, "method": method, "params": params}
    if session:
        command["sessionId"] = session
    os.write(devtools.to_browser, json.dumps(command).encode() + b"\0")
    while True:
        reply = next_message(devtools)
        if reply.get("id") == devtools.last_id:
            if "error" in reply:
                pytest.fail(f"DevTools {method}: {reply['error']}")
            return reply["result"]


def evaluate(devtools: DevTools, session: str, script: str):
    result = call(devtools, "Runtime.evaluate", session, expression=script, returnByValue=True)
    if "exceptionDetails" in result:
        pytest.fail(f"page script failed: {result['exceptionDetails']}")
    return result["result"].get("value")


def wait_for(devtools: DevTools, session: str, script: str, what: str):
    """Poll a page script until it returns something (the UI renders asynchronously)."""
    deadline = time.monotonic() + PAGE_TIMEOUT_S
    while time.monotonic() < deadline:
        value = evaluate(devtools, session, script)
        if value:
            return value
        time.sleep(POLL_S)
    pytest.fail(f"{what}: not on the page after {PAGE_TIMEOUT_S} s; the page reads: "
                f"{evaluate(devtools, session, PAGE_TEXT_JS)!r}")


@pytest.fixture
def chromium_devtools(tmp_path):
    """A headless Chromium with a new, empty profile, and the DevTools pipe to drive it."""
    chromium = find_chromium()
    if chromium is None:
        message = (f"Chromium not found (looked for {', '.join(CHROMIUM_NAMES)} on PATH); "
                   "on Debian: apt-get install chromium")
        if os.environ.get(REQUIRE_CHROMIUM_ENV):
            pytest.fail(message)
        pytest.skip(message)
    to_read, to_write = os.pipe()  # commands: we write, Chromium reads on its fd 3
    from_read, from_write = os.pipe()  # replies: Chromium writes on its fd 4, we read
    profile = tmp_path / "chromium_profile"
    profile.mkdir()
    # bash puts the pipe ends on fds 3 and 4, where --remote-debugging-pipe expects them.
    process = subprocess.Popen(
        ["bash", "-c", f'exec "$0" "$@" 3<&{to_read} 4>&{from_write}', chromium, *CHROMIUM_FLAGS,
         f"--user-data-dir={profile}", "--remote-debugging-pipe", "about:blank"],
        pass_fds=(to_read, from_write), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)  # its own process group: its helper processes end with it
    os.close(to_read)
    os.close(from_write)
    devtools = DevTools(to_browser=to_write, from_browser=from_read)
    try:
        yield devtools
    finally:
        try:
            os.write(to_write, json.dumps({"id": 0, "method": "Browser.close"}).encode() + b"\0")
            process.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        os.close(to_write)
        os.close(from_read)


def test_profiler_page_lists_our_runs_in_the_run_selector(tensorboard, chromium_devtools,
                                                         tmp_path):
    devtools = chromium_devtools
    page = next(target for target in call(devtools, "Target.getTargets")["targetInfos"]
                if target["type"] == "page")
    session = call(devtools, "Target.attachToTarget", targetId=page["targetId"],
                   flatten=True)["sessionId"]
    call(devtools, "Page.navigate", session, url=f"{tensorboard.url}/#pytorch_profiler")

    selected = wait_for(devtools, session, SELECTED_RUN_JS, "the run selector")
    assert selected in tensorboard.runs
    evaluate(devtools, session, OPEN_RUN_SELECTOR_JS)
    listed = wait_for(devtools, session, LISTED_RUNS_JS, "the run selector's list")
    screenshot = tmp_path / SCREENSHOT
    image = call(devtools, "Page.captureScreenshot", session)["data"]
    screenshot.write_bytes(base64.b64decode(image))

    assert listed == tensorboard.runs  # every run the plugin serves, in its order
    assert {"smoke/dataloader_workers/bad", "smoke/dataloader_workers/fixed",
            "cpu_preset/dataloader_workers/bad", "synthetic_gpu/rewritten"} <= set(listed)
    sidebar = evaluate(devtools, session, PAGE_TEXT_JS)
    assert "Overview" in sidebar and "Workers" in sidebar  # views and workers of the chosen run
    assert screenshot.read_bytes()[:4] == PNG_MAGIC and screenshot.stat().st_size > 10_000
