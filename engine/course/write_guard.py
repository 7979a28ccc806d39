"""Where a course command may write, replace or delete: checked before it does any work.

A command that fills a folder it was given (`edition --out`, `release --out/--work`, `book --out`,
`autograde --course`) must never be pointed at the repository itself, a folder above it, or one of
its tracked sources: the folder would be emptied, overwritten, or (for engine/) copied into itself.

    refusal(option, path)        why `path` may not be written, '' when it may (the repository rule)
    folder_refusal(option, path) the same, plus: not a file, and its nearest existing parent is a folder

It uses engine/tools/cli_args.py's `unmakeable_parent`; the commands take `path_text` from there too.
"""
from __future__ import annotations

from pathlib import Path

from engine.tools.cli_args import unmakeable_parent

from engine.course.paths import repo_root

SOURCES = ("engine", "solutions", "notebooks", "book", "tests", ".git")


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or path.is_relative_to(folder)


def refusal(option: str, path: Path, root: Path | None = None, sources: tuple[str, ...] = SOURCES,
            allow: tuple[Path, ...] = ()) -> str:
    """Why `path` (given as `option`) may not be a place a command writes or replaces ('' when it may):
    the repository root, a folder above it, or a path inside one of its `sources` (except inside one
    of the folders in `allow`, e.g. book/_build for the book)."""
    root = (root or repo_root()).resolve()
    target = Path(path).resolve()
    if target == root:
        return f"{option} {path} is the repository itself"
    if root.is_relative_to(target):
        return f"{option} {path} holds the repository {root}"
    for name in sources:
        if _inside(target, root / name) and not any(_inside(target, Path(a).resolve()) for a in allow):
            return f"{option} {path} is inside the repository's {name}/, which this command must not write into"
    return ""


def folder_refusal(option: str, path: Path, **kwargs) -> str:
    """refusal(), and also: `path` is not a file, and the nearest folder above it that exists is a folder
    (so it can be created)."""
    why = refusal(option, path, **kwargs)
    if why:
        return why
    path = Path(path)
    if path.exists() and not path.is_dir():
        return f"{option} {path} is a file, not a folder"
    blocking = unmakeable_parent(path)
    return f"{option} {path}: {blocking} is a file, not a folder" if blocking else ""
