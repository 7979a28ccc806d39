"""The instructor's path for real: a JupyterHub class through nbgrader's exchange, in a browser.

Real local accounts (an instructor and three students, made from a roster by engine/course/classroom/hub/
accounts.py and removed afterwards), JupyterHub from the shared course install (make hub-setup) with
configurable-http-proxy from npm, on 127.0.0.1 only, logging in with a test password (JupyterHub's
dummy authenticator; the accounts, their homes and their servers are real). The instructor prepares
the course from the roster and releases ch02 through the exchange; in headless Chromium each student
logs in, fetches ch02 in JupyterLab's Assignments panel, saves their work through their own server
(the solution, the solution with a planted bug, or nothing) and submits it there. The instructor, in
their own account, collects, grades in the sandbox, gives feedback and releases it
(engine/course/classroom/class_folder.py grade --release); a student fetches the feedback in the panel and opens
it; grades.csv is checked. Formgrader answers the instructor only. Each step's time is printed and
written to build/test-course/hub-e2e-times.json.

A fourth student, in a plain login shell (no browser), tries to spoil it: renames the course's exchange
folder, lists inbound/, reads the install's solutions/ and reference engine, submits a blank notebook
under another student's name, a folder of no submission's name and one with no submission_secret.txt,
and hands in a fork bomb and a memory hog of their own. Each attempt is refused (its message is kept in
the times file), the fork bomb and the memory hog meet the sandbox's limits (nothing in the notebook's
process refuses a fork: the sandbox bounds it), and the class is graded and its feedback released
regardless; a fork bomb and a memory hog run in the bare sandbox as the instructor are
contained. The teardown (accounts.py --remove) leaves no account, exchange folder or hub state.

Skips, in one line, where Chromium, npm, root or the shared install is missing; never under CI=true.
"""
import csv
import hashlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from engine.course import cells
from fixtures.browser_support import chromium, need_chromium, offline_context, unavailable
from fixtures.course_support import BUILD, REPO, expanded, sandbox_or_skip

pytestmark = [pytest.mark.slow, pytest.mark.browser]
PREFIX = Path(os.environ.get("HUB_PREFIX", "/opt/paged-kv-course"))
INSTRUCTOR = "pkvtest-teach"
STUDENTS = {"pkvtest-ada": "solution", "pkvtest-bob": "planted bug", "pkvtest-cy": "untouched"}
HOSTILE = "pkvtest-eve"          # in a login shell only
FORK_BOMB = ("import os\ntry:\n    while True:\n        os.fork()\n"
             "except BaseException as error:\n    print('no fork:', error)\n")
MEMORY_HOG = "hog = b'x' * (12 << 30)\n"
BARE = '''"""A fork bomb and a memory hog in the bare sandbox, as whoever runs this."""
import pathlib, subprocess, sys, tempfile
from engine.course.grading.sandbox import Limits, Sandbox, limits_note
BOMB = """import os, time
n = 0
try:
    while True:
        if os.fork() == 0:
            time.sleep(3)
            os._exit(0)
        n += 1
except OSError as e:
    print("forks", n, e)
"""
HOG = "hog = b'x' * (2 << 30)\\nprint('allocated')\\n"
print("limits:", limits_note() or "all in force")
work = pathlib.Path(tempfile.mkdtemp())
for name, code in {"fork bomb": BOMB, "memory hog": HOG}.items():
    box = Sandbox(work / name.replace(" ", "-"), limits=Limits(memory_mb=512, processes=64))
    run = subprocess.run(box([sys.executable, "-I", "-c", code], work), capture_output=True, text=True, timeout=120)
    box.close()
    print(name, "exit", run.returncode, " | ".join((run.stdout + run.stderr).strip().splitlines())[-300:])
'''
PASSWORD = "hub-e2e-" + "%08x" % random.getrandbits(32)
CHAPTER = REPO / "solutions" / "ch02_block_tables.py"
NOTEBOOK = "ch02/ch02_block_tables.ipynb"
RIGHT = "return table[pos // block_size], pos % block_size"
BUG = "return table[pos // block_size], (pos + 1) % block_size"   # an off-by-one offset


def differs(paths) -> str:
    """The first of these checkout files the shared install holds in another version ('' if none)."""
    for path in paths:
        copy = PREFIX / "src" / path.relative_to(REPO)
        if not copy.is_file() or hashlib.sha256(copy.read_bytes()).digest() != \
                hashlib.sha256(path.read_bytes()).digest():
            return str(path.relative_to(REPO))
    return ""


def need_hub() -> None:
    need_chromium()
    if shutil.which("npm") is None:
        unavailable("hub test needs npm for configurable-http-proxy: apt-get install npm")
    if os.geteuid() != 0:
        unavailable("hub test needs root: it makes local accounts and runs JupyterHub, which starts their servers")
    if not (PREFIX / "bin" / "jupyterhub").is_file() or not (PREFIX / "bin" / "configurable-http-proxy").exists():
        unavailable(f"hub test needs the shared course install {PREFIX}: make hub-setup")
    stale = differs([REPO / "requirements.txt", REPO / "constraints.txt"])
    if stale:
        unavailable(f"the shared course install {PREFIX} has other packages than this checkout ({stale}): "
                    "make hub-setup")
    if differs(sorted((REPO / "engine").rglob("*.py")) + sorted((REPO / "solutions").glob("*.py"))):
        # the course's files only (installed editable): what `make hub-setup` would copy, in a second
        setup = REPO / "engine" / "course" / "classroom" / "hub" / "setup.sh"
        subprocess.run(["bash", str(setup), "--sources"], check=True,
                       capture_output=True, env={**os.environ, "HUB_PREFIX": str(PREFIX)})
    sandbox_or_skip()


def free_ports() -> int:
    """A port p with p, p+1 and p+2 free on 127.0.0.1 (the hub's address, the hub itself, the proxy's API)."""
    for _ in range(50):
        port = random.randrange(20000, 40000)
        try:
            for offset in range(3):
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", port + offset))
            return port
        except OSError:
            continue
    raise RuntimeError("no three free ports on 127.0.0.1")


def attempt(account: str, command: str) -> tuple[int, str]:
    """A command in the account's login shell (/etc/profile and profile.d, as a terminal or ssh would):
    (exit status, what it printed)."""
    result = subprocess.run(["runuser", "-l", account, "-c", command], capture_output=True, text=True, timeout=900)
    return result.returncode, (result.stdout + result.stderr).strip()


def refused(account: str, command: str, words: str) -> str:
    """The account's attempt, which must fail saying `words`; what it said."""
    status, said = attempt(account, command)
    assert status != 0 and words in said, f"{account} was not refused: {command}: {status} {said}"
    return said.splitlines()[-1]


def spoil(exchange: Path) -> dict[str, str]:
    """What the hostile student tries before the grading, each refused: {attempt: the refusal's message}."""
    course = exchange / "paged-kv-course"
    src = PREFIX / "src"
    said = {"rename the course's exchange folder": refused(HOSTILE, f"mv {course} {exchange}/mine",
                                                           "Operation not permitted"),
            "list inbound/": refused(HOSTILE, f"ls {course}/inbound", "Permission denied"),
            "read solutions/": refused(HOSTILE, f"cat {src}/solutions/ch02_block_tables.py", "Permission denied"),
            "read the reference engine": refused(HOSTILE, f"cat {src}/engine/cache/allocator.py",
                                                 "Permission denied")}
    status, source = attempt(HOSTILE, "python -c 'import inspect, engine.cache.allocator as a; print(a.__file__); "
                                      "print(inspect.getsource(a.BlockAllocator.allocate))'")
    assert status == 0 and str(PREFIX / "student") in source and "_edition.yours" in source, source
    said["import the reference"] = "the student engine's stub: " + source.splitlines()[-1].strip()
    # under another's name (later than theirs), no submission's name, no secret: all put there by eve
    blank = course / "outbound" / "ch02" / "ch02_block_tables.ipynb"
    later = "2098-12-31 00:00:00.000000 UTC"
    for name, secret in ((f"pkvtest-ada+ch02+{later}+forged", True), ("garbage", True),
                         (f"{HOSTILE}+ch02+{later}+nosecret", False)):
        folder = f"'{course}/inbound/{name}'"
        secret_file = f" && echo 0 > {folder}/submission_secret.txt" if secret else ""
        status, out = attempt(HOSTILE, f"mkdir {folder} && cp {blank} {folder}/ && echo '{later}' > "
                              f"{folder}/timestamp.txt{secret_file}")
        assert status == 0, out
    return said


def accounts(roster: Path, *flags: str) -> None:
    subprocess.run([str(PREFIX / "bin" / "python"), "-m", "engine.course.classroom.hub.accounts",
                    "--roster", str(roster),
                    *flags], check=True, capture_output=True, text=True)


def wait_for(url: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                if answer.status == 200:
                    return
        except OSError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.5)


def log_in(context, base: str, account: str):
    """Log in on the hub's page; returns at once (the server starts), with the page."""
    page = context.new_page()
    page.goto(f"{base}/hub/login")
    page.fill("input[name=username]", account)
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit], input[type=submit]")
    return page


def open_assignments(page) -> None:
    page.get_by_text("Nbgrader", exact=True).click()
    page.get_by_text("Assignment List", exact=True).click()


def save_work(page, account: str, work: str, solution: dict[str, str]) -> None:
    """The student's work, saved through their own server as JupyterLab's editor saves it."""
    url = f"/user/{account}/api/contents/{NOTEBOOK}"
    call = """async ([url, method, body]) => {
        const xsrf = (document.cookie.match(/_xsrf=([^;]+)/) || [])[1] || "";
        const answer = await fetch(url, {method, credentials: "same-origin", body,
            headers: {"Content-Type": "application/json", "X-XSRFToken": decodeURIComponent(xsrf)}});
        return [answer.status, await answer.text()];
    }"""
    status, text = page.evaluate(call, [url, "GET", None])
    assert status == 200, f"{account} could not open {NOTEBOOK}: {status} {text[:200]}"
    notebook = json.loads(text)["content"]
    for cell in notebook["cells"]:
        ident = (cell.get("metadata", {}).get("nbgrader") or {}).get("grade_id")
        if work != "untouched" and ident in solution:
            cell["source"] = solution[ident]
            if work == "planted bug" and ident == "ch02_physical_slot":
                assert RIGHT in cell["source"], "the planted bug's line is not in the solution any more"
                cell["source"] = cell["source"].replace(RIGHT, BUG)
    body = json.dumps({"type": "notebook", "format": "json", "content": notebook})
    status, text = page.evaluate(call, [url, "PUT", body])
    assert status in (200, 201), f"{account} could not save {NOTEBOOK}: {status} {text[:200]}"


def test_a_class_on_jupyterhub_through_the_exchange_in_a_browser():
    need_hub()
    times: dict[str, float] = {}
    clock = [time.monotonic()]

    def step(name: str) -> None:
        now = time.monotonic()
        times[name] = round(now - clock[0], 1)
        clock[0] = now

    root = Path(tempfile.mkdtemp(prefix="pkv-hub-e2e-"))
    root.chmod(0o755)
    exchange = root / "exchange"
    exchange.mkdir()
    refusals: dict[str, str] = {}
    roster = root / "roster.ini"
    roster.write_text("[chapters]\nch02 = 2099-01-01 00:00\n[instructors]\n"
                      f"{INSTRUCTOR} = Grace Hopper <grace@example.edu>\n[students]\n"
                      + "".join(f"{name} = {name[8:].title()} Student\n" for name in [*STUDENTS, HOSTILE]))
    roster.chmod(0o644)
    port = free_ports()
    base = f"http://127.0.0.1:{port}"
    hub = None
    accounts(roster, "--remove")          # what an interrupted run left
    try:
        accounts(roster, "--exchange", str(exchange))
        assert exchange.stat().st_mode & 0o7777 == 0o1777
        assert (exchange / "paged-kv-course" / "inbound").stat().st_mode & 0o7777 == 0o3733
        step("accounts")
        course = f"/home/{INSTRUCTOR}/course"
        # the guide's steps in the instructor's login shell (the install's commands on PATH)
        status, said = attempt(INSTRUCTOR, f"python -m engine.course.classroom.class_folder prepare --roster {roster} "
                               f"--course {course} --exchange {exchange} --sandbox required")
        assert status == 0 and f"{HOSTILE}" in said and "ch02 due 2099-01-01 00:00 UTC" in said, said
        assert "only from the account it names: yes" in said, said
        step("instructor: make course (no submission)")
        status, said = attempt(INSTRUCTOR, f"cd {course} && nbgrader release_assignment ch02 && head -c 40 "
                               f"{PREFIX}/src/solutions/ch02_block_tables.py")
        assert status == 0 and "Released as" in said, said
        refusals["unlock ch02 before its due date"] = refused(
            INSTRUCTOR, f"python -m engine.course.classroom.hub.student_engine --unlock ch02 --course {course}",
            "not due yet")
        step("instructor: release ch02")

        refusals.update(spoil(exchange))
        notebook = Path(f"/home/{HOSTILE}") / NOTEBOOK
        assert attempt(HOSTILE, "nbgrader fetch_assignment ch02")[0] == 0
        hostile = json.loads(notebook.read_text())        # eve's own work: a fork bomb and a memory hog
        for cell in hostile["cells"]:
            ident = (cell.get("metadata", {}).get("nbgrader") or {}).get("grade_id")
            if ident in ("ch02_physical_slot", "ch02_slot_index"):
                cell["source"] = FORK_BOMB if ident == "ch02_physical_slot" else MEMORY_HOG
        notebook.write_text(json.dumps(hostile))
        status, said = attempt(HOSTILE, "nbgrader submit ch02")
        assert status == 0, said
        step(f"{HOSTILE}: refused 5 ways, 3 folders planted in inbound/, a fork bomb and a memory hog submitted")

        env = {"PATH": f"{PREFIX / 'bin'}:/usr/bin:/bin", "HUB_PREFIX": str(PREFIX), "HUB_ROSTER": str(roster),
               "HUB_PORT": str(port), "HUB_STATE": str(root / "hub"), "HUB_AUTH": "dummy",
               "HUB_DUMMY_PASSWORD": PASSWORD, "LANG": "C.UTF-8"}
        log = (root / "hub.log").open("w")
        hub = subprocess.Popen([str(PREFIX / "bin" / "jupyterhub"), "-f",
                                str(PREFIX / "src" / "engine" / "course" / "classroom" / "hub" /
                                    "jupyterhub_config.py")],
                               cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_for(f"{base}/hub/login", 60)
        step("hub up")

        solution = {cells.grade_id(c): c.source for c in expanded(CHAPTER).cells if cells.is_solution(c)}
        with chromium() as browser:
            contexts = {name: offline_context(browser, viewport={"width": 1280, "height": 800})
                        for name in [*STUDENTS, INSTRUCTOR]}
            pages = {name: log_in(context, base, name) for name, context in contexts.items()}  # servers start
            for name, page in pages.items():
                page.wait_for_url("**/lab**", timeout=180_000)
                page.get_by_text("Nbgrader", exact=True).wait_for(timeout=180_000)
            step("log in: 4 JupyterLabs up")
            for name in [INSTRUCTOR, "pkvtest-ada"]:      # students' kernels import the student engine
                pid = subprocess.run(["pgrep", "-o", "-u", name, "-f", "jupyterhub-singleuser"], capture_output=True,
                                     text=True).stdout.split()[0]
                environ = dict(item.split("=", 1) for item in Path(f"/proc/{pid}/environ").read_text().split("\0")
                               if "=" in item)
                assert environ.get("PYTHONPATH", "") == ("" if name == INSTRUCTOR else str(PREFIX / "student")), environ

            # formgrader and the course list are the instructor's only
            ada = pages["pkvtest-ada"]
            ada.get_by_text("Nbgrader", exact=True).click()
            items = [item for item in ada.locator(".lm-Menu-itemLabel").all_inner_texts() if item]
            assert items == ["Assignment List"], items
            ada.keyboard.press("Escape")
            teach = pages[INSTRUCTOR]
            teach.get_by_text("Nbgrader", exact=True).click()
            assert {"Formgrader", "Course List"} <= set(teach.locator(".lm-Menu-itemLabel").all_inner_texts())
            teach.keyboard.press("Escape")
            assert ada.request.get(f"{base}/user/pkvtest-ada/formgrader").status == 404
            assert teach.request.get(f"{base}/user/{INSTRUCTOR}/formgrader").status == 200

            for name, work in STUDENTS.items():
                page = pages[name]
                open_assignments(page)
                page.locator("#released_assignments_list button", has_text="Fetch").click()
                page.locator("#fetched_assignments_list button", has_text="Submit").wait_for(timeout=60_000)
                save_work(page, name, work, solution)
                page.locator("#fetched_assignments_list button", has_text="Submit").click()
                page.locator("#submitted_assignments_list .list_item").first.wait_for(timeout=60_000)
                step(f"{name}: fetch, edit ({work}), submit")

            status, progress = attempt(INSTRUCTOR, "python -m engine.course.classroom.class_folder grade ch02 "
                                       f"--course {course} "
                                       "--jobs 2 --sandbox required --release")
            assert status == 0, progress
            step("instructor: collect, autograde (sandbox), feedback, reports, release feedback")

            ada.reload()
            open_assignments(ada)
            ada.locator("#submitted_assignments_list button", has_text="Fetch Feedback").click()
            link = ada.locator("#submitted_assignments_list a", has_text="view feedback")
            link.click()                           # the file browser goes to the feedback folder
            ada.locator(".jp-DirListing-item", has_text="ch02_block_tables.html").dblclick(timeout=60_000)
            page = ada.frame_locator(".jp-HTMLViewer iframe").locator("body")
            page.get_by_text("Notes from the grader").wait_for(timeout=60_000)
            text = page.inner_text()
            step("pkvtest-ada: fetch and open feedback")
            # nothing reached past 127.0.0.1 but nbgrader's feedback template's MathJax (a CDN; not loaded)
            mathjax = "https://cdnjs.cloudflare.com/ajax/libs/mathjax/"
            for context in contexts.values():
                assert not [url for url in context.refused if not url.startswith(mathjax)], context.refused

        (root / "bare.py").write_text(BARE)
        (root / "bare.py").chmod(0o644)
        status, said = attempt(INSTRUCTOR, f"python {root / 'bare.py'}")
        assert status == 0 and "limits: all in force" in said, said
        bomb, hog = (line for line in said.splitlines() if line.startswith(("fork bomb", "memory hog")))
        assert int(bomb.split("forks ")[1].split()[0]) < 64, bomb
        assert "allocated" not in hog and any(word in hog for word in ("exit -9", "exit 137", "MemoryError")), hog
        refusals["fork bomb in the bare sandbox, as the instructor"] = bomb
        refusals["memory hog in the bare sandbox, as the instructor"] = hog
        step("instructor: a fork bomb and a memory hog in the bare sandbox")

        auto = sum(cells.points(c) for c in expanded(CHAPTER).cells if cells.is_test(c) and not cells.is_manual(c))
        grades = Path(course) / "grades.csv"
        rows = {r["student_id"]: r for r in csv.DictReader(grades.open(newline=""))}
        assert sorted(rows) == sorted([*STUDENTS, HOSTILE]), rows
        assert "less than its limits" not in progress, progress           # the limits hold for the instructor
        not_collected = [line for line in progress.splitlines() if line.startswith("not collected: ")]
        assert len(not_collected) == 3, progress
        for name, words in (("pkvtest-ada+ch02", f"claims to be pkvtest-ada's, but is owned by {HOSTILE}"),
                            ("garbage", f"not a submission's name (STUDENT+CHAPTER+TIME), put there by {HOSTILE}"),
                            ("+nosecret", "no submission_secret.txt")):
            line = next(line for line in not_collected if name in line)
            assert words in line, line
            refusals[f"inbound/{name}"] = line
        released = list((exchange / "paged-kv-course" / "feedback").glob("*.html"))
        assert len(released) == len(STUDENTS) + 1, released       # everyone's feedback, eve's too
        hostile_run = next(line for line in progress.splitlines() if line.startswith("[") and HOSTILE in line)
        refusals["fork bomb and memory hog submitted, graded by the instructor"] = hostile_run
        graded = json.loads((Path(course) / "autograded" / HOSTILE / NOTEBOOK).read_text())
        said = {(cell.get("metadata", {}).get("nbgrader") or {}).get("grade_id"):
                " ".join(out.get("text", "") if isinstance(out.get("text"), str) else "".join(out.get("text", []))
                         or f"{out.get('ename')}: {out.get('evalue')}" for out in cell.get("outputs", [])).strip()
                for cell in graded["cells"]}
        assert "no fork:" in said["ch02_physical_slot"], said["ch02_physical_slot"]   # past the sandbox's processes
        assert "RemoteGone" in said["ch02_slot_index"] or "Memory" in said["ch02_slot_index"], said["ch02_slot_index"]
        refusals["the fork bomb's cell, graded"] = said["ch02_physical_slot"]
        refusals["the memory hog's cell, graded"] = said["ch02_slot_index"]
        scores = {name: float(rows[name]["score"]) for name in rows}
        assert scores["pkvtest-ada"] == auto and scores["pkvtest-cy"] == 0, (scores, auto, progress)  # not the forgery
        assert scores[HOSTILE] < auto, scores
        assert 0 < scores["pkvtest-bob"] < auto, (scores, progress)
        assert "COPY" in rows["pkvtest-ada"]["flags"]        # the reference's code pasted in: flagged, kept
        assert "Notes from the grader" in text and "ch02_block_tables" in text
        assert (Path(course) / "reports" / "summary.png").is_file()
        sealed = [line for line in progress.splitlines() if line.startswith("[")]
        times["per submission (sealed runs, 2 at a time)"] = round(
            float(progress.split("sealed runs ")[1].split(" s")[0]) / len(STUDENTS), 1)
        print("\nhub e2e times (s):", json.dumps(times, indent=1), "\n" + "\n".join(sealed))
        print("refused:", json.dumps(refusals, indent=1))
        BUILD.mkdir(parents=True, exist_ok=True)
        (BUILD / "hub-e2e-times.json").write_text(json.dumps({"steps": times, "sealed runs": sealed,
                                                              "refusals": refusals}, indent=1))
    except BaseException:
        print("\nhub e2e times (s) until it failed:", times)
        kept = BUILD / "hub-e2e-failed"            # the instructor's course folder, to see what went wrong
        shutil.rmtree(kept, ignore_errors=True)
        shutil.copytree(f"/home/{INSTRUCTOR}/course", kept, ignore_dangling_symlinks=True, dirs_exist_ok=True)
        raise
    finally:
        if hub is not None:
            os.killpg(hub.pid, signal.SIGTERM)
            try:
                hub.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(hub.pid, signal.SIGKILL)
        accounts(roster, "--remove", "--exchange", str(exchange), "--hub-state", str(root / "hub"))
        left = [p for p in exchange.rglob("*")] if exchange.is_dir() else []
        gone = not (root / "hub").exists() and not left and not any(
            (Path("/home") / name).exists() for name in [INSTRUCTOR, *STUDENTS, HOSTILE])
        shutil.rmtree(root, ignore_errors=True)
        assert gone, f"the teardown left {left} or the hub's state or a home"
