"""The instructor's path for real: a JupyterHub class through nbgrader's exchange, in a browser.

Real local accounts (an instructor and three students, made from a roster by engine/course/hub/
accounts.py and removed afterwards), JupyterHub from the shared course install (make hub-setup) with
configurable-http-proxy from npm, on 127.0.0.1 only, logging in with a test password (JupyterHub's
dummy authenticator; the accounts, their homes and their servers are real). The instructor prepares
the course from the roster and releases ch02 through the exchange; in headless Chromium each student
logs in, fetches ch02 in JupyterLab's Assignments panel, saves their work through their own server
(the solution, the solution with a planted bug, or nothing) and submits it there. The instructor, in
their own account, collects, grades in the sandbox, gives feedback and releases it
(engine/course/class_folder.py grade --release); a student fetches the feedback in the panel and opens
it; grades.csv is checked. Formgrader answers the instructor only. Each step's time is printed and
written to build/test-course/hub-e2e-times.json.

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
        subprocess.run(["bash", str(REPO / "engine" / "course" / "hub" / "setup.sh"), "--sources"], check=True,
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


def as_account(account: str, *command: str, timeout: int = 600) -> str:
    """Run a command in the account (its home, HOME and PATH the shared install's), as a terminal there would."""
    home = f"/home/{account}"
    env = ["env", "-i", f"HOME={home}", f"USER={account}", f"PATH={PREFIX / 'bin'}:/usr/bin:/bin",
           "LANG=C.UTF-8"]
    result = subprocess.run(["runuser", "-u", account, "--", *env, *command], cwd=home, capture_output=True,
                            text=True, timeout=timeout)
    assert result.returncode == 0, f"{account}: {' '.join(command)}:\n{result.stdout}{result.stderr}"
    return result.stdout + result.stderr


def accounts(roster: Path, *flags: str) -> None:
    subprocess.run([str(PREFIX / "bin" / "python"), "-m", "engine.course.hub.accounts", "--roster", str(roster),
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
    exchange.mkdir(mode=0o777)
    exchange.chmod(0o777)
    roster = root / "roster.ini"
    roster.write_text("[chapters]\nch02 = 2099-01-01 00:00\n[instructors]\n"
                      f"{INSTRUCTOR} = Grace Hopper <grace@example.edu>\n[students]\n"
                      + "".join(f"{name} = {name[8:].title()} Student\n" for name in STUDENTS))
    roster.chmod(0o644)
    port = free_ports()
    base = f"http://127.0.0.1:{port}"
    hub = None
    accounts(roster, "--remove")          # what an interrupted run left
    try:
        accounts(roster, "--exchange", str(exchange))
        step("accounts")
        course = f"/home/{INSTRUCTOR}/course"
        as_account(INSTRUCTOR, "python", "-m", "engine.course.class_folder", "prepare", "--roster", str(roster),
                   "--course", course, "--exchange", str(exchange), "--sandbox", "required")
        step("instructor: make course (no submission)")
        as_account(INSTRUCTOR, "sh", "-c", f"cd {course} && nbgrader release_assignment ch02")
        step("instructor: release ch02")

        env = {"PATH": f"{PREFIX / 'bin'}:/usr/bin:/bin", "HUB_PREFIX": str(PREFIX), "HUB_ROSTER": str(roster),
               "HUB_PORT": str(port), "HUB_STATE": str(root / "hub"), "HUB_AUTH": "dummy",
               "HUB_DUMMY_PASSWORD": PASSWORD, "LANG": "C.UTF-8"}
        log = (root / "hub.log").open("w")
        hub = subprocess.Popen([str(PREFIX / "bin" / "jupyterhub"), "-f",
                                str(PREFIX / "src" / "engine" / "course" / "hub" / "jupyterhub_config.py")],
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

            progress = as_account(INSTRUCTOR, "python", "-m", "engine.course.class_folder", "grade", "ch02",
                                  "--course", course, "--jobs", "2", "--sandbox", "required", "--release")
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

        auto = sum(cells.points(c) for c in expanded(CHAPTER).cells if cells.is_test(c) and not cells.is_manual(c))
        grades = Path(course) / "grades.csv"
        rows = {r["student_id"]: r for r in csv.DictReader(grades.open(newline=""))}
        assert sorted(rows) == sorted(STUDENTS), rows
        scores = {name: float(rows[name]["score"]) for name in rows}
        assert scores["pkvtest-ada"] == auto and scores["pkvtest-cy"] == 0, (scores, auto, progress)
        assert 0 < scores["pkvtest-bob"] < auto, (scores, progress)
        assert "COPY" in rows["pkvtest-ada"]["flags"]        # the reference's code pasted in: flagged, kept
        assert "Notes from the grader" in text and "ch02_block_tables" in text
        assert (Path(course) / "reports" / "summary.png").is_file()
        sealed = [line for line in progress.splitlines() if line.startswith("[")]
        times["per submission (sealed runs, 2 at a time)"] = round(
            float(progress.split("sealed runs ")[1].split(" s")[0]) / len(STUDENTS), 1)
        print("\nhub e2e times (s):", json.dumps(times, indent=1), "\n" + "\n".join(sealed))
        BUILD.mkdir(parents=True, exist_ok=True)
        (BUILD / "hub-e2e-times.json").write_text(json.dumps({"steps": times, "sealed runs": sealed}, indent=1))
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
        accounts(roster, "--remove")
        shutil.rmtree(root, ignore_errors=True)
