"""Screenshots of the Ray dashboard's job and actor pages during a ``mmpipe run
--keep-dashboard`` job, taken with headless Chromium (Debian's ``chromium``, driven by
Playwright's Python package with ``executable_path``; never ``playwright install``).
Asserts on the rendered DOM's text: the job's submission id and name on its page, the
``PartitionWorker-<i>`` actors ALIVE and a task named by partition RUNNING on the actors
page. The PNGs go to the test's tmp dir (``MMPIPE_SCREENSHOTS_DIR`` copies them there
too, e.g. ``docs/``). Slow: about a minute."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess

import pytest

from pipeline.runtime import submit
from tests.conftest import REPO
from tests.runtime.test_dashboard import Lines, run_cmd

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]

pytestmark = pytest.mark.slow


def page_text(page, url: str, must: list[str], png, then: str = "", then_must=(),
              timeout_ms: int = 60_000) -> str:
    """Open ``url``, wait until every string of ``must`` is in the page's text; if
    ``then``, click the text ``then`` (a collapsed section) and wait for ``then_must``;
    save a full-page screenshot to ``png``; return the page's text."""
    page.goto(url)
    for strings in (must, then_must):
        if strings:
            condition = " && ".join(f"document.body.innerText.includes({s!r})"
                                    for s in strings)
            try:
                page.wait_for_function(f"() => {condition}", timeout=timeout_ms)
            except Exception:
                page.screenshot(path=str(png).replace(".png", "-failed.png"), full_page=True)
                raise AssertionError(f"not all of {strings} in {url}:\n"
                                     + page.inner_text("body")[:3000]) from None
        if then and strings is must:
            page.get_by_text(then, exact=True).click()
    page.screenshot(path=str(png), full_page=True)
    return page.inner_text("body")


def test_screenshots_of_the_job_and_actor_pages_during_a_run(tmp_path):
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is missing: apt-get install chromium")
    playwright = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    proc = subprocess.Popen(run_cmd(tmp_path, "--keep-dashboard", rows=4000), cwd=REPO,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines = Lines(proc)
    try:
        m = lines.wait_for(
            r"^dashboard: (http://127\.0\.0\.1:\d+)/#/jobs/(mmpipe-dash-check-\w+)$")
        dashboard, sid = m.groups()
        lines.wait_for(r"progress: \d+/\d+ records \(\d+ in flight")   # workers are busy
        with playwright.sync_playwright() as pw:
            # a fresh profile (Playwright passes it as --user-data-dir)
            context = pw.chromium.launch_persistent_context(
                tmp_path / "chromium-profile", executable_path=CHROMIUM, args=FLAGS,
                viewport={"width": 1400, "height": 1000})
            try:
                context.add_cookies([{"name": "ray-authentication-token",
                                      "value": submit.auth_token(), "url": dashboard}])
                page = context.new_page()
                # the job: its id, name, status and driver log; its tasks by partition
                job = page_text(page, f"{dashboard}/#/jobs/{sid}",
                                [sid, "RUNNING", "dash-check", "progress:"],
                                tmp_path / "dashboard-job.png", then="Task Table",
                                then_must=["p-000000 a-", "p-000001 a-"])
                actors = page_text(page, f"{dashboard}/#/actors",
                                   ["PartitionWorker-0", "PartitionWorker-1", "ALIVE"],
                                   tmp_path / "dashboard-actors.png")
            finally:
                context.close()
        assert "fingerprint" in job and "in flight" in job, job[:3000]
        # a task row: name, job id, state
        assert re.search(r"p-00000[01] a-[0-9a-f]{12}\s+[0-9a-f]{8}\s+RUNNING", job), job[-3000:]
        assert "PartitionWorker-0" in actors and "ALIVE" in actors, actors[:3000]
        assert "(idle)" not in actors, actors[:3000]     # no state frozen in the Repr column
        for png in ("dashboard-job.png", "dashboard-actors.png"):
            assert (tmp_path / png).stat().st_size > 10_000
            if os.environ.get("MMPIPE_SCREENSHOTS_DIR"):
                shutil.copy(tmp_path / png, os.environ["MMPIPE_SCREENSHOTS_DIR"])
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)   # stops the job (or the kept head): exit 130 or 0
        proc.wait(timeout=120)
    assert proc.returncode in (0, 130), "\n".join(lines.seen[-40:])
    shutil.rmtree(lines.wait_for(r"its logs: (\S+)/session_latest").group(1))
