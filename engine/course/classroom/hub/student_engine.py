"""The engine students import on the hub: the student edition's, taught bodies stubbed until unlocked.

    python -m engine.course.classroom.hub.student_engine --unlock ch02 --course ~/course

On the hub the course's own copy ($HUB_PREFIX/src: solutions/, tests/, the full engine) is readable by
the instructors' group only (setup.sh); students import `$HUB_PREFIX/student/engine` instead (their
PYTHONPATH, set by jupyterhub_config.py and /etc/profile.d/paged-kv-course.sh). It is
engine/course/authoring/edition.py's engine: every chapter's taught functions and methods stubbed (a stub runs the
learner's own definition from the notebook), except the chapters unlocked. `--unlock chNN` keeps that
chapter's reference from now on, once its due date (the course's roster.ini) has passed; `--force`
unlocks before it. setup.sh builds it (as root, keeping what was unlocked); an instructor unlocks (the
instructors' group may write $HUB_PREFIX/student). Each build replaces the folder whole.
"""
from __future__ import annotations

import argparse
import compileall
import os
import shutil
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from engine.course.authoring.edition import write_engine
from engine.course.paths import assignment_id, chapter_files, repo_root

UNLOCKED = "UNLOCKED"       # the chapters whose reference students may import, one a line


def unlocked(out: Path) -> list[str]:
    path = out / UNLOCKED
    return sorted(set(path.read_text().split())) if path.is_file() else []


def build(out: Path, unlock: list[str], root: Path | None = None) -> Path:
    """out/engine: the engine with every chapter's taught bodies stubbed but `unlock`'s, readable by all."""
    root = root or repo_root()
    every = {assignment_id(path): path for path in chapter_files(root / "solutions")}
    unknown = sorted(set(unlock) - set(every))
    if unknown:
        raise SystemExit(f"--unlock: no chapter {', '.join(unknown)} in {root / 'solutions'} (have {', '.join(every)})")
    os.umask(0o022)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=out, prefix=".build-"))
    write_engine(work, root, every, unlock)
    compileall.compile_dir(str(work / "engine"), quiet=1)   # students cannot write bytecode next to it
    for folder, dirs, files in os.walk(work):   # every account reads it; the instructors' group rebuilds it
        for name in [*dirs, *files]:
            os.chmod(Path(folder) / name, 0o2775 if name in dirs else 0o664)
    os.chmod(work, 0o2775)
    old = out / ".engine-old"
    shutil.rmtree(old, ignore_errors=True)
    if (out / "engine").exists():
        (out / "engine").rename(old)
    (work / "engine").rename(out / "engine")
    shutil.rmtree(old, ignore_errors=True)
    shutil.rmtree(work, ignore_errors=True)
    (out / UNLOCKED).write_text("".join(f"{chapter}\n" for chapter in sorted(unlock)))
    os.chmod(out / UNLOCKED, 0o664)
    return out / "engine"


def due_refusal(course: Path, chapters: list[str], now: datetime | None = None) -> str:
    """Why unlocking `chapters` now would hand out answers still due ('' when every due date has passed)."""
    from engine.course.classroom.class_folder import read_roster
    roster_file = course / "roster.ini"
    if not roster_file.is_file():
        return f"--course {course} has no roster.ini: give the course folder, or --force"
    due = read_roster(roster_file).due
    now = now or datetime.now(timezone.utc)
    early = [f"{chapter} (due {due[chapter]:%Y-%m-%d %H:%M} UTC)" for chapter in chapters
             if chapter in due and due[chapter] > now]
    return (f"--unlock {', '.join(early)}: not due yet, so students could import its reference answers; "
            "unlock it after its due date (or --force)") if early else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.course.classroom.hub.student_engine", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--unlock", default="", help="chapters to unlock, e.g. ch02 (comma or space separated)")
    parser.add_argument("--course", type=Path, default=Path("~/course").expanduser(),
                        help="the course folder whose roster gives the due dates (default ~/course)")
    parser.add_argument("--force", action="store_true", help="unlock before the due date")
    parser.add_argument("--out", type=Path, default=Path(sys.prefix) / "student",
                        help="the folder students import from (default $HUB_PREFIX/student)")
    args = parser.parse_args(argv)
    new = [c for c in args.unlock.replace(",", " ").split() if c not in unlocked(args.out)]
    why = "" if args.force or not new else due_refusal(args.course, new)
    if why:
        parser.error(why)
    chapters = sorted(set(unlocked(args.out)) | set(new))
    try:
        engine = build(args.out, chapters)
    except PermissionError as error:
        parser.error(f"cannot write {args.out} ({error.strerror}): run it as an instructor (the "
                     "paged-kv-instructors group) or root")
    print(f"student engine: {engine}, reference unlocked for: {', '.join(chapters) or 'no chapter'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
