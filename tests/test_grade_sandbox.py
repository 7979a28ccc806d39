"""`make autograde`, sealed and sandboxed: nbgrader's scores are the sealed worker's, and hostile
submissions cost only their own points and harm nothing.

One autograde run (nbgrader's own commands, the course's config, small limits: 1.5 GB of memory, 64
processes, 64 MB of disk, 30 s a cell and 40 s a notebook) grades every case of
tests/fixtures/sealed_cases.py (the cheats earn their honest score here too) and the hostile
submissions, each the full solution with the physical_slot exercise replaced by an attack that raises
when it fails (so the exercise earns its point only if the attack worked): writing outside its folder,
reading another student's notebook, opening a socket, allocating far beyond the memory limit, forking
without end, and the attacks a root sandbox once let through: remounting the repository read-write,
unmounting what hides other students' work and solutions/, rewriting another student's sealed result,
connecting to a unix socket under /run, leaving the pids cgroup, using more memory than the limit
across 4 processes, writing past the disk quota, and running past the notebook's time limit in many
short cells. Some of them have folder names nbgrader cannot take as ids (a dot, glob characters,
spaces, unicode): they are graded and listed under those names. Nothing outside the hostile
submissions' folders may change: the other students' files and rows are checked byte for byte.
"""
import csv
import hashlib
import os
import socket
import subprocess
import sys
import shutil
import threading
from pathlib import Path

import pytest

from engine.course.grading import sandbox
from engine.course.grading.autograde import autograde
from engine.course.grading.grade import sandboxed_grade
from engine.course.grading.sandbox import Limits
from fixtures.course_support import (BUILD, REPO, SEALED_CHAPTER, expanded, once_per_run, sandbox_or_skip,
                                     with_cell_edited, with_cells_added, with_solution, write_notebook)
from fixtures.sealed_cases import ALLOC, CASES, FULL, HOSTILE, SHARED, _solution

pytestmark = [pytest.mark.slow]
TARGET = REPO / "sandbox-escape-probe.txt"
GOOD_SLOT = ("def physical_slot(block_table, pos, block_size):\n"
             "    return block_table[pos // block_size], pos % block_size\n")
LIMITS = Limits(memory_mb=1536, processes=64, disk_mb=64, notebook_seconds=40)
CELL_TIMEOUT = 30
VICTIM = "honest_solution"
# Written by an attack that got somewhere; built at run time, so no source file holds it.
MARK = 'MARK = "sandbox" + "-escape-" + "written"\n'
MARKER = "sandbox-escape-written"
SOCKET = Path("/run") / f"paged-kv-sandbox-probe-{os.getpid()}.sock"

ROOT_ATTACKS = {  # what a submission did to a root sandbox (issue 19); each must raise here
    "remount_repository": MARK + """
import subprocess
engine = {engine!r}
for command in (["mount", "-o", "remount,rw", "/"], ["mount", "-o", "remount,rw,bind", engine, engine],
                ["unshare", "-Urm", "sh", "-c", f"mount -o remount,rw,bind {{engine}} {{engine}} && "
                 f"echo {{MARK}} > {{engine}}/sandbox-escape-probe.txt"]):
    subprocess.run(command, capture_output=True, timeout=10)
open({target!r}, "w").write(MARK)
open(engine + "/sandbox-escape-probe.txt", "w").write(MARK)
""",
    "unmount_hiding_layer": """
import os, subprocess
for path in ({course!r}, {submissions!r}, {solutions!r}):
    subprocess.run(["umount", "-l", path], capture_output=True, timeout=10)
    subprocess.run(["unshare", "-Urm", "umount", "-l", path], capture_output=True, timeout=10)
print(open({other!r}).read()[:80], sorted(os.listdir({solutions!r}))[:3])
""",
    "rewrite_other_result": MARK + """
import os
wrote = []
for path in ({result!r}, {flags!r}, {other!r}, {submitted!r}, {gradebook!r}):
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as handle:
            handle.write(MARK)
        wrote.append(path)
    except OSError:
        pass
if not wrote:
    raise PermissionError("no other student's file is writable")
""",
    "run_socket": """
import socket
for path in ({socket!r}, {socket!r}.replace("/run/", "/var/run/")):
    try:
        socket.socket(socket.AF_UNIX).connect(path)
        break
    except OSError as error:
        failed = error
else:
    raise failed
""",
    "leave_pids_cgroup": """
import glob, os, subprocess, time
for procs in ["/sys/fs/cgroup/cgroup.procs", "/sys/fs/cgroup/pids/cgroup.procs",
              "/sys/fs/cgroup/unified/cgroup.procs", *glob.glob("/sys/fs/cgroup/*/cgroup.procs")]:
    try:
        open(procs, "w").write(str(os.getpid()))
    except OSError:
        pass
subprocess.run(["unshare", "-Urm", "--mount-proc", "sh", "-c", "mkdir -p /tmp/cg && mount -t cgroup2 none "
                "/tmp/cg && echo $$ > /tmp/cg/cgroup.procs"], capture_output=True, timeout=10)
kids = []
try:
    for _ in range({processes} + 8):
        pid = os.fork()
        if pid == 0:
            time.sleep(30)
            os._exit(0)
        kids.append(pid)
except OSError:
    pass
for pid in kids:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
if len(kids) < {processes}:
    raise BlockingIOError(f"only {{len(kids)}} processes")
""",
    "memory_across_4_processes": """
import os, time
share = {memory_mb} * 2**20 // 3
kids = []
for _ in range(3):
    pid = os.fork()
    if pid == 0:
        hog = b"x" * share
        time.sleep(2)
        os._exit(0)
    kids.append(pid)
hog = b"x" * share
statuses = [os.waitpid(pid, 0)[1] for pid in kids]
if any(statuses):
    raise MemoryError(f"the memory limit stopped it: {{statuses}}")
""",
    "past_disk_quota": """
def fill(folder, megabytes={disk_mb} + 16):
    with open(f"{{folder}}/fill", "wb") as handle:
        for _ in range(megabytes):
            handle.write(b"x" * 2**20)
for folder in (".", "/tmp", "/dev/shm"):
    try:
        fill(folder)
        break
    except OSError as error:
        failed = error
else:
    raise failed
""",
}
# A folder name nbgrader cannot take, for some of them: graded, and listed under it.
NAMES = {"remount_repository": "hostile remount ü", "memory_across_4_processes": "hostile_[memory]*4?",
         "past_disk_quota": ".hostile disk"}
TIME_ATTACKER = ".hostile time limit"   # first in line: its 40 s overlap the others
SLEEPY_CELLS = 30                          # 30 cells of 2 s, each well under the 30 s per cell


def hostile_cases(submissions, course) -> dict:
    other = submissions / VICTIM / f"{SEALED_CHAPTER.stem}.ipynb"
    where = dict(target=str(TARGET), other=str(other), engine=str(REPO / "engine"), course=str(course),
                 submissions=str(submissions), solutions=str(REPO / "solutions"), socket=str(SOCKET),
                 result=str(course / "sandbox" / "results" / VICTIM / "ch98.json"),
                 flags=str(course / "sandbox" / "flags" / VICTIM / "ch98.json"),
                 submitted=str(course / "submitted" / VICTIM / "ch98" / other.name),
                 gradebook=str(course / "gradebook.db"), processes=LIMITS.processes, memory_mb=LIMITS.memory_mb,
                 disk_mb=LIMITS.disk_mb)
    sources = {f"hostile_{name}": code.format(**where) for name, code in {**HOSTILE, **ROOT_ATTACKS}.items()}
    note = sandbox.limits_note()
    if "pids cgroup" in note:
        sources.pop("hostile_fork_bomb")  # no pids cgroup here: a fork bomb would not be bounded
        sources.pop("hostile_leave_pids_cgroup")
    if "memory cgroup" in note:
        sources.pop("hostile_memory_across_4_processes")
    cases = {NAMES.get(name[len("hostile_"):], name): with_solution(_solution(), "ch98_physical_slot", code + GOOD_SLOT)
             for name, code in sources.items()}
    cases[TIME_ATTACKER] = with_cells_added(_solution(), "ch98_setup", *["import time\ntime.sleep(2)"] * SLEEPY_CELLS)
    return cases


def digests(*folders) -> dict:
    """{path: sha256} of every file under the folders."""
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for folder in folders if folder.exists()
            for p in sorted(folder.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


def run_autograde() -> dict:
    root = BUILD / "sandbox-autograde"
    shutil.rmtree(root, ignore_errors=True)
    submissions, course = root / "submissions", root / "course"
    for name, (make, _, _) in CASES.items():
        write_notebook(make(), submissions / name, SEALED_CHAPTER.stem)
    hostile = hostile_cases(submissions, course)
    for name, notebook in hostile.items():
        write_notebook(notebook, submissions / name, SEALED_CHAPTER.stem)
    others = [submissions / name for name in CASES]
    before = digests(*others, SEALED_CHAPTER.parent)   # (engine/ and solutions/: the marker search below)
    server, accepted = socket.socket(socket.AF_UNIX), []
    SOCKET.unlink(missing_ok=True)
    server.bind(str(SOCKET))
    server.listen()
    threading.Thread(target=lambda: accepted.append(server.accept()), daemon=True).start()
    victim_result = course / "sandbox" / "results" / VICTIM / "ch98.json"
    seen = []   # the victim's sealed result, as each later submission finished

    def progress(line):
        lines.append(line)
        if victim_result.is_file():
            seen.append(hashlib.sha256(victim_result.read_bytes()).hexdigest())
    lines = []
    try:
        outputs = autograde(submissions, course, [SEALED_CHAPTER], timeout=CELL_TIMEOUT, jobs=2,
                            sandbox="required", progress=progress, limits=LIMITS)
    finally:
        server.close()
        SOCKET.unlink(missing_ok=True)
    rows = {row["student_id"]: row for row in csv.DictReader(outputs["grades"].open(newline=""))}
    after = digests(*others, SEALED_CHAPTER.parent)
    places = (*course.rglob("*"), *submissions.rglob("*"), *REPO.glob("*"), *(REPO / "engine").rglob("*"),
              *(REPO / "solutions").rglob("*"))
    marked = [str(p) for p in places if p.is_file() and MARKER.encode() in p.read_bytes()]
    return {"rows": rows, "progress": lines, "escaped": TARGET.exists() or (REPO / "engine" / TARGET.name).exists(),
            "hostile": sorted(hostile), "changed": sorted(k for k in set(before) | set(after)
                                                            if before.get(k) != after.get(k)),
            "marked": marked, "victim_result_seen": seen, "socket_connections": len(accepted)}


@pytest.fixture(scope="module")
def graded():
    sandbox_or_skip()
    return once_per_run("sandbox-autograde", run_autograde)


@pytest.mark.parametrize("case", list(CASES))
def test_autograde_gives_every_case_its_honest_score(graded, case):
    _, expected, _ = CASES[case]
    row = graded["rows"][case]
    assert float(row["raw_score"]) == sum(expected.values()), row


def test_hostile_code_costs_only_its_own_exercise(graded):
    hostile = {name: graded["rows"][name] for name in graded["hostile"] if name != TIME_ATTACKER}
    assert len(hostile) >= 10
    for name, row in hostile.items():
        assert float(row["raw_score"]) == FULL[ALLOC] + FULL[SHARED], (name, row)


def test_hostile_code_changes_nothing_outside_its_folder(graded):
    assert not graded["escaped"], "a submission wrote outside its folder"
    assert not graded["changed"], f"files outside the hostile submissions changed: {graded['changed'][:5]}"
    assert not graded["marked"], f"a hostile submission wrote into {graded['marked'][:5]}"
    assert graded["socket_connections"] == 0, "a submission reached a unix socket under /run"
    seen = graded["victim_result_seen"]
    assert seen and len(set(seen)) == 1, "another student's sealed result changed while the others ran"
    victim = graded["rows"][VICTIM]
    assert float(victim["raw_score"]) == 5 and "verbatim" in victim["flags"], victim


def test_a_notebook_past_its_time_limit_is_stopped_and_says_so(graded):
    row = graded["rows"][TIME_ATTACKER]
    assert float(row["raw_score"]) == 0, row
    assert f"the notebook ran past its {LIMITS.notebook_seconds} s limit" in row["flags"], row
    line = next(line for line in graded["progress"] if TIME_ATTACKER in line)
    seconds = float(line.rsplit("(", 1)[1].split(" s)")[0])
    assert seconds < LIMITS.notebook_seconds + CELL_TIMEOUT, line   # not 30 cells x 2 s = 60 s and more


def test_odd_folder_names_are_graded_under_their_own_names(graded):
    for name in [*NAMES.values(), TIME_ATTACKER]:
        if name in graded["hostile"]:
            assert name in graded["rows"] and graded["rows"][name]["nbgrader_id"] != name, name


def test_progress_and_flags(graded):
    assert any(line.startswith("[1/") for line in graded["progress"])
    assert any(line.startswith(f"[{len(graded['rows'])}/") for line in graded["progress"])
    assert "verbatim" in graded["rows"]["honest_solution"]["flags"]
    assert float(graded["rows"]["cheat_gc_key_hunt"]["raw_score"]) == 0


def test_the_sandboxed_process_is_nobody_without_capabilities(tmp_path):
    sandbox_or_skip()
    box = sandbox.Sandbox(tmp_path / "work", limits=LIMITS)
    try:
        run = subprocess.run(box(["sh", "-c", "id -u; grep -E '^Cap(Prm|Eff|Bnd|Amb)' /proc/self/status; "
                                  "ls /run /sys/fs/cgroup 2>&1; touch /usr/x 2>&1; df -m . | tail -1"], tmp_path),
                             capture_output=True, text=True, timeout=60, cwd=tmp_path)
    finally:
        box.close()
    lines = run.stdout.splitlines()
    assert lines[0] == "65534", run.stdout + run.stderr
    assert all(line.split()[1] == "0000000000000000" for line in lines[1:5]), lines
    assert "No such file or directory" in run.stdout and "Read-only file system" in run.stdout
    assert lines[-1].split()[1] == str(LIMITS.disk_mb), lines[-1]   # the working folder's quota, in MB


def test_a_missing_sandbox_is_said_clearly(monkeypatch):
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    sandbox._mode.cache_clear()
    try:
        usable, why = sandbox.available()
    finally:
        monkeypatch.undo()
        sandbox._mode.cache_clear()
    assert not usable and "bubblewrap is not installed" in why and "apt-get install bubblewrap" in why


def test_a_python_installed_under_tmp_stays_visible_in_the_sandbox(monkeypatch, tmp_path):
    # The sandbox gives /tmp a fresh tmpfs; a clone or venv in /tmp (a fresh clone in /tmp/course, a
    # venv built there) must be bound back, or the worker cannot even start Python.
    sandbox_or_skip()
    if not str(tmp_path).startswith("/tmp/"):
        pytest.skip(f"pytest's tmp_path {tmp_path} is not under /tmp")
    prefix = tmp_path / "venv"
    (prefix / "lib").mkdir(parents=True)
    (prefix / "lib" / "marker.txt").write_text("still here")
    (tmp_path / "hidden").mkdir()
    (tmp_path / "hidden" / "secret.txt").write_text("no")
    monkeypatch.setattr(sys, "prefix", str(prefix))
    box = sandbox.Sandbox(tmp_path / "work", hide=[tmp_path / "hidden"])
    try:
        run = subprocess.run(box(["cat", str(prefix / "lib" / "marker.txt"), str(tmp_path / "hidden" / "secret.txt")],
                                 tmp_path / "work"), capture_output=True, text=True, timeout=60)
    finally:
        box.close()
    assert run.stdout.startswith("still here"), f"the prefix under /tmp vanished in the sandbox: {run.stderr}"
    assert "secret.txt" in run.stderr and "no" not in run.stdout.replace("still here", ""), \
        "a hidden folder became readable again"


def test_a_worker_that_cannot_start_says_why(tmp_path):
    # A wrapper that breaks Python (as a sandbox hiding the venv does): the message carries what
    # starting Python that way printed, not only a guess.
    from engine.course.grading.kernel import SealedKernel

    def broken(argv, cwd, **where):
        return ["sh", "-c", "echo 'python3: No module named engine' >&2; exit 3"]
    kernel = SealedKernel({}, cwd=tmp_path, wrap=broken, startup_timeout=5)
    with pytest.raises(RuntimeError) as raised:
        kernel.start()
    assert kernel.process is None, "the failed worker's process and pipes were left behind"
    assert "did not start" in str(raised.value) and "exits 3: python3: No module named engine" in str(raised.value)


def run_in_bare_sandbox(tmp_path, code: str, hide=(), readable=()) -> subprocess.CompletedProcess:
    """`code` run by Python in the sandbox alone (no sealed worker around it): what the sandbox itself
    stops. `readable`: folders bound
    in besides the system and Python's (the sandbox binds nothing of the repository)."""
    box = sandbox.Sandbox(tmp_path / "work", hide=list(hide), limits=LIMITS)
    try:
        return subprocess.run(box([sys.executable, "-I", "-c", code], tmp_path, readable=list(readable)),
                              capture_output=True, text=True, timeout=120, cwd=tmp_path)
    finally:
        box.close()


@pytest.mark.parametrize("attack", sorted(ROOT_ATTACKS))
def test_the_sandbox_alone_stops_each_root_attack(tmp_path, attack):
    sandbox_or_skip()
    note = sandbox.limits_note()
    if (attack == "leave_pids_cgroup" and "pids cgroup" in note) or (
            attack == "memory_across_4_processes" and "memory cgroup" in note):
        pytest.skip(f"not bounded on this machine: {note}")
    course, submissions = tmp_path / "course", tmp_path / "submissions"
    other = submissions / VICTIM / "ch98.ipynb"
    for path in (other, course / "results" / "r.json", tmp_path / "solutions" / "s.py"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("another student's")
    target = tmp_path / "escape.txt"
    probe = Path("/run") / f"paged-kv-bare-probe-{os.getpid()}.sock"
    where = dict(target=str(target), other=str(other), engine=str(REPO / "engine"), course=str(course),
                 submissions=str(submissions), solutions=str(tmp_path / "solutions"), socket=str(probe),
                 result=str(course / "results" / "r.json"), flags=str(course / "flags.json"),
                 submitted=str(course / "submitted.ipynb"), gradebook=str(course / "gradebook.db"),
                 processes=LIMITS.processes, memory_mb=LIMITS.memory_mb, disk_mb=LIMITS.disk_mb)
    server, accepted = socket.socket(socket.AF_UNIX), []
    probe.unlink(missing_ok=True)
    server.bind(str(probe))
    server.listen()
    threading.Thread(target=lambda: accepted.append(server.accept()), daemon=True).start()
    try:
        run = run_in_bare_sandbox(tmp_path, ROOT_ATTACKS[attack].format(**where),
                                  hide=[course, submissions, tmp_path / "solutions"])
    finally:
        server.close()
        probe.unlink(missing_ok=True)
    # (Here the other student's files lie under /tmp, so rewrite_other_result may write the sandbox's own
    # fresh /tmp; what counts is that the real ones are untouched.)
    assert run.returncode != 0 or attack == "rewrite_other_result", \
        f"{attack} got through the sandbox:\n{run.stdout}{run.stderr}"
    assert not target.exists() and not (REPO / "engine" / "sandbox-escape-probe.txt").exists()
    assert not accepted, f"{attack} reached a socket under /run"
    assert all(p.read_text() == "another student's" for p in (other, course / "results" / "r.json"))


def test_the_worker_memory_cannot_be_read_by_a_process_it_starts(tmp_path):
    sandbox_or_skip()
    reader = ("import os, subprocess, sys\n"
              "{mark}\n"
              "child = subprocess.run([sys.executable, '-I', '-c', f'open(\"/proc/{{os.getpid()}}/mem\", \"rb\")'],"
              " capture_output=True, text=True)\n"
              "print('denied' if 'PermissionError' in child.stderr else 'read', child.returncode)\n")
    from engine.course.grading.kernel import private_copy
    copy = private_copy(str(REPO))           # the engine, where the sandbox may read it (the judge's prctl)
    try:
        sealed = run_in_bare_sandbox(tmp_path, reader.format(
            mark=f"sys.path.insert(0, {copy!r}); from engine.course.grading.sandbox import not_dumpable; "
                 "not_dumpable()"), readable=[Path(copy)])
    finally:
        shutil.rmtree(copy, ignore_errors=True)
    plain = run_in_bare_sandbox(tmp_path, reader.format(mark="pass"))
    assert sealed.stdout.split()[0] == "denied", sealed.stdout + sealed.stderr
    assert plain.stdout.split()[0] == "read", plain.stdout + plain.stderr    # the test can tell


def test_without_a_pids_cgroup_a_fork_bomb_is_bounded_per_account(tmp_path, monkeypatch):
    """Where no pids cgroup can be made (an instructor on a machine without the delegated ones), the
    processes are bounded for the account the sandbox runs as (RLIMIT_NPROC: its count now plus the limit)."""
    sandbox_or_skip()
    monkeypatch.setattr(sandbox, "_cgroup_parents", lambda: {})
    assert "RLIMIT_NPROC" in sandbox.limits_note()
    counted = []                  # the account's tasks when the bound was set (the other worker's grading too)
    tasks_of = sandbox._tasks_of
    monkeypatch.setattr(sandbox, "_tasks_of", lambda uid: counted.append(tasks_of(uid)) or counted[-1])
    bomb = ("import os, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n            time.sleep(2)\n"
            "            os._exit(0)\n        n += 1\nexcept OSError as error:\n    print('forks', n, error.errno)\n")
    run = run_in_bare_sandbox(tmp_path, bomb)
    said = run.stdout.split()
    assert said[:1] == ["forks"] and said[2] == "11", run.stdout + run.stderr
    assert len(counted) == 1 and int(said[1]) <= LIMITS.processes + counted[0], (said, counted)


def test_an_allocation_past_the_memory_limit_is_a_memory_error_in_its_own_cell():
    # One process asking for more than the whole submission may hold fails at once (RLIMIT_DATA), with
    # the bound named; the notebook's process lives on, and every other exercise keeps its points.
    sandbox_or_skip()
    chapter = REPO / "solutions" / "ch02_block_tables.py"
    past = f"hog = b'x' * ({Limits().memory_mb + 2048} << 20)\n"     # past the limit, within the machine's RAM
    hog = with_cell_edited(expanded(chapter), "ch02_slot_index", lambda s: past + s)
    path = write_notebook(hog, BUILD / "sandbox" / "memory-hog", chapter.stem)
    grade = sandboxed_grade(path, chapter, 60)
    got = {e.grade_id: e.earned for e in grade.exercises if e.kind == "test"}
    full = {e.grade_id: e.possible for e in grade.exercises if e.kind == "test"}
    assert got == dict(full, ch02_test_slot_index=0), {e.grade_id: e.message[:160] for e in grade.exercises}
    said = " ".join(e.message for e in grade.exercises)
    assert "more memory than the grader lets the notebook hold" in said, said[:2000]
    assert "restarted" not in said, said[:2000]
