"""Which submissions in the exchange's inbound belong to who they name: the rest is set aside, not collected.

nbgrader's file exchange lets any account put a folder `STUDENT+CHAPTER+TIME+RANDOM` into the course's
`inbound/`, under any name, and its `collect` only warns when the folder's owner is not STUDENT. Here a
submission is taken only when it is a plain folder (no symbolic link anywhere in it) whose name parses,
that holds nbgrader's `submission_secret.txt` and `timestamp.txt`, and (with `require_owner`, the
default wherever the roster's students are local accounts) whose folder and every file are owned by the
account STUDENT names. Anything else is refused with the reason, naming the account that owns it, so the
instructor sees who did it; it never stops the collection of the rest. `OwnedCollect` is nbgrader's
collect with that check (`c.ExchangeFactory.collect`, written by class_folder.prepare).
"""
from __future__ import annotations

import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path

from nbgrader.exchange.default.collect import ExchangeCollect, groupby
from traitlets import Bool

NEEDED = ("timestamp.txt", "submission_secret.txt")     # what nbgrader's submit writes into every submission


@dataclass
class Entry:
    """One folder (or stray file) of inbound/ and what was found about it."""

    name: str
    student: str = ""          # who the name says it is from
    assignment: str = ""
    timestamp: object = None   # the name's time (nbgrader's parse_utc)
    owner: str = ""            # the account that owns it
    why: str = ""              # '' when it is taken

    def line(self) -> str:
        return f"inbound/{self.name}: {self.why}"


def _account(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid} (no account)"


def is_account(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def examine(path: Path, require_owner: bool = True) -> Entry:
    """What inbound/NAME is, and why it is not taken ('' when it is)."""
    from nbgrader.utils import parse_utc
    entry = Entry(path.name)
    try:
        info = os.lstat(path)
    except OSError as error:
        entry.why = f"cannot be read: {error.strerror}"
        return entry
    entry.owner = _account(info.st_uid)
    parts = path.name.rsplit("+", 3)
    if len(parts) < 3:
        entry.why = f"not a submission's name (STUDENT+CHAPTER+TIME), put there by {entry.owner}"
        return entry
    entry.student, entry.assignment = parts[0], parts[1]
    try:
        entry.timestamp = parse_utc(parts[2])
    except Exception:
        entry.why = f"its time {parts[2]!r} does not parse, put there by {entry.owner}"
        return entry
    if not stat.S_ISDIR(info.st_mode):
        entry.why = f"not a folder, put there by {entry.owner}"
        return entry
    others = set()
    for folder, dirs, files in os.walk(path):
        for name in [*dirs, *files, "."]:
            item = Path(folder) / name
            try:
                mode = os.lstat(item)
            except OSError as error:
                entry.why = f"{item.relative_to(path)} cannot be read: {error.strerror}"
                return entry
            if stat.S_ISLNK(mode.st_mode):
                entry.why = f"holds a symbolic link, {item.relative_to(path)}, put there by {_account(mode.st_uid)}"
                return entry
            if mode.st_uid != info.st_uid:
                others.add(_account(mode.st_uid))
    if require_owner:
        if not is_account(entry.student):
            entry.why = f"names {entry.student}, who has no account here; put there by {entry.owner}"
        elif entry.owner != entry.student or others:
            by = ", ".join(sorted({entry.owner, *others} - {entry.student}))
            entry.why = f"claims to be {entry.student}'s, but is owned by {by}"
        if entry.why:
            return entry
    missing = [name for name in NEEDED if not (path / name).is_file()]
    if missing:
        entry.why = f"no {' and no '.join(missing)} (not made by nbgrader submit), put there by {entry.owner}"
    return entry


def sort_inbound(inbound: Path, assignment: str, require_owner: bool = True) -> tuple[list[Entry], list[Entry]]:
    """(the submissions of `assignment` taken, every entry of inbound/ refused), each in name order. An
    entry whose chapter cannot be read is refused for every chapter."""
    taken, refused = [], []
    for path in sorted(inbound.iterdir()) if inbound.is_dir() else []:
        entry = examine(path, require_owner)
        if entry.assignment and entry.assignment != assignment:
            continue
        (refused if entry.why else taken).append(entry)
    return taken, refused


class OwnedCollect(ExchangeCollect):
    """nbgrader's collect, taking only the submissions `sort_inbound` takes (the latest of each student)."""

    require_owner = Bool(True, help="take a submission only when the account its name gives owns it").tag(config=True)

    def init_src(self):
        if self.coursedir.course_id == "":
            self.fail("No course id specified. Re-run with --course flag.")
        self.course_path = os.path.join(self.root, self.coursedir.course_id)
        self.inbound_path = os.path.join(self.course_path, "inbound")
        if not os.path.isdir(self.inbound_path):
            self.fail(f"Course not found: {self.inbound_path}")
        taken, refused = sort_inbound(Path(self.inbound_path), self.coursedir.assignment_id, self.require_owner)
        for entry in refused:
            self.log.warning("Not collected: %s", entry.line())
        wanted = self.coursedir.student_id or None
        records = [{"username": e.student, "filename": e.name, "timestamp": e.timestamp}
                   for e in taken if wanted in (None, "*", e.student)]
        self.duedate = None
        self.src_records = [self._sort_by_timestamp(group)[0]
                            for group in groupby(records, lambda item: item["username"]).values()]
