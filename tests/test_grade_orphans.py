"""No process outlives its submission: a grader killed with SIGKILL in the middle of a notebook (`make
grade`, `make autograde`) leaves no host, judge, warm process, sandbox launcher or bubblewrap running.

Every process the grader starts inherits a marker from its environment (a COURSE_ variable, which the
sandbox passes in), so the test finds the whole tree in /proc, whichever namespace or session a process
is in, and after the kill finds what is left of it. The notebook's `square` cell never ends: the grader
is killed while the host spins in it and the judge waits for it.
"""
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from engine.course.grading.sandbox import available
from fixtures.course_support import (FIXTURE_CHAPTER, FIXTURE_SOLUTIONS, REPO, expanded, sandbox_or_skip,
                                     with_cell_edited, write_notebook)

pytestmark = [pytest.mark.slow]
MARK = "COURSE_ORPHAN_TEST"
ENDLESS = "def square(x):\n    while True:\n        pass\n\n\nsquare(0)\n"
SPUN_S = 6.0          # the host's CPU seconds by which it is surely in the endless cell (its start takes ~3)
GONE_WITHIN_S = 10.0  # how long the killed grader's processes may take to end


def marked(mark: str) -> dict[int, str]:
    """{pid: command line} of every process whose environment holds MARK=mark (this test's own aside)."""
    wanted = f"{MARK}={mark}".encode()
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as handle:
                if wanted not in handle.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                found[int(entry)] = handle.read().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
    return found


def shown(processes: dict[int, str]) -> dict[int, str]:
    """The processes for a message: each command line's start and the module it runs."""
    return {pid: line[:120] + " ... " + line[-80:] if len(line) > 220 else line for pid, line in processes.items()}


def cpu_seconds(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def the_host(processes: dict[int, str]) -> int | None:
    return next((pid for pid, line in processes.items() if "sealed.host" in line and "bwrap" not in line
                 and "--launch" not in line), None)


def kill_mid_cell(command: list[str], mark: str, tmp_path, look=None) -> tuple[dict[int, str], dict[int, str]]:
    """Start the grader, wait until the host spins in the endless cell, `look(grader's pid, processes)`
    if given, SIGKILL the grader alone; (what ran just before the kill, what of it still runs
    GONE_WITHIN_S later)."""
    env = dict(os.environ, **{MARK: mark}, PYTHONPATH=str(REPO))
    log = (tmp_path / "grader.log").open("w")
    grader = subprocess.Popen(command, cwd=str(REPO), env=env, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and grader.poll() is None:
            host = the_host(marked(mark))
            if host is not None and cpu_seconds(host) >= SPUN_S:
                break
            time.sleep(0.5)
        assert grader.poll() is None, (tmp_path / "grader.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "the host never spun in the endless cell"
        before = marked(mark)
        if look is not None:
            look(grader.pid, before)
        os.kill(grader.pid, signal.SIGKILL)      # the grader only: not its process group
        grader.wait()
        ended = time.monotonic() + GONE_WITHIN_S
        while marked(mark) and time.monotonic() < ended:
            time.sleep(0.2)
        return before, marked(mark)
    finally:
        for pid in marked(mark):                   # whatever the assertion says, nothing stays behind
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        log.close()


def endless_notebook(folder) -> None:
    write_notebook(with_cell_edited(expanded(FIXTURE_CHAPTER), "square", lambda s: ENDLESS), folder, "ch99_fixture")


def test_a_killed_make_grade_leaves_nothing_running(tmp_path):
    mark = uuid.uuid4().hex
    endless_notebook(tmp_path / "notebooks")
    command = [sys.executable, "-m", "engine.course.grading.grade", str(tmp_path / "notebooks"), "--solutions",
               str(FIXTURE_SOLUTIONS), "--timeout", "300", "--jobs", "1"]
    before, left = kill_mid_cell(command, mark, tmp_path)
    lines = list(before.values())
    assert any("sealed.host" in line for line in lines), shown(before)
    assert any("sealed.judge" in line or "sealed.warm" in line for line in lines), shown(before)
    if available()[0]:
        assert any("bwrap" in line for line in lines), shown(before)   # the host was in its sandbox
    assert left == {}, f"still running {GONE_WITHIN_S:g} s after the grader was killed: {shown(left)}"


@pytest.mark.skipif(not available()[0], reason="the sandboxed autograde needs bubblewrap")
def test_a_killed_make_autograde_leaves_nothing_running(tmp_path):
    mark = uuid.uuid4().hex
    endless_notebook(tmp_path / "submissions" / "ada")
    command = [sys.executable, "-m", "engine.course.grading.autograde", str(tmp_path / "submissions"), "--course",
               str(tmp_path / "course"), "--solutions", str(FIXTURE_SOLUTIONS), "--sandbox", "required",
               "--timeout", "300", "--jobs", "1"]
    before, left = kill_mid_cell(command, mark, tmp_path)
    lines = list(before.values())
    assert any("sealed.host" in line for line in lines) and any("bwrap" in line for line in lines), shown(before)
    assert left == {}, f"still running {GONE_WITHIN_S:g} s after the grader was killed: {shown(left)}"


def parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as handle:
        return int(handle.read().rpartition(")")[2].split()[1])


def status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as handle:
        return dict(line.split(":\t", 1) for line in handle.read().splitlines() if ":\t" in line)


def judges_of(processes: dict[int, str]) -> list[int]:
    """The judges among the run's processes: forks of the warm process (a warm Python whose parent runs
    the same command line), or a judge started on its own; never bubblewrap or the sandbox's launcher."""
    def python(line: str) -> bool:
        return line.startswith(sys.executable) and "--launch" not in line
    warm = {pid for pid, line in processes.items() if "sealed.warm" in line and python(line)}
    forked = [pid for pid in warm if parent(pid) in warm]
    return forked + [pid for pid, line in processes.items() if "sealed.judge import main" in line and python(line)]


def as_user(uid: int, gid: int, code: str) -> subprocess.CompletedProcess:
    """Python `code` run as `uid` without capabilities: what another process of the judge's user can do."""
    prefix = ["/usr/bin/setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--inh-caps=-all",
              "--bounding-set=-all", "--"] if os.geteuid() == 0 else []
    return subprocess.run(prefix + [sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True,
                          timeout=60)


def apart(judge: int, grader: int, secrets: list) -> list[str]:
    """What is wrong with the judge's confinement: it runs as root or as the grader, sees the grader's
    files (`secrets`: paths the grader can read, the course's result key among them), or a process of its
    own user can read its descriptors (it is dumpable)."""
    wrong = []
    uid, gid = (int(status(judge)[k].split()[0]) for k in ("Uid", "Gid"))
    if uid == 0 or uid == int(status(grader)["Uid"].split()[0]):
        wrong.append(f"runs as uid {uid}, the grader's or root")
    if os.readlink(f"/proc/{judge}/ns/mnt") == os.readlink(f"/proc/{grader}/ns/mnt"):
        wrong.append("sees the grader's mounts")
    for path in secrets:
        assert os.path.exists(path), path                       # the grader can open it ...
        try:                                                    # ... in the judge's view of the disk it is not there
            open(f"/proc/{judge}/root{path}", "rb").close()
            wrong.append(f"can open {path}")
        except FileNotFoundError:
            pass
    peek = as_user(uid, gid, f"import os; print(len(os.listdir('/proc/{judge}/fd')))")
    if peek.returncode == 0:
        wrong.append(f"uid {uid} can list its descriptors (it is dumpable): {peek.stdout.strip()} of them")
    elif "PermissionError" not in peek.stderr:
        wrong.append(f"looking at its descriptors failed otherwise: {peek.stderr[-300:]}")
    return wrong


def course_key(folder) -> str:
    """A stand-in course's result key, readable by anyone: only the judge's view of the disk keeps it out."""
    key = folder / "course" / "instructor" / "result-key"
    key.parent.mkdir(parents=True)
    key.write_bytes(os.urandom(32))
    key.chmod(0o644)
    return str(key)


@pytest.mark.parametrize("grader", ["make grade", "make autograde"])
def test_the_judge_runs_apart_from_the_grader(tmp_path, grader):
    """issue 36 item 4: the judge (forked from the warm process) runs as nobody in a sandbox of its own,
    without the course's result key or the grader's files, and is not dumpable."""
    sandbox_or_skip()
    mark, seen = uuid.uuid4().hex, {}
    if grader == "make grade":
        endless_notebook(tmp_path / "notebooks")
        key = course_key(tmp_path)
        command = [sys.executable, "-m", "engine.course.grading.grade", str(tmp_path / "notebooks"), "--solutions",
                   str(FIXTURE_SOLUTIONS), "--timeout", "300", "--jobs", "1"]
    else:
        endless_notebook(tmp_path / "submissions" / "ada")
        key = str(tmp_path / "course" / "instructor" / "result-key")     # made by autograde, 0600
        command = [sys.executable, "-m", "engine.course.grading.autograde", str(tmp_path / "submissions"), "--course",
                   str(tmp_path / "course"), "--solutions", str(FIXTURE_SOLUTIONS), "--sandbox", "required",
                   "--timeout", "300", "--jobs", "1"]
    secrets = [key, str(FIXTURE_CHAPTER), str(REPO / "pyproject.toml")]

    def look(pid: int, processes: dict[int, str]) -> None:
        seen.update({judge: apart(judge, pid, secrets) for judge in judges_of(processes)})
    kill_mid_cell(command, mark, tmp_path, look)
    assert len(seen) == 1, seen                       # the one judge, forked from the warm process
    assert list(seen.values()) == [[]], seen


def test_a_judge_started_on_its_own_runs_apart_too(tmp_path):
    """The cold start (no warm process): the judge in its own sandbox, as the warm one's forks."""
    sandbox_or_skip()
    from engine.course.grading.kernel import SealedKernel
    key = course_key(tmp_path)
    plan = {"preimport": ["engine"], "graded": {}, "graded_by_cell": {}, "judge_cells": [], "references": []}
    mark = uuid.uuid4().hex
    os.environ[MARK] = mark
    try:
        with SealedKernel(plan, cwd=tmp_path, warm=False) as kernel:
            assert kernel.run_cell("print(6 * 7)", "learner", "a", 60).outputs[0]["text"] == "42\n"
            judges = judges_of(marked(mark))
            assert len(judges) == 1, shown(marked(mark))
            assert apart(judges[0], os.getpid(), [key, str(REPO / "pyproject.toml")]) == []
    finally:
        del os.environ[MARK]
