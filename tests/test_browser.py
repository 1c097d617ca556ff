"""JupyterLab in a real browser: open notebook 02, run all cells, drive the KV explorer.

Starts JupyterLab on 127.0.0.1 with a token in a temporary directory and drives Debian's
Chromium with Playwright (``executable_path``; no browser is downloaded). The page exposes the
app (``window.jupyterapp``), so the test waits for the kernel and runs cells through JupyterLab's
own commands rather than menus and dialogs. Timeouts are generous: on a fresh environment the
first JupyterLab and kernel start compile every module they import. Marker ``browser``:
``pytest -m browser`` runs it alone. Leaves a screenshot under ``build/browser/``.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
from pdlab.course import KERNEL_ENCRYPTION
from pdlab.models import get_model, kv_bytes_per_token
from pdlab.paths import build_dir, repo_root
from pdlab.process import free_port

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage"]


@pytest.fixture()
def jupyterlab(tmp_path):
    """A JupyterLab server on 127.0.0.1 serving a copy of notebook 02; stopped on every path."""
    src = repo_root() / "solutions" / "notebooks" / "02_kv_cache_napkin_math.ipynb"
    root = tmp_path / "course"
    root.mkdir()
    shutil.copy(src, root / "02.ipynb")
    port, token = free_port(), secrets.token_hex(16)
    env = {k: v for k, v in os.environ.items() if k not in ("PDLAB_HEADLESS", "PDLAB_STRICT_CHECKS")}
    env.update(JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"), JUPYTER_CONFIG_DIR=str(tmp_path / "config"),
               JUPYTERLAB_SETTINGS_DIR=str(tmp_path / "settings"), JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "ws"))
    # User settings: start the notebook's own kernel without asking, and no news pop-up.
    settings = tmp_path / "settings"
    for ext, name, value in (("@jupyterlab/notebook-extension", "tracker", {"autoStartDefaultKernel": True}),
                             ("@jupyterlab/apputils-extension", "notification", {"fetchNews": "false"})):
        (settings / ext).mkdir(parents=True, exist_ok=True)
        (settings / ext / f"{name}.jupyterlab-settings").write_text(json.dumps(value))
    log = open(tmp_path / "jupyterlab.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}", "--allow-root",
         f"--MappingKernelManager.transport_encryption={KERNEL_ENCRYPTION}",
         "--LabApp.news_url=None", "--LabApp.expose_app_in_browser=True", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token={token}", timeout=5)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.flush()
                    pytest.fail(f"JupyterLab did not start: {(tmp_path / 'jupyterlab.log').read_text()[-2000:]}")
                time.sleep(0.5)
        yield f"http://127.0.0.1:{port}/lab/tree/02.ipynb?token={token}"
    finally:
        # JupyterLab and the kernels it started share the session we created for it.
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=15)
                break
            except subprocess.TimeoutExpired:
                continue
        log.close()


# With --LabApp.expose_app_in_browser the page exposes the application as window.jupyterapp:
# the test reads the notebook's kernel status and runs commands through it, not through menus.
KERNEL_STATUS_JS = """() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
  return k ? k.status : 'no kernel'; }"""


def _wait_for_idle_kernel(page, timeout_s: float = 300) -> None:
    """Wait until the notebook's kernel is idle, taking the preferred kernel if JupyterLab asks."""
    accept = page.locator(".jp-Dialog button.jp-mod-accept")
    deadline = time.monotonic() + timeout_s
    status = "no page"
    while time.monotonic() < deadline:
        if accept.count() and accept.first.is_visible():
            accept.first.click()
        status = page.evaluate(KERNEL_STATUS_JS)
        if status == "idle":
            return
        page.wait_for_timeout(500)
    pytest.fail(f"the notebook's kernel is still {status!r} after {timeout_s:.0f} s")


def _plot_data(page) -> list:
    return page.evaluate(
        "() => { const p = [...document.querySelectorAll('.js-plotly-plot')].filter(e => e.data && e.data.length);"
        " const last = p[p.length - 1]; return last ? Array.from(last.data[0].y) : null; }")


def test_kv_explorer_reacts_in_jupyterlab(jupyterlab):
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    shot = build_dir() / "browser" / "02_kv_explorer.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with sync_playwright() as pw:
        try:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        except PlaywrightError as exc:
            pytest.fail(f"Chromium could not start from {CHROMIUM} (install Debian's chromium): {exc}")
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(jupyterlab)
            page.wait_for_selector(".jp-Notebook", timeout=180_000)
            _wait_for_idle_kernel(page)
            page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
            select = page.locator(".widget-dropdown select").first
            select.wait_for(timeout=300_000)
            page.wait_for_function(
                "() => [...document.querySelectorAll('.js-plotly-plot')].some(e => e.data && e.data.length)",
                timeout=120_000)
            select.scroll_into_view_if_needed()
            before = _plot_data(page)
            assert before, "the explorer's chart did not render"
            select.select_option("opt-66b")
            page.wait_for_function(
                "(b) => { const p = [...document.querySelectorAll('.js-plotly-plot')].filter(e => e.data && e.data.length);"
                " const y = Array.from(p[p.length - 1].data[0].y); return JSON.stringify(y) !== JSON.stringify(b); }",
                arg=before, timeout=120_000)
            after = _plot_data(page)
            no_news = page.get_by_role("button", name="No", exact=True)
            if no_news.count():
                no_news.first.click()
            page.locator(".widget-dropdown").first.scroll_into_view_if_needed()
            page.screenshot(path=str(shot))
        except BaseException:  # pytest.fail raises an exception outside Exception
            page.screenshot(path=str(shot.with_name("02_kv_explorer_failure.png")), full_page=True)
            raise
        finally:
            browser.close()
    # Notebook 02 opens the explorer on Llama-3-70B with an fp8 cache; OPT-66B (MHA) stores 7.2x more.
    expected = kv_bytes_per_token(get_model("opt-66b"), "fp8") / kv_bytes_per_token(get_model("llama-3-70b"), "fp8")
    assert after[0] / before[0] == pytest.approx(expected, rel=0.01)
    assert shot.exists() and shot.stat().st_size > 10_000
    print(f"browser test took {time.monotonic() - start:.1f} s; screenshot {shot}")
