"""`make hub-accounts ROSTER=roster.ini`: the roster's local accounts, and nbgrader's instructor tools for
the instructors only.

Each student and instructor of the roster gets a local account (useradd, a home of its own, no password:
give one with `passwd` when the hub logs in with PAM). Each instructor's own Jupyter configuration turns
on formgrader, the course list and "Create Assignment" (setup.sh turned them off for everyone) and points
nbgrader at their course folder (`~/course` unless --course). `--remove` deletes the roster's accounts
and their homes: for tests, and for a class that is over. As root.
"""
from __future__ import annotations

import argparse
import json
import os
import pwd
import subprocess
import sys
from pathlib import Path

INSTRUCTOR_TOOLS = ["formgrader", "course-list", "create-assignment"]   # @jupyter/nbgrader:NAME
INSTRUCTOR_SERVER = ["nbgrader.server_extensions.formgrader", "nbgrader.server_extensions.course_list"]


def exists(account: str) -> bool:
    try:
        pwd.getpwnam(account)
        return True
    except KeyError:
        return False


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


def create(roster, course: str, exchange: str | None = None) -> list[str]:
    """Add the accounts that are missing (and, with `exchange`, point each at that exchange instead of the
    site's); the accounts made."""
    made = []
    for person in [*roster.instructors, *roster.students]:
        if not exists(person.ident):
            name = " ".join(filter(None, [person.first_name, person.last_name]))
            subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", "--comment", name, person.ident],
                           check=True)
            os.chmod(pwd.getpwnam(person.ident).pw_dir, 0o700)   # no account reads another's work
            made.append(person.ident)
    lines = [f"c.Exchange.root = {exchange!r}"] if exchange else []
    for person in roster.instructors:
        enable_instructor(person.ident, course, lines)
    for person in roster.students if lines else []:
        nbgrader_settings(person.ident, lines)
    return made


def remove(roster) -> list[str]:
    gone = []
    for person in [*roster.instructors, *roster.students]:
        if exists(person.ident):
            subprocess.run(["pkill", "-u", person.ident], check=False)
            subprocess.run(["userdel", "--remove", person.ident], check=False, capture_output=True)
            gone.append(person.ident)
    return gone


def main(argv: list[str] | None = None) -> int:
    from engine.course.class_folder import read_roster
    parser = argparse.ArgumentParser(prog="python -m engine.course.hub.accounts", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--roster", type=Path, required=True)
    parser.add_argument("--course", default="~/course", help="each instructor's course folder")
    parser.add_argument("--exchange", help="an exchange folder for these accounts (default: the site's)")
    parser.add_argument("--remove", action="store_true", help="delete the roster's accounts and homes")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        parser.error("run as root: it adds (or removes) local accounts")
    roster = read_roster(args.roster)
    if args.remove:
        print("removed:", " ".join(remove(roster)) or "none")
    else:
        print("created:", " ".join(create(roster, args.course, args.exchange)) or "none (all there)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
