"""Jobs sharing one Ray cluster are admitted whole (issue 27, items 1 and 3).

One head with 2 CPUs (``ray start --head --node-ip-address=127.0.0.1 --num-cpus=2``). The
quickstart's minimum is its text-embedding ModelActor (1 CPU) and one PartitionWorker
(1 CPU): the whole head. Two ``mmpipe run --address <head>`` started together used to place
one ModelActor each and then wait for ever for a worker CPU; admitted as one placement
group each, one runs while the other waits holding nothing, then the other runs. A job
whose minimum no node offers fails after ``runtime.resource_wait_s`` naming the request,
and its pending group holds no CPU meanwhile.

Fair sharing, on a head with 6 CPUs (both quickstarts' minimums and 2 to grow): two equal
jobs started together run within 2x of each other's partitions/s (each grows by one worker),
and a job that grew alone into every CPU lets growth workers go once a later job waits (the
quickstart without its model there: the claim is about PartitionWorkers).

Cost: the placement groups and free CPUs are read by one long-lived client per head
(``_Probe``: one ``ray.init``, then an answer per question), not a new Python process per
look; both heads are stopped together at the end.
"""

from __future__ import annotations

import datetime
import json
import queue
import re
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.deploy.local_head import start_head
from tests.e2e.jobs import NO_MODEL

PROBE = """
import json, sys, ray
ray.init(address=sys.argv[1], logging_level="ERROR")
for _ in sys.stdin:                  # one answer per line asked, until the test closes stdin
    groups = [{"name": g["name"], "state": g["state"]}
              for g in ray.util.placement_group_table().values()]
    state = {"groups": groups, "free_cpu": ray.available_resources().get("CPU", 0.0)}
    print("probe " + json.dumps(state), flush=True)
ray.shutdown()
"""


class _Probe:
    """A client of one head in a process of its own (never ``ray.init`` in the pytest
    process, which other test files' in-process Ray may hold): ``probe()`` is the head's
    placement groups (name, state) and free CPUs now. Lines it prints without the
    ``probe`` prefix (Ray's own) are skipped."""

    def __init__(self, head, log: Path):
        self.log, self.err = log, open(log, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", PROBE, head.gcs_address], cwd=REPO,
            env={**head.client_env(), "RAY_SCHEDULER_EVENTS": "0"}, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self.err, text=True)
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)                       # the probe exited

    def __call__(self, timeout_s: float = 60) -> dict:
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        deadline = time.time() + timeout_s
        while True:
            line = self.lines.get(timeout=max(deadline - time.time(), 0.01))
            assert line is not None, self.log.read_text()[-2000:]
            if line.startswith("probe "):
                return json.loads(line[len("probe "):])

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=15)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait(timeout=15)
        self.err.close()


_PROBES: dict[str, _Probe] = {}   # head's GCS address -> its probe


@pytest.fixture(scope="module")
def heads():
    """The heads this module starts (``_start``), each with its probe; at the end each
    head's probe is closed and then the head stopped, all heads at once (each stop waits
    seconds for Ray's processes to exit)."""
    started = []
    yield started

    def stop(h) -> None:
        try:
            if h.gcs_address in _PROBES:
                _PROBES.pop(h.gcs_address).close()
        finally:
            h.stop()

    with ThreadPoolExecutor(max(len(started), 1)) as pool:
        list(pool.map(stop, started))


def _start(heads, base: Path, **kwargs):
    """``start_head(base, **kwargs)``, to be stopped by ``heads``, with its ``_Probe``."""
    h = start_head(base, **kwargs)
    heads.append(h)
    _PROBES[h.gcs_address] = _Probe(h, base / "probe.log")
    return h


@pytest.fixture(scope="module")
def head(heads, tmp_path_factory):
    return _start(heads, tmp_path_factory.mktemp("admission-head"), num_cpus=2)


def _run(head, out, report, log, *sets: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "pipeline", "run", "examples/quickstart.yaml",
           "--address", head.gcs_address, "--output", str(out), "--report-json", str(report)]
    for s in sets:
        cmd += ["--set", s]
    return subprocess.Popen(cmd, cwd=REPO, env=head.client_env(), stdout=log,
                            stderr=subprocess.STDOUT, text=True)


def _finish(procs, logs, reports, timeout: float) -> tuple[dict, dict]:
    """Wait for every job, read its log, require exit 0; its log text and report by name."""
    texts = {}
    for n, proc in procs.items():
        proc.wait(timeout=timeout)
        logs[n].seek(0)
        texts[n] = logs[n].read()
        logs[n].close()
    for n, proc in procs.items():
        assert proc.returncode == 0, texts[n][-4000:]
    return texts, {n: json.loads(reports[n].read_text()) for n in procs}


def _probe(head) -> dict:
    """The head's placement groups (``name``, ``state``) and ``free_cpu`` now."""
    return _PROBES[head.gcs_address]()


def _until(event, procs, what: str, timeout_s: float = 180) -> None:
    """Wait until ``event()`` is true, checked every 0.5 s; fail naming ``what`` if a job
    exits first or ``timeout_s`` passes."""
    deadline = time.time() + timeout_s
    while not event():
        assert all(p.poll() is None for p in procs.values()) and time.time() < deadline, what
        time.sleep(0.5)


def _waiting_status(tmp_path, names, procs) -> tuple[str, str] | None:
    """``(job, mmpipe status output)`` for the first output whose status says its job
    waits for resources (polled while the jobs run), or None. A job's status is asked only
    once its log (``<job>.log``) has said it waits: a file read, where each ``mmpipe
    status`` is a Python process on the CPUs the jobs run on."""
    while all(p.poll() is None for p in procs.values()):
        for n in names:
            if "waiting for resources" not in (tmp_path / f"{n}.log").read_text():
                continue
            done = subprocess.run([sys.executable, "-m", "pipeline", "status",
                                   str(tmp_path / f"out-{n}")], cwd=REPO, capture_output=True,
                                  text=True, timeout=60)
            if "waiting for resources" in done.stdout:
                return n, done.stdout
        time.sleep(0.5)
    return None


def _stamp(text: str, pattern: str) -> str:
    """The clock time (HH:MM:SS) of the first log line matching ``pattern``."""
    for line in text.splitlines():
        if re.search(pattern, line):
            m = re.search(r"\d\d:\d\d:\d\d", line)
            return m.group(0) if m else "?"
    return "-"


def test_two_jobs_on_a_two_cpu_head_both_complete_one_after_waiting(head, tmp_path):
    names = ("a", "b")
    reports = {n: tmp_path / f"{n}.json" for n in names}
    logs = {n: open(tmp_path / f"{n}.log", "w+") for n in names}
    procs = {n: _run(head, tmp_path / f"out-{n}", reports[n], logs[n], f"name=gang{n}")
             for n in names}
    status = _waiting_status(tmp_path, names, procs)
    texts, done = _finish(procs, logs, reports, timeout=400)
    for d in done.values():
        assert d["complete"] and d["rows_out"] == 57
        assert [p["stage"] for p in d["model_pools"]] == ["text_embedding"]
    # one was admitted at once (a placement of well under a second), the other waited
    second = max(names, key=lambda n: done[n]["admission_wait_s"])
    (first,) = set(names) - {second}
    waits = {n: done[n]["admission_wait_s"] for n in names}
    assert waits[first] < 2 and waits[second] >= 5, waits
    # `mmpipe status` of the waiting job's output said so while it waited
    assert status is not None and status[0] == second, status
    assert re.search(r"running now: host .*, run [0-9a-f]{8}, job 'gang.'.*\n  waiting for "
                     r"resources: needs \{'CPU': 2\.0\}; the cluster has \{'CPU': 0\.0\} "
                     r"free", status[1]), status[1]
    text = texts[second]
    assert re.search(r"waiting for resources: needs \{'CPU': 2\.0\}; the cluster has "
                     r"\{.*'CPU': 0\.0.*\} free", text), text[-3000:]
    assert re.search(r"admitted after waiting \d+\.\d s for resources", text), text[-3000:]
    assert "waited" in text and f"{done[second]['admission_wait_s']:.1f}s for resources" in text
    # the second's wait covers the first's run: it started only once the first let go
    assert done[second]["admission_wait_s"] >= 0.5 * done[first]["wall_s"] - 10
    print("timeline:", {n: {"admitted": _stamp(texts[n], r"admitted"),
                            "waiting": _stamp(texts[n], r"waiting for resources"),
                            "finished": _stamp(texts[n], r"progress: 57/57 records"),
                            "admission_wait_s": done[n]["admission_wait_s"],
                            "wall_s": round(done[n]["wall_s"], 1)} for n in names})
    groups = _probe(head)["groups"]
    assert groups and all(g["state"] == "REMOVED" for g in groups), groups


def test_a_minimum_no_node_offers_fails_naming_it_and_holds_nothing(head, tmp_path):
    """The job's minimum (a 3-CPU ModelActor and a PartitionWorker) fits no node of the
    2-CPU head: its group stays pending (seen by the head's probe, looked at every 0.2 s,
    well within the 4 s it waits) holding no CPU, then the job fails naming the actor."""
    log = open(tmp_path / "big.log", "w+")
    t0 = time.time()
    proc = _run(head, tmp_path / "out", tmp_path / "r.json", log, "name=toobig",
                "text_embedding.num_cpus=3", "runtime.resource_wait_s=4")
    try:
        seen = None
        while proc.poll() is None and time.time() - t0 < 120:
            state = _probe(head)
            pending = [g for g in state["groups"] if g["state"] == "PENDING"
                       and g["name"].startswith("mmpipe-toobig-")]
            if pending:
                seen = state
                break
            time.sleep(0.2)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.seek(0)
        text = log.read()
        log.close()
    assert seen is not None, text[-3000:]
    assert seen["free_cpu"] == 2.0      # the pending group holds nothing
    assert proc.returncode != 0, text[-3000:]
    assert ("no node offers {'CPU': 3.0} for ModelActor-text_embedding-0 after 4 s; the "
            "cluster has {'CPU': 2.0") in text, text[-3000:]
    assert "waiting for resources: needs {'CPU': 4.0}" in text, text[-3000:]
    groups = [g for g in _probe(head)["groups"] if g["name"].startswith("mmpipe-toobig-")]
    assert groups and {g["state"] for g in groups} == {"REMOVED"}


@pytest.fixture(scope="module")
def wide_head(heads, tmp_path_factory):
    """A head with 6 logical CPUs: both quickstarts' minimums (2 CPUs each) and 2 to grow;
    its workers import this checkout's ``tests`` package (the gate step)."""
    return _start(heads, tmp_path_factory.mktemp("fair-head"), num_cpus=6,
                  extra_env={"PYTHONPATH": str(REPO)})


COPIES = 8  # the quickstart's 57 photos, 8 times over: 456 records, 29 partitions of 16
LATE_COPIES = 4  # the shedding test's later job: 228 records, 15 partitions of 16


def _many_photos(tmp_path, copies: int = COPIES, name: str = "many.jsonl") -> Path:
    """A manifest ``name`` naming each quickstart photo ``copies`` times under new keys (a
    copy of data/photos beside it, made once per ``tmp_path``), in copy order: no partition
    of 16 rows holds a photo twice."""
    photos = tmp_path / "photos"
    if not photos.exists():
        shutil.copytree(REPO / "data" / "photos", photos)
    rows = [json.loads(line) for line in (photos / "captions.jsonl").read_text().splitlines()]
    manifest = photos / name
    manifest.write_text("".join(json.dumps(dict(r, key=f"{r['key']}-c{k}")) + "\n"
                                for k in range(copies) for r in rows))
    return manifest


def _markers(out) -> list[tuple[float, float]]:
    """``(started_at, finished_at)`` of each commit marker under ``out`` (epoch seconds)."""
    return [(m["started_at"], m["finished_at"]) for m in
            (json.loads(p.read_text()) for p in sorted((out / "_checkpoints").glob("p-*.json")))]


def _stamps(text: str, pattern: str) -> list[float]:
    """The time (epoch seconds, as the markers') of each log line matching ``pattern``."""
    out = []
    for line in text.splitlines():
        m = re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}", line)
        if m and re.search(pattern, line):
            out.append(datetime.datetime.strptime(m.group(0), "%Y-%m-%d %H:%M:%S,%f")
                       .timestamp())
    return out


def test_two_equal_jobs_share_a_cluster_within_2x(wide_head, tmp_path):
    """Two quickstarts over ``_many_photos`` (29 partitions each), started together on 6
    CPUs: each job's
    partitions/s over the time both ran is within 2x of the other's, and no job grew
    (started more PartitionWorkers) while the other waited for its minimum."""
    names = ("a", "b")
    reports = {n: tmp_path / f"{n}.json" for n in names}
    logs = {n: open(tmp_path / f"{n}.log", "w+") for n in names}
    manifest = _many_photos(tmp_path)
    procs = {n: _run(wide_head, tmp_path / f"out-{n}", reports[n], logs[n], f"name=fair{n}",
                     f"source.uri={manifest}", "source.partition_size=16") for n in names}
    texts, done = _finish(procs, logs, reports, timeout=300)
    for d in done.values():
        assert d["complete"] and d["rows_out"] == 57 * COPIES and d["partitions_total"] == 29
    marks = {n: _markers(tmp_path / f"out-{n}") for n in names}
    assert all(len(m) == 29 for m in marks.values()), marks
    # the window both ran: from the later first attempt to the earlier last commit
    t0 = max(min(s for s, _ in m) for m in marks.values())
    t1 = min(max(f for _, f in m) for m in marks.values())
    rate = {n: sum(t0 <= f <= t1 for _, f in marks[n]) / max(t1 - t0, 1e-3) for n in names}
    timeline = {n: {"admission_wait_s": done[n]["admission_wait_s"],
                    "first_attempt_s": round(min(s for s, _ in marks[n]) - t0, 1),
                    "commits_s": sorted(round(f - t0, 1) for _, f in marks[n]),
                    "grew": len(_stamps(texts[n], r"starting \d+ more partition worker")),
                    "partitions_per_s": round(rate[n], 3), "wall_s": round(done[n]["wall_s"], 1)}
                for n in names}
    print("fair-share timeline:", json.dumps(timeline))
    assert t1 - t0 > 5, timeline
    # the cluster holds both minimums: neither waits for the other's growth to end
    assert all(d["admission_wait_s"] < 10 for d in done.values()), timeline
    assert min(rate.values()) > 0 and max(rate.values()) <= 2 * min(rate.values()), timeline
    # no growth while the other job waited for its minimum
    for n, other in (names, names[::-1]):
        waits = _stamps(texts[other], r"waiting for resources")
        admitted = _stamps(texts[other], r"admitted after waiting")
        if waits:
            assert admitted, texts[other][-3000:]
            grew = [t for t in _stamps(texts[n], r"starting \d+ more partition worker")
                    if waits[0] <= t <= admitted[0]]
            assert not grew, (n, grew, timeline)


def test_a_job_that_grew_first_sheds_down_to_its_share_for_a_later_one(wide_head, tmp_path):
    """Job a starts alone on 6 CPUs and grows into all of them (6 PartitionWorkers: its
    minimum and 5 growth workers); job b waits for its minimum only until a lets growth
    workers go at their next idle moment (well before a ends), then both run.

    Both without the text-embedding model (``NO_MODEL``: no MiniLM load in a ModelActor
    per job): the claim is about growth PartitionWorkers, and a job's minimum is then its
    one PartitionWorker (1 CPU). While b waits, a's fair share of the growth room is
    6 - 1 (a's group) - 1 (b's pending group) = 4 CPUs: 1 of its 5 growth workers goes,
    which frees b's minimum; once b is admitted each job's share is (6 - 2) / 2 = 2: 2
    more go. 3 in all.

    Deterministic by an explicit barrier (``tests/e2e/gate_step.py``): a's batches are held
    until a has grown into the whole head AND b has said it waits for resources; only then
    does the test open the gate, so a cannot finish, nor free a CPU, before b asks.

    b reads half as much (``LATE_COPIES``: 228 records, 15 partitions of 16), enough to run
    on past a's next looks at its share (every 2 s) after b's admission: the claim is about
    a's work, which b only has to outlast its sheds; a keeps all 29 partitions, so its
    queue is still full when its last growth worker goes."""
    manifest = _many_photos(tmp_path)              # 456 records, 29 partitions of 16
    late = _many_photos(tmp_path, LATE_COPIES, "late.jsonl")
    hold = tmp_path / "hold"
    hold.touch()
    logs = {n: open(tmp_path / f"{n}.log", "w+") for n in "ab"}
    sets = ("source.partition_size=16", *NO_MODEL)
    gate = json.dumps([{"uses": "tests.e2e.gate_step:GateStep", "with": {"hold": str(hold)}}])
    procs = {"a": _run(wide_head, tmp_path / "out-a", tmp_path / "a.json", logs["a"],
                       "name=greedy", f"steps={gate}", f"source.uri={manifest}", *sets)}
    try:
        _until(lambda: _probe(wide_head)["free_cpu"] == 0, procs,
               "job a never grew into the whole head")
        assert not list((tmp_path / "out-a" / "_checkpoints").glob("p-*.json"))  # held
        b_start = time.time()
        procs["b"] = _run(wide_head, tmp_path / "out-b", tmp_path / "b.json", logs["b"],
                          "name=late", f"source.uri={late}", *sets)
        _until(lambda: "waiting for resources" in (tmp_path / "b.log").read_text(), procs,
               "job b never said it waits for resources")
    finally:
        hold.unlink()                              # open the gate: a's workers go on
    texts, done = _finish(procs, logs, {n: tmp_path / f"{n}.json" for n in "ab"},
                          timeout=300)
    assert done["a"]["complete"] and done["a"]["rows_out"] == 57 * COPIES
    assert done["b"]["complete"] and done["b"]["rows_out"] == 57 * LATE_COPIES
    assert done["a"]["partitions_total"] == 29 and done["b"]["partitions_total"] == 15
    shed = _stamps(texts["a"], r"goes: beyond this job's fair share")
    marks = _markers(tmp_path / "out-a")
    a_end = max(f for _, f in marks)
    waits = _stamps(texts["b"], r"admitted after waiting")
    assert len(waits) == 1, ("job b was not admitted after waiting", texts["b"][-3000:])
    b_admitted = waits[0]
    print("shed timeline:", json.dumps({
        "a_grew_to": len(set(re.findall(r"PartitionWorker-(\d+)", texts["a"]))),
        "a_shed_at": shed, "b_admission_wait_s": done["b"]["admission_wait_s"],
        "a_shed_after_b_started_s": [round(t - b_start, 1) for t in shed],
        "b_admitted_before_a_end_s": round(a_end - b_admitted, 1)}))
    # a let 3 growth workers go: 1 CPU for b's minimum, then 2 to leave b its share
    assert len(shed) == 3 and all(t > b_start for t in shed), texts["a"][-3000:]
    # b was admitted while a still had work: a gave growth back, b did not wait for its end
    assert shed[0] <= b_admitted < a_end, (shed, b_admitted, a_end)
