"""Shared checks for command-line options: a bad value is refused before any work, in one line.

Every command of `python -m engine` (and any other course command) checks its options here, with
argparse `type=` validators and two actions, so that a refusal always reads the same:

    error: argument --requests: 0 is not a whole number >= 1

names the option, the value as typed and the allowed range, and exits with status 2. `Parser`
prints that one line instead of argparse's usage block. Checks that need several options at once
(a length against a budget, a model against the memory) raise `InputError` from the command, which
`python -m engine` prints as one `error: ...` line with the same status.

The names below are used by other modules (engine/tools/bench_decode.py among them): keep them.

    Parser                    ArgumentParser whose errors are one line, exit status 2
    int_in(lo, hi=None)       a whole number in [lo, hi] (no upper bound when hi is None)
    positive_int, nonneg_int  whole numbers >= 1 and >= 0
    seed                      a whole number from 0 to SEED_MAX (fits torch, random and numpy seeds)
    float_in(lo, hi, ...)     a finite number in a range, each end open or closed
    finite_float              any finite number (not nan, not inf)
    positive_float            a finite number > 0
    nonneg_float              a finite number >= 0
    fraction                  a finite number in (0, 1]
    non_empty                 a text that is not empty
    output_file(*suffixes)    a file to write: its folder exists, it is not a folder, its suffix is allowed
    path_text(option)         a path that is not the empty text (Path('') would be the current folder)
    unmakeable_parent(path)   the file in the way of making `path`, or None
    Ordered                   action for nargs=2 MIN MAX: refuses MIN > MAX
    Distinct                  action for nargs="+": refuses a value given twice
    check_memory(nbytes, what)  InputError when `what` needs more than half this machine's memory
    FIGURE_SUFFIXES           what matplotlib writes, for output_file(*FIGURE_SUFFIXES)
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

from engine.errors import InputError

SEED_MAX = 2 ** 63 - 1          # torch.Generator takes up to 2**64 - 1; seed + i must stay below it
GIB = 1024 ** 3
FIGURE_SUFFIXES = (".png", ".pdf", ".svg", ".jpg", ".jpeg", ".webp", ".eps", ".ps", ".tif", ".tiff")


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose refusal is one line, `error: <what>`, and exit status 2 (no usage block).

    Sub-parsers made with `add_subparsers().add_parser` are of the same class, so they refuse alike.
    """

    def error(self, message: str):
        """Print one `error: ...` line on stderr and exit 2, as every refusal of the engine does."""
        print(f"error: {message}", file=sys.stderr)
        self.exit(2)


def shown(text: str) -> str:
    """The value as the user typed it; quoted when it is empty or holds spaces."""
    return text if text and not any(ch.isspace() for ch in text) else repr(text)


def int_in(lo: int, hi: int | None = None, what: str | None = None):
    """An argparse type: a whole number in [lo, hi] (hi None: no upper bound).

    `what` replaces the range's wording in the message (e.g. "a seed from 0 to 2**63 - 1").
    """
    wanted = what or (f"a whole number >= {lo}" if hi is None else f"a whole number from {lo} to {hi}")

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{shown(text)} is not {wanted}") from None
        if value < lo or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"{shown(text)} is not {wanted}")
        return value

    parse.__name__ = f"int_in({lo}, {hi})"
    return parse


positive_int = int_in(1)
nonneg_int = int_in(0)
seed = int_in(0, SEED_MAX, what="a seed: a whole number from 0 to 2**63 - 1")


def float_in(lo: float = -math.inf, hi: float = math.inf, lo_open: bool = False, hi_open: bool = False,
             what: str | None = None):
    """An argparse type: a finite number in the range lo..hi, each end open (excluded) or closed.

    nan and inf are always refused, also where the range has no end: no option of the engine means
    anything by them.
    """
    if what is None:
        low = "" if lo == -math.inf else f"{'>' if lo_open else '>='} {lo:g}"
        high = "" if hi == math.inf else f"{'<' if hi_open else '<='} {hi:g}"
        what = "a finite number" + (f" {low}" if low else "") + (" and" if low and high else "") + \
            (f" {high}" if high else "")

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{shown(text)} is not {what}") from None
        inside = (math.isfinite(value) and (value > lo if lo_open else value >= lo)
                  and (value < hi if hi_open else value <= hi))
        if not inside:
            raise argparse.ArgumentTypeError(f"{shown(text)} is not {what}")
        return value

    parse.__name__ = "float_in"
    return parse


finite_float = float_in()
positive_float = float_in(0, lo_open=True)
nonneg_float = float_in(0)
fraction = float_in(0, 1, lo_open=True, what="a finite number in (0, 1]")


def non_empty(text: str) -> str:
    """An argparse type: any text but the empty one."""
    if not text:
        raise argparse.ArgumentTypeError("'' is empty: give at least one character")
    return text


def model_source(text: str) -> str:
    """--model: 'trained', 'tiny', or a checkpoint folder (the folder, not its config.json or a weights file)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("'' is empty: give 'trained', 'tiny' or a checkpoint folder")
    path = Path(text)
    if text not in ("trained", "tiny") and path.is_file():
        raise argparse.ArgumentTypeError(f"{shown(text)} is a file: give the checkpoint folder that holds "
                                         f"config.json and the weights ({str(path.parent)!r})")
    return text


def output_file(*suffixes: str):
    """An argparse type: a path to write later, checked now (before the run it would end).

    Its folder must exist and be a folder, the path must not be a folder itself, and with
    `suffixes` (".png", ...) its suffix must be one of them.
    """
    def parse(text: str) -> str:
        path = Path(text)
        folder = path.parent
        if not text or path.is_dir():
            raise argparse.ArgumentTypeError(f"{shown(text)} is a folder: give a file name inside it")
        if not folder.is_dir():
            why = "is not a folder" if folder.exists() else "does not exist"
            raise argparse.ArgumentTypeError(f"{shown(text)}: the folder {str(folder)!r} {why}; create it first")
        if suffixes and path.suffix.lower() not in suffixes:
            raise argparse.ArgumentTypeError(f"{shown(text)} does not end in {', '.join(suffixes)}")
        return text

    parse.__name__ = "output_file"
    return parse


def option(action: argparse.Action) -> str:
    """The option's name as the user sees it in messages (e.g. --prompt-len)."""
    return "/".join(action.option_strings) or action.dest


class Ordered(argparse.Action):
    """For `nargs=2, metavar=("MIN", "MAX")`: refuse MIN > MAX (each value checked by `type` first)."""

    def __call__(self, parser, namespace, values, option_string=None):
        low, high = values
        if low > high:
            parser.error(f"argument {option(self)}: MIN {low} is greater than MAX {high} (give MIN <= MAX)")
        setattr(namespace, self.dest, tuple(values))


class Distinct(argparse.Action):
    """For `nargs="+"`: refuse a value given twice (it would run or be reported twice)."""

    def __call__(self, parser, namespace, values, option_string=None):
        seen = set()
        for value in values:
            if value in seen:
                parser.error(f"argument {option(self)}: {value} is given twice (give each value once)")
            seen.add(value)
        setattr(namespace, self.dest, list(values))


def machine_memory() -> int | None:
    """Bytes of physical memory of this machine, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def check_memory(nbytes: float, what: str, fraction_of_machine: float = 0.5, total: int | None = None) -> None:
    """Refuse, before allocating anything, a run whose `what` needs more than half the machine's memory.

    `what` names the options that set the size (e.g. "--slots 12 x --max-len 512 tokens of KV");
    `total` is the memory to compare with (a GPU's), by default this machine's.
    """
    where = "this machine's" if total is None else "the device's"
    total = machine_memory() if total is None else total
    if total is not None and nbytes > fraction_of_machine * total:
        raise InputError(f"{what} need {nbytes / GIB:,.1f} GiB, more than {fraction_of_machine:.0%} of {where} "
                         f"{total / GIB:,.1f} GiB of memory: lower them")


def unmakeable_parent(path: Path) -> Path | None:
    """The nearest existing folder-to-be above `path` when it is a file (so `path` cannot be made), else None."""
    for parent in Path(path).absolute().parents:
        if parent.exists():
            return None if parent.is_dir() else parent
    return None


def path_text(option: str, what: str = "a folder", why: str = " (the current folder is never taken by default)"):
    """An argparse type: a Path, refusing the empty text (Path('') would be the current folder)."""
    def parse(text: str) -> Path:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"{text!r} is empty: name {what}{why}")
        return Path(text)

    parse.__name__ = f"path({option})"
    return parse
