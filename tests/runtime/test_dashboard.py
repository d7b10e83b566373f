"""The job on the Ray dashboard: ``mmpipe run --keep-dashboard`` runs its driver as a Ray
job on a local head of its own; while it runs, the dashboard's JSON API lists the job with
its metadata and the attempts' tasks by partition; its driver log has progress lines that
move before the first commit and a line per partition with error rows; the metrics
endpoint it prints serves mmpipe's series (``mmpipe metrics``); Ctrl-C then stops the head,
exit 0. Also: worker processes report records in flight before a commit. One real job on
the bundled photos plus two broken case files."""

from __future__ import annotations

import json
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request

from pipeline.runtime import local_ray, submit
from tests.conftest import CASES, PHOTOS, REPO, coco_captions

BROKEN = ["C38_zero/empty.jpg", "C02_trunc/truncated_image.png"]
IN_FLIGHT = re.compile(r"progress: (\d+)/\d+ records \((\d+) in flight, 0/\d+ partitions\)")


PHOTO_ROWS = 500


def manifest(path, n: int = PHOTO_ROWS) -> int:
    """A JSONL manifest of ``n`` rows cycling over the photos (unique keys) and the
    ``BROKEN`` files last; returns its rows."""
    photos = coco_captions()
    rows = [{"key": f"k{i:03d}", "file": str(PHOTOS / photos[i % len(photos)]["file"]),
             "captions": photos[i % len(photos)]["captions"]} for i in range(n)]
    rows += [{"key": f"broken{i}", "file": str(CASES / f), "captions": ["x"]}
             for i, f in enumerate(BROKEN)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return len(rows)


def run_cmd(tmp_path, *extra: str, rows: int = PHOTO_ROWS) -> list[str]:
    """``mmpipe run`` of the quickstart over ``manifest`` of ``rows`` photos (no dedup:
    photos repeat): 2 partitions, batches of 1, progress lines as often as the driver
    ticks."""
    total = manifest(tmp_path / "m.jsonl", rows)
    return [sys.executable, "-m", "pipeline", "run", "examples/quickstart.yaml",
            "--input", str(tmp_path / "m.jsonl"), "--output", str(tmp_path / "out"),
            "--set", "name=dash-check", "--set", "text_embedding.enabled=false",
            "--set", f"source.partition_size={(total + 1) // 2}", "--set", "runtime.batch_size=1",
            "--set", "dedup.exact=false", "--set", "dedup.near=false",
            "--set", "runtime.progress_interval_s=0.3",
            "--set", f"source.allowed_roots=[{PHOTOS},{CASES}]", *extra]


class Lines:
    """A process's output lines, read on a thread; ``wait_for(pattern)`` returns the first
    match (``AssertionError`` with the output so far after ``timeout_s``)."""

    def __init__(self, proc: subprocess.Popen):
        self.proc, self.seen, self._q = proc, [], queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._q.put(line.rstrip("\n"))

    def wait_for(self, pattern: str, timeout_s: float = 180) -> re.Match:
        deadline = time.time() + timeout_s
        for line in self.seen:
            if m := re.search(pattern, line):
                return m
        while time.time() < deadline:
            try:
                line = self._q.get(timeout=0.5)
            except queue.Empty:
                continue
            self.seen.append(line)
            if m := re.search(pattern, line):
                return m
        raise AssertionError(f"no {pattern!r} in:\n" + "\n".join(self.seen[-60:]))


def api(url: str):
    """GET a dashboard JSON URL with the local token."""
    token = submit.auth_token()
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"}
                                 if token else {})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def state_rows(dashboard: str, kind: str) -> list[dict]:
    """Rows of the dashboard's state API (``/api/v0/tasks``, ``/api/v0/actors``)."""
    return api(f"{dashboard}/api/v0/{kind}?limit=1000&detail=true")["data"]["result"]["result"]


def test_a_dashboard_run_shows_job_tasks_progress_errors_and_metrics(tmp_path):
    proc = subprocess.Popen(run_cmd(tmp_path, "--keep-dashboard"), cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines = Lines(proc)
    try:
        m = lines.wait_for(
            r"^dashboard: (http://127\.0\.0\.1:\d+)/#/jobs/(mmpipe-dash-check-(\w+))$")
        dashboard, sid, run_id = m.groups()
        lines.wait_for(r"sign in with the token that `cat .*auth_token` prints")
        metrics_url = lines.wait_for(r"^metrics: (http://127\.0\.0\.1:\d+/metrics) ").group(1)
        # while it runs: the attempts' tasks are named by partition, on the workers' actors
        tasks, deadline = [], time.time() + 120
        while time.time() < deadline and not any(t["state"] == "RUNNING" for t in tasks):
            tasks = [t for t in state_rows(dashboard, "tasks")
                     if re.fullmatch(r"p-00000[01] a-[0-9a-f]{12}", t["name"])]
            time.sleep(0.3)
        assert any(t["state"] == "RUNNING" for t in tasks), tasks
        actors = {a["actor_id"]: a for a in state_rows(dashboard, "actors")}
        assert actors[tasks[0]["actor_id"]]["name"].startswith("PartitionWorker-")
        code = lines.wait_for(rf"^job {sid} finished \(exit (\d+)\)").group(1)
        assert code == "0", "\n".join(lines.seen[-40:])
        # the Jobs page: the submitted job with its metadata and its driver log
        job = next(j for j in api(f"{dashboard}/api/jobs/") if j.get("submission_id") == sid)
        assert job["status"] == "SUCCEEDED"
        assert job["metadata"]["mmpipe_job"] == "dash-check"
        assert job["metadata"]["run_id"] == run_id
        assert re.fullmatch(r"[0-9a-f]{16}", job["metadata"]["fingerprint"])
        driver_log = api(f"{dashboard}/api/jobs/{sid}/logs")["logs"]
        before_commit = [int(m.group(1)) for m in IN_FLIGHT.finditer(driver_log)]
        assert before_commit and max(before_commit) > 0, driver_log[-3000:]
        assert re.search(r"workers: PartitionWorker-\d p-00000[01] \(\d+ records\)", driver_log)
        errors = re.findall(r"partition (p-\d+): (\d+) error rows \((.*?)\), e\.g\. (.*?); ",
                            driver_log)
        assert sum(int(n) for _, n, _, _ in errors) == len(BROKEN), driver_log[-3000:]
        assert "broken0: " in driver_log and "report" not in job["metadata"]
        # the metrics endpoint, through `mmpipe metrics` (its default: this run's record)
        text = ""
        for _ in range(40):   # Ray's agent exports every few seconds
            text = subprocess.run([sys.executable, "-m", "pipeline", "metrics"], cwd=REPO,
                                  capture_output=True, text=True, timeout=60).stdout
            if 'ray_mmpipe_records_total{job_name="dash-check",reason="none",status="ok"}' \
                    in text:
                break
            time.sleep(1)
        ok = re.search(r'ray_mmpipe_records_total\{job_name="dash-check",reason="none",'
                       r'status="ok"\} (\d+)', text)
        assert ok and int(ok.group(1)) == PHOTO_ROWS, text
        assert re.search(r'ray_mmpipe_records_total\{job_name="dash-check",'
                         r'reason="empty_file",status="error"\} 1\n', text), text
        explicit = subprocess.run([sys.executable, "-m", "pipeline", "metrics", metrics_url],
                                  cwd=REPO, capture_output=True, text=True, timeout=60).stdout
        assert ok.group(0) in explicit, explicit
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)    # Ctrl-C: the kept head stops, exit 0
        rc = proc.wait(timeout=60)
    logs_dir = lines.wait_for(
        r"stopped the local Ray head; its logs: (\S+)/session_latest").group(1)
    assert rc == 0, "\n".join(lines.seen[-40:])
    assert local_ray.session_processes(logs_dir) == []
    shutil.rmtree(logs_dir)    # the head's Ray logs, kept for a user


def test_worker_processes_report_records_in_flight_before_the_first_commit(tmp_path):
    done = subprocess.run(run_cmd(tmp_path, "--executor", "processes"), cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    before_commit = [int(m.group(1)) for m in IN_FLIGHT.finditer(done.stderr)]
    assert before_commit and max(before_commit) > 0, done.stderr[-3000:]
    assert f"rows: ok={PHOTO_ROWS} rejected=0 error=2" in done.stdout, done.stdout
    assert ("partition p-000001: 2 error rows (empty_file: 1, truncated: 1), e.g. broken0: "
            "empty_file: 0 bytes | broken1: truncated: ") in done.stderr, done.stderr[-3000:]
