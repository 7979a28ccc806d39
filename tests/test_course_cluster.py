"""`make autograde CLUSTER=...`: a class graded on a real Dask cluster gets the grades of one machine,
and nothing is lost or counted twice when a worker or the scheduler goes away.

A real scheduler and two workers (the `dask scheduler` and `dask worker` commands on 127.0.0.1, free
ports, one thread each, killed at the end) grade a small class sandboxed (the solution, a planted bug,
an untouched release, an unreadable notebook, one that exhausts its memory): the same grades.csv as
JOBS=2 on this machine. Then, on the fixture chapter unsandboxed (cheap): one worker killed while it
grades, a submission that kills every worker it lands on, and the scheduler killed mid-run, whose
rerun grades only what was not graded. A worker's reply that fails authentication, names another
submission or other settings is refused (unit tests, no cluster).
"""
import contextlib
import csv
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.course.grading.autograde import autograde, main
from engine.course.grading.cluster import Job, refusal
from engine.course.grading.cluster_task import reply_mac, settings
from engine.course.grading.sandbox import Limits
from fixtures.course_support import (BUILD, FIXTURE_CHAPTER, FIXTURE_SOLUTIONS, REPO, SEALED_CHAPTER, expanded,
                                     sandbox_or_skip, stubbed, with_cells_added, with_solution, write_notebook)
from fixtures.sealed_cases import ALLOC, FULL, HOSTILE, SHARED, SLOT, WRONG_SLOT, _solution, _stub

DASK = Path(sys.executable).with_name("dask")
LIMITS = Limits(memory_mb=1536, processes=64, disk_mb=64, notebook_seconds=60)
GOOD_SLOT = ("def physical_slot(block_table, pos, block_size):\n"
             "    return block_table[pos // block_size], pos % block_size\n")
# Kills the process that runs it, unsandboxed: the grader's host, whose parent is the Dask worker.
KILLER = "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Cluster:
    """A scheduler and its workers, each command in a process group of its own (killed whole)."""

    def __init__(self, folder: Path):
        self.folder, self.port = folder, free_port()
        self.address = f"tcp://127.0.0.1:{self.port}"
        self.scheduler = self._start("scheduler", ["scheduler", "--host", "127.0.0.1", "--port", str(self.port),
                                                   "--dashboard-address", f"127.0.0.1:{free_port()}"])
        self.workers: list[subprocess.Popen] = []
        from distributed import Client
        self.client = Client(self.address, timeout=60, set_as_default=False)

    def _start(self, name: str, args: list[str]) -> subprocess.Popen:
        log = open(self.folder / f"{name}-{time.monotonic_ns()}.log", "w")
        return subprocess.Popen([str(DASK), *args], cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)

    def add_worker(self) -> None:
        self.workers.append(self._start("worker", ["worker", self.address, "--nthreads", "1",
                                                   "--host", "127.0.0.1", "--no-dashboard"]))

    def running(self) -> list[subprocess.Popen]:
        return [w for w in self.workers if w.poll() is None]

    def ensure_workers(self, count: int) -> None:
        while len(self.running()) < count:
            self.add_worker()
        self.client.wait_for_workers(count, timeout=120)
        deadline = time.monotonic() + 120   # and every nanny's worker back (a killed one restarts)
        while len(self.client.scheduler_info(n_workers=-1)["workers"]) < count and time.monotonic() < deadline:
            time.sleep(0.2)

    def worker_of(self, process: subprocess.Popen) -> set[str]:
        """The worker addresses (from the scheduler) whose process runs under `process` (a nanny's child)."""
        import psutil
        pids = {process.pid, *(c.pid for c in psutil.Process(process.pid).children(recursive=True))}
        return {address for address, pid in self.client.run(os.getpid).items() if pid in pids}

    @staticmethod
    def kill(process: subprocess.Popen) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.client.close(timeout=5)
        for process in [*self.workers, self.scheduler]:
            self.kill(process)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    sandbox_or_skip()
    running = Cluster(tmp_path_factory.mktemp("dask-logs"))
    try:
        running.ensure_workers(2)
        yield running
    finally:
        running.close()


def rows(grades: Path) -> dict[str, dict]:
    """grades.csv by student, without the timestamp column (the time nbgrader took it)."""
    return {row["student_id"]: {k: v for k, v in row.items() if k != "timestamp"}
            for row in csv.DictReader(grades.open(newline=""))}


# ---- the same grades.csv on a cluster as on one machine ---------------------------------------------

CLASS = {
    "solution": _solution,
    "planted_bug": lambda: with_solution(_solution(), "ch98_physical_slot", WRONG_SLOT),
    "untouched": _stub,
    "memory_hog": lambda: with_solution(_solution(), "ch98_physical_slot", HOSTILE["memory"] + GOOD_SLOT),
}


def sealed_class(folder: Path) -> Path:
    for student, make in CLASS.items():
        write_notebook(make(), folder / student, SEALED_CHAPTER.stem)
    (folder / "unreadable").mkdir(parents=True)
    (folder / "unreadable" / f"{SEALED_CHAPTER.stem}.ipynb").write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff")
    return folder


@pytest.fixture(scope="module")
def both(cluster, tmp_path_factory):
    root = tmp_path_factory.mktemp("cluster-class")
    submissions = sealed_class(root / "submissions")
    lines = {"here": [], "cluster": []}
    graded = {}
    for where, address in (("here", ""), ("cluster", cluster.address)):
        outputs = autograde(submissions, root / where, [SEALED_CHAPTER], timeout=30, jobs=2, sandbox="required",
                            progress=lines[where].append, limits=LIMITS, cluster=address)
        graded[where] = rows(outputs["grades"])
        kept = BUILD / "cluster-grades" / f"{where}.csv"          # for the comparison, after the run
        kept.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(outputs["grades"], kept)
    return graded, lines


def test_the_cluster_gives_the_grades_csv_of_two_jobs_on_one_machine(both):
    graded, _ = both
    assert graded["cluster"] == graded["here"]
    scores = {name: float(row["raw_score"] or 0) for name, row in graded["cluster"].items()}
    assert scores["solution"] == sum(FULL.values())
    assert scores["planted_bug"] == FULL[ALLOC] + FULL[SHARED] and FULL[SLOT] > 0
    assert scores["untouched"] == 0 and scores["unreadable"] == 0
    assert graded["cluster"]["unreadable"]["flags"].startswith("not graded:")
    assert scores["memory_hog"] == FULL[ALLOC] + FULL[SHARED], graded["cluster"]["memory_hog"]


def test_the_cluster_run_prints_its_dashboard_and_where_each_was_graded(both, cluster):
    _, lines = both
    said = "\n".join(lines["cluster"])
    assert re.search(rf"cluster {cluster.address}: 2 worker\(s\), 2 submission\(s\) at a time; "
                     r"dashboard: http://127\.0\.0\.1:\d+/status", said), said
    progress = [line for line in lines["cluster"] if re.match(r"\[\d/4, [\d.]+/min, \d+ s left\] ", line)]
    assert len(progress) == 4 and all(" on tcp://127.0.0.1:" in line for line in progress), said
    [summary] = [line for line in lines["cluster"] if line.startswith("graded ")]
    counts = re.findall(r"(\d+) on (tcp://127\.0\.0\.1:\d+)", summary)
    assert summary.startswith("graded 4 of 4 submission(s): ") and sum(int(n) for n, _ in counts) == 4, summary
    assert any(line.startswith("graded 4 of 4 submission(s): 4 on this machine") for line in lines["here"])


# ---- faults: a worker killed, a submission that kills its workers, the scheduler gone -------------

def fixture_class(folder: Path, count: int, extra: dict | None = None) -> dict[str, str]:
    """`count` students on the fixture chapter, solution and release in turn; {student: kind}."""
    kinds = {f"s{number}": ("solution" if number % 2 else "release") for number in range(count)}
    for student, kind in kinds.items():
        notebook = expanded(FIXTURE_CHAPTER)
        write_notebook(notebook if kind == "solution" else stubbed(notebook), folder / student, FIXTURE_CHAPTER.stem)
    for student, notebook in (extra or {}).items():
        write_notebook(notebook, folder / student, FIXTURE_CHAPTER.stem)
        kinds[student] = "extra"
    return kinds


FULL_FIXTURE = 6.0   # the fixture chapter's autograded points (its written answer is graded by hand)


def command(submissions: Path, course: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "engine.course.grading.autograde", str(submissions), "--course", str(course),
            "--solutions", str(FIXTURE_SOLUTIONS), "--sandbox", "off", "--timeout", "60", *extra]


def test_a_worker_killed_mid_submission_costs_nothing_and_counts_once(cluster, tmp_path):
    cluster.ensure_workers(2)
    kinds = fixture_class(tmp_path / "submissions", 4)
    run = subprocess.Popen(command(tmp_path / "submissions", tmp_path / "course", "--cluster", cluster.address),
                           cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    victim, deadline = cluster.running()[0], time.monotonic() + 300
    doomed = cluster.worker_of(victim)
    while not any(cluster.client.processing(list(doomed)).values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert time.monotonic() < deadline, "no submission reached the worker to kill"
    cluster.kill(victim)                                   # the worker and its nanny, mid-submission
    out, _ = run.communicate(timeout=600)
    assert run.returncode == 0, out
    graded = rows(tmp_path / "course" / "grades.csv")
    assert {name: float(row["raw_score"]) for name, row in graded.items()} == {
        name: FULL_FIXTURE if kind == "solution" else 0.0 for name, kind in kinds.items()}, out
    assert len(re.findall(r"its worker tcp://\S+ died; sent to another worker", out)) == 1, out
    done = re.findall(r"^\[\d/4, .*\] (s\d) ch99_fixture: [\d/]+ on (tcp://\S+)", out, re.MULTILINE)
    assert sorted(name for name, _ in done) == sorted(kinds), out          # each graded once, none twice
    assert all(where not in doomed for _, where in done), out
    assert "graded 4 of 4 submission(s): 4 on tcp://" in out and "1 sent again" in out, out
    assert sorted(p.parent.name for p in (tmp_path / "course" / "sandbox" / "results").glob("*/*.json")) == \
        sorted(kinds)


def test_a_submission_that_stops_every_worker_is_reported_and_the_class_graded(cluster, tmp_path):
    cluster.ensure_workers(2)
    killer = with_cells_added(expanded(FIXTURE_CHAPTER), "setup", KILLER)
    kinds = fixture_class(tmp_path / "submissions", 2, {"killer": killer})
    run = subprocess.run(command(tmp_path / "submissions", tmp_path / "course", "--cluster", cluster.address),
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    out = run.stdout + run.stderr
    assert run.returncode == 1, out                        # one submission not graded: exit 1, and why
    graded = rows(tmp_path / "course" / "grades.csv")
    assert graded["killer"]["flags"] == "not graded: ch99_fixture.ipynb: it stopped 2 workers", out
    assert float(graded["killer"]["score"]) == 0
    assert {name: float(graded[name]["raw_score"]) for name in kinds if name != "killer"} == {
        name: FULL_FIXTURE if kind == "solution" else 0.0 for name, kind in kinds.items() if kind != "extra"}
    assert "killer ch99_fixture: not graded: it stopped 2 workers" in out
    assert "autograde: 1 submission(s) could not be graded" in run.stderr


def test_the_scheduler_gone_stops_the_run_and_a_rerun_grades_only_the_rest(cluster, tmp_path):
    cluster.ensure_workers(2)
    kinds = fixture_class(tmp_path / "submissions", 4)
    course = tmp_path / "course"
    run = subprocess.Popen(command(tmp_path / "submissions", course, "--cluster", cluster.address), cwd=REPO,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    results, deadline = course / "sandbox" / "results", time.monotonic() + 300
    while not list(results.glob("*/*.json")) and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    cluster.kill(cluster.scheduler)
    out, _ = run.communicate(timeout=300)
    kept = sorted(p.parent.name for p in results.glob("*/*.json"))
    assert run.returncode == 1 and 0 < len(kept) < len(kinds), out
    assert re.search(rf"autograde: the Dask scheduler at {cluster.address} went away with {len(kept)} of 4 "
                     r"submission\(s\) graded; .* run the same command again", out), out
    again = subprocess.run(command(tmp_path / "submissions", course, "--jobs", "2"), cwd=REPO,
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"{len(kept)} submission(s) already graded" in again.stdout, again.stdout
    left = len(kinds) - len(kept)
    assert f"graded {left} of {left} submission(s): {left} on this machine" in again.stdout, again.stdout
    named = re.findall(r"^\[\d/\d, .*\] (s\d) ch99_fixture", again.stdout, re.MULTILINE)
    assert sorted(named + kept) == sorted(kinds), again.stdout                  # nothing twice, nothing lost
    graded = rows(course / "grades.csv")
    assert {name: float(row["raw_score"]) for name, row in graded.items()} == {
        name: FULL_FIXTURE if kind == "solution" else 0.0 for name, kind in kinds.items()}


# ---- what the coordinator takes from a worker (no cluster) ----------------------------------------

@pytest.fixture
def job(tmp_path):
    path = write_notebook(expanded(FIXTURE_CHAPTER), tmp_path / "submitted" / "ada" / "ch99", FIXTURE_CHAPTER.stem)
    return Job(path, FIXTURE_CHAPTER, settings(FIXTURE_CHAPTER, 60, "off", Limits()))


def signed(job: Job, key: bytes, **changes) -> dict:
    import hashlib
    reply = {"student": job.student, "assignment": job.assignment, "score": "6/6", "worker": "tcp://w:1",
             "sha256": hashlib.sha256(job.path.read_bytes()).hexdigest(),
             "result": {"outputs": {}, "flags": [], "changes": [], "grader": job.grader}, **changes}
    return dict(reply, mac=reply_mac(key, reply))


def test_an_authentic_reply_for_the_job_is_taken(job):
    assert refusal(signed(job, b"k" * 32), job, b"k" * 32) == ""


def test_a_reply_under_another_key_or_rewritten_is_refused(job):
    key = b"k" * 32
    assert "fails authentication" in refusal(signed(job, b"x" * 32), job, key)
    rewritten = signed(job, key)
    rewritten["score"] = "0/6"
    assert "fails authentication" in refusal(rewritten, job, key)
    assert "not a signed result" in refusal({"result": {}}, job, key)
    assert "not a signed result" in refusal("6/6", job, key)


def test_a_reply_for_another_submission_or_other_settings_is_refused(job):
    key = b"k" * 32
    assert "another submission (bob/ch99" in refusal(signed(job, key, student="bob"), job, key)
    assert "another submission" in refusal(signed(job, key, sha256="0" * 64), job, key)
    other = dict(job.grader, timeout=1)
    assert "other settings" in refusal(signed(job, key, result={"outputs": {}, "grader": other}), job, key)


def test_a_cluster_address_that_is_not_one_is_refused_before_anything_is_written(tmp_path, capsys):
    write_notebook(expanded(FIXTURE_CHAPTER), tmp_path / "submissions" / "ada", FIXTURE_CHAPTER.stem)
    with pytest.raises(SystemExit) as stopped:
        main([str(tmp_path / "submissions"), "--course", str(tmp_path / "course"), "--cluster", "localhost"])
    assert stopped.value.code == 2 and "expected tcp://HOST:PORT" in capsys.readouterr().err
    assert not (tmp_path / "course").exists()


def test_no_scheduler_at_the_address_is_refused_before_anything_is_written(tmp_path, capsys):
    write_notebook(expanded(FIXTURE_CHAPTER), tmp_path / "submissions" / "ada", FIXTURE_CHAPTER.stem)
    address = f"tcp://127.0.0.1:{free_port()}"
    with pytest.raises(SystemExit) as stopped:
        main([str(tmp_path / "submissions"), "--course", str(tmp_path / "course"), "--cluster", address])
    assert stopped.value.code == 2 and f"no Dask scheduler answers at {address}" in capsys.readouterr().err
    assert not (tmp_path / "course").exists()
