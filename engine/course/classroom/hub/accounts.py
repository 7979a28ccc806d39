"""`make hub-accounts ROSTER=roster.ini`: the roster's local accounts, and nbgrader's instructor tools for
the instructors only.

Each student and instructor of the roster gets a local account (useradd, a home of its own, no password:
give one with `passwd` when the hub logs in with PAM). Instructors join the instructors' group
(paged-kv-instructors: they read the install's solutions/, tests and full engine, and use the grading
cgroups setup.sh delegates). Each instructor's own Jupyter configuration turns on formgrader, the course
list and "Create Assignment" (setup.sh turned them off for everyone) and points nbgrader at their course
folder (`~/course` unless --course). The course's folder in the exchange is made here, the first
instructor's, before any student could make one: `inbound/` 3733 (students write into it, only the
instructors list it, and no one removes another's entry).

`--remove` is the teardown of a class that is over (and of tests): the roster's accounts, their
processes and homes, the course's folder in the exchange and every file the accounts left there, and
with --hub-state the hub's state folder (its database, cookie secret, proxy pid). As root.
"""
from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import subprocess
import sys
from pathlib import Path

from engine.course.classroom.inbound import is_account as exists

INSTRUCTOR_TOOLS = ["formgrader", "course-list", "create-assignment"]   # @jupyter/nbgrader:NAME
INSTRUCTOR_SERVER = ["nbgrader.server_extensions.formgrader", "nbgrader.server_extensions.course_list"]
INSTRUCTORS_GROUP = "paged-kv-instructors"     # setup.sh makes it; src/ and the grading cgroups are its
COURSE_ID = "paged-kv-course"


def write_as(account: str, path: Path, text: str) -> None:
    """Write a file in the account's home as the account (so it owns it)."""
    subprocess.run(["runuser", "-u", account, "--", "mkdir", "-p", str(path.parent)], check=True)
    subprocess.run(["runuser", "-u", account, "--", "tee", str(path)], input=text, text=True, check=True,
                   capture_output=True)


def nbgrader_settings(account: str, lines: list[str]) -> None:
    """The account's own ~/.jupyter/nbgrader_config.py."""
    home = Path(pwd.getpwnam(account).pw_dir)
    write_as(account, home / ".jupyter" / "nbgrader_config.py",
             "c = get_config()  # noqa: F821\n" + "".join(line + "\n" for line in lines))


def enable_instructor(account: str, course: str, lines: list[str]) -> None:
    """Formgrader, course list and Create Assignment for this account only, and its course folder: the
    files `jupyter server extension enable --user` and `jupyter labextension enable --level=user` write."""
    home = Path(pwd.getpwnam(account).pw_dir)
    server = {"ServerApp": {"jpserver_extensions": {name: True for name in INSTRUCTOR_SERVER}}}
    lab = {"disabledExtensions": {f"@jupyter/nbgrader:{name}": False for name in INSTRUCTOR_TOOLS}}
    write_as(account, home / ".jupyter" / "jupyter_server_config.json", json.dumps(server, indent=2) + "\n")
    write_as(account, home / ".jupyter" / "labconfig" / "page_config.json", json.dumps(lab, indent=2) + "\n")
    root = course.replace("~", str(home), 1) if course.startswith("~") else course
    nbgrader_settings(account, [f"c.CourseDirectory.root = {root!r}", *lines])


def site_exchange() -> Path:
    """The exchange the site's nbgrader configuration names (setup.sh), else nbgrader's default."""
    config = Path(sys.prefix) / "etc" / "jupyter" / "nbgrader_config.py"
    for line in config.read_text().splitlines() if config.is_file() else []:
        if line.startswith("c.Exchange.root = "):
            return Path(line.split("=", 1)[1].strip().strip("\"'"))
    return Path("/srv/nbgrader/exchange")


def course_folder(exchange: Path, instructor: str) -> list[str]:
    """The course's folder in the exchange, the instructor's, its inbound/ writable but not listable by
    students; an earlier folder that is not the instructor's is moved aside (what was done, one line each)."""
    owner = pwd.getpwnam(instructor)
    group = grp_id()
    exchange.mkdir(parents=True, exist_ok=True)
    os.chmod(exchange, 0o1777)          # sticky: nobody renames or removes another account's folder
    said = []
    folder = exchange / COURSE_ID
    if folder.exists() and (folder.is_symlink() or folder.stat().st_uid != owner.pw_uid):
        aside = exchange.with_name(f"{exchange.name}-set-aside")
        aside.mkdir(mode=0o700, exist_ok=True)
        target = aside / f"{COURSE_ID}.{os.stat(folder, follow_symlinks=False).st_uid}"
        shutil.rmtree(target, ignore_errors=True)
        folder.rename(target)
        said.append(f"{folder} was not {instructor}'s: moved to {target}")
    for path, mode in ((folder, 0o755), (folder / "inbound", 0o3733), (folder / "outbound", 0o755)):
        path.mkdir(exist_ok=True)
        os.chown(path, owner.pw_uid, group if group is not None else owner.pw_gid)
        os.chmod(path, mode)
    return said


def grp_id() -> int | None:
    import grp
    try:
        return grp.getgrnam(INSTRUCTORS_GROUP).gr_gid
    except KeyError:
        return None


def home_roster(instructor: str, course: str, roster_file: Path) -> Path:
    """The class's one roster: the first instructor's COURSE/roster.ini, theirs to edit (written from
    `roster_file` where it is not there yet); make hub, prepare and grade read it there."""
    home = Path(pwd.getpwnam(instructor).pw_dir)
    path = Path(course.replace("~", str(home), 1) if course.startswith("~") else course) / "roster.ini"
    if not path.exists():
        write_as(instructor, path, Path(roster_file).read_text())
    return path


def create(roster, course: str, exchange: str | None = None) -> list[str]:
    """Add the accounts that are missing (and, with `exchange`, point each at that exchange instead of the
    site's), instructors in the instructors' group, the course's exchange folder; the accounts made."""
    made = []
    if grp_id() is None:
        subprocess.run(["groupadd", "--system", INSTRUCTORS_GROUP], check=True)
    for person in [*roster.instructors, *roster.students]:
        if not exists(person.ident):
            name = " ".join(filter(None, [person.first_name, person.last_name]))
            subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", "--comment", name, person.ident],
                           check=True)
            os.chmod(pwd.getpwnam(person.ident).pw_dir, 0o700)   # no account reads another's work
            made.append(person.ident)
    lines = [f"c.Exchange.root = {exchange!r}"] if exchange else []
    for person in roster.instructors:
        subprocess.run(["usermod", "--append", "--groups", INSTRUCTORS_GROUP, person.ident], check=True)
        enable_instructor(person.ident, course, lines)
    if roster.instructors:
        for line in course_folder(Path(exchange) if exchange else site_exchange(), roster.instructors[0].ident):
            print(line)
    for person in roster.students if lines else []:
        nbgrader_settings(person.ident, lines)
    return made


def remove(roster, exchange: Path, state: Path | None = None) -> list[str]:
    """The class's teardown: the accounts (processes, homes), the course's exchange folder and what the
    accounts left in the exchange, and the hub's state folder; what was removed."""
    gone = []
    people = [person.ident for person in [*roster.instructors, *roster.students]]
    uids = {pwd.getpwnam(name).pw_uid for name in people if exists(name)}
    if exchange.is_dir():
        if (exchange / COURSE_ID).exists():
            shutil.rmtree(exchange / COURSE_ID, ignore_errors=True)
            gone.append(str(exchange / COURSE_ID))
        for path in sorted(exchange.iterdir()):
            if os.lstat(path).st_uid in uids:
                shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
                gone.append(str(path))
    for name in people:
        if exists(name):
            subprocess.run(["pkill", "-KILL", "-u", name], check=False)
            subprocess.run(["userdel", "--remove", name], check=False, capture_output=True)
            gone.append(name)
    if state is not None and state.is_dir():
        shutil.rmtree(state)
        gone.append(str(state))
    return gone


def main(argv: list[str] | None = None) -> int:
    from engine.course.classroom.class_folder import read_roster
    parser = argparse.ArgumentParser(prog="python -m engine.course.classroom.hub.accounts", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--roster", type=Path, required=True)
    parser.add_argument("--course", default="~/course", help="each instructor's course folder")
    parser.add_argument("--exchange", help="an exchange folder for these accounts (default: the site's)")
    parser.add_argument("--remove", action="store_true", help="the teardown: the roster's accounts and homes, "
                        "the course's exchange folder and what they left in the exchange (and --hub-state)")
    parser.add_argument("--hub-state", type=Path, help="with --remove: the hub's state folder too "
                        "(jupyterhub_config.py's HUB_STATE, /srv/jupyterhub)")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        parser.error("run as root: it adds (or removes) local accounts")
    roster = read_roster(args.roster)
    if args.remove:
        exchange = Path(args.exchange) if args.exchange else site_exchange()
        print("removed:", " ".join(remove(roster, exchange, args.hub_state)) or "none")
    else:
        print("created:", " ".join(create(roster, args.course, args.exchange)) or "none (all there)")
        if roster.instructors:
            print(f"the roster: {home_roster(roster.instructors[0].ident, args.course, args.roster)} "
                  f"({roster.instructors[0].ident}'s to edit; make hub ROSTER=... and prepare read it there)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
