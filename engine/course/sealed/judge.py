"""The judge: the process that runs a chapter's graded tests and signs their verdicts, and runs no
learner code at all.

The grader starts two processes per notebook. The host (engine.course.seal, in the sandbox) runs every
cell the notebook has and holds the learner's objects. The judge (this module, outside the sandbox)
holds the key. It runs the chapter's test cells itself, on its own copy of the checks, the engine and
the chapter's setup cells; the names a test reads that the learner defined (the exercise's class or
function, an answer) are `Remote`s for the host's objects (engine.course.sealed.remote). So a test's
outcome is decided here: learner code can answer the checks' questions, right or wrong, and nothing
more. It cannot reach the key, the judge's memory or the pipe the verdicts travel on.

Learner code can call back only into what a check handed it (an allocator, a sequence, the model), and
only through public attributes of the engine's own objects. The host imports its own copy of the
engine in which this chapter's taught bodies are stubs (engine.course.edition.host_engine), so learner
code finds no reference there to stand in for its own.
"""
from __future__ import annotations

import builtins
import enum
import hashlib
import hmac
import inspect
import itertools
import json
import os
import random
import signal
import socket
import sys
import types

import torch

from engine.course.seal import (TRUSTED_PREFIX, _Capture, _error_output, _names_bound, _names_read,
                                _stream_outputs, named)
from engine.course.sealed.fingerprint import code_of, every_code, fingerprint
from engine.course.sealed.remote import Channel, RemoteGone

_SHAREABLE_MODULES = ("engine.",)      # the judge hands the host references only to objects of these
_HARMLESS = (itertools.count, random.Random, torch.Generator)   # ... and to these, which reach nothing
_PLAIN_DUNDERS = {"__name__", "__qualname__", "__doc__", "__module__"}   # strings, readable by graded code


def _engine_object(value) -> bool:
    """Objects the host may hold a reference to: instances of the engine's own classes, their methods
    the engine defines (not those inherited from torch: a module's hooks or load_state_dict would let
    learner code into the judge's own forward passes), and the engine's functions and classes."""
    if isinstance(value, _HARMLESS):
        return True
    if isinstance(value, types.BuiltinMethodType) and type(getattr(value, "__self__", None)) in (list, dict, set):
        return True                       # a method of a list or dict a check's object holds
    if isinstance(value, types.MethodType):
        return _from_engine(value.__func__) and _from_engine(type(value.__self__))
    if isinstance(value, types.ModuleType):
        return False
    return _from_engine(value if isinstance(value, (type, types.FunctionType)) else type(value))


def _from_engine(owner) -> bool:
    module = getattr(owner, "__module__", "")
    return isinstance(module, str) and module.startswith(_SHAREABLE_MODULES)


def guard(op: str, target, args: list) -> None:
    """What the host may ask of the judge's objects: public attributes and calls on what a check handed
    it; an attribute it sets holds data (a method or property of the class is never replaced)."""
    if target is None:
        raise PermissionError("the grader answers requests on the objects it handed out only")
    if op == "write_into" and args[0] == "getattr":
        op, args = "getattr", args[1:]
    if op in ("getattr", "setattr", "delattr"):
        name = args[0]
        if not isinstance(name, str) or (name.startswith("_") and not (op == "getattr" and name in _PLAIN_DUNDERS)):
            raise PermissionError(f"the grader's objects do not show {name!r} to graded code")
        declared = inspect.getattr_static(type(target), name, None)
        if op != "getattr" and (callable(declared) or hasattr(declared, "__get__")) and not isinstance(
                declared, (int, float, str, enum.Enum)):
            raise PermissionError(f"graded code may not replace {type(target).__name__}.{name} of the grader's "
                                  "objects")


def _edition_notebook() -> dict | None:
    """In the student edition the judge's own engine has stubs too, which call the learner's definitions
    from the running notebook: the judge keeps its own copy of the notebook's names for them (the
    edition is the learner's own copy of the course, whose grader they may change anyway; the
    instructor grades in the full repository, where the judge's engine has no stubs)."""
    edition = sys.modules.get("engine._edition")
    if edition is None:
        return None
    module = types.ModuleType("__main__")     # the learner's classes, defined as in the notebook
    module.__dict__["__builtins__"] = builtins
    edition.notebook = lambda: module.__dict__
    return module.__dict__


def needed_cells(cells: list[tuple[str, str, str]]) -> set[str]:
    """The chapter cells (kind trusted) whose names the tests read, directly or through another such cell:
    the judge runs those itself. cells: [(kind, name, source)] in notebook order."""
    wanted: set[str] = set()
    chosen: set[str] = set()
    for kind, _, source in cells:
        if kind == "test":
            wanted |= _names_read(source)
    for kind, name, source in reversed(cells):
        if kind == "trusted" and _names_bound(source) & wanted:
            chosen.add(name)
            wanted |= _names_read(source)
    return chosen


def main() -> None:
    """Serve one grading run: the key and plan from the grader, the host on the third descriptor."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    command_fd, result_fd, host_fd = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    commands = os.fdopen(command_fd, "r", encoding="utf-8", closefd=True)
    results = os.fdopen(result_fd, "w", encoding="utf-8", closefd=True)
    plan = json.loads(commands.readline())
    key = bytes.fromhex(plan.pop("key"))

    def send(message: dict) -> None:     # signed as the grader checks it (engine.course.kernel)
        body = json.dumps(message)
        results.write(body + "\t" + hmac.new(key, body.encode(), hashlib.sha256).hexdigest() + "\n")
        results.flush()

    os.environ.setdefault("MPLBACKEND", "Agg")
    for module in plan.get("preimport", []):
        try:
            __import__(module)
        except Exception:
            pass
    channel = Channel(socket.socket(fileno=host_fd), "T")
    channel.guard = guard
    channel.screen = _engine_object
    try:
        channel.send_plan(dict(plan, key=None))
    except RemoteGone:
        return
    shadow = _edition_notebook()
    main_module = types.ModuleType("__main__")
    namespace = main_module.__dict__
    namespace["__builtins__"] = builtins
    sys.modules["__main__"] = main_module
    mine: dict = {}                       # what the judge's own run of the chapter's cells bound
    graded = dict(plan.get("graded", {}))
    graded_by_cell = plan.get("graded_by_cell", {})
    run_here = set(plan.get("judge_cells", []))
    prints = _reference_prints(plan.get("references", []))
    sources: dict = {}                    # graded name -> the text of the learner cell that last defined it
    send({"seq": 0, "ready": True})
    seq = 0
    for line in commands:
        seq += 1
        job = json.loads(line)
        source, kind, name = job["source"], job["kind"], job.get("name") or f"cell{seq}"
        if kind == "learner":
            graded.update(graded_by_cell.get(name, {}))
            sources.update((bound, source) for bound in _names_bound(source))
        try:
            message = _run(channel, namespace, mine, graded, source, kind, name, name in run_here)
            if kind == "test":
                message["verdict"]["copied"] = copies_of_the_reference(
                    sorted(_names_read(source) & set(graded)), graded, sources, prints)
            if shadow is not None and kind != "test":
                _shadow_run(shadow, source, name)
        except RemoteGone as gone:
            message = {"status": "dead", "outputs": [_error_output(gone)], "verdict": {}, "refused": []}
        message["seq"] = seq
        send(message)
        if message["status"] == "dead":
            return


def _run(channel: Channel, namespace: dict, mine: dict, graded: dict, source: str, kind: str,
         name: str, run_here: bool) -> dict:
    """One cell: the host runs learner and chapter cells; the judge runs tests (and the chapter cells
    they need) on its own, with the learner's names as Remotes."""
    if kind != "test":
        result = channel.request("cell", None, source, kind, name)
        if kind == "trusted" and run_here:
            if _run_here(channel, namespace, mine, graded, source, name, quiet=True)[0] == "ok":
                mine.update((n, namespace[n]) for n in _names_bound(source) if n in namespace)
        return {"status": result["status"], "outputs": result["outputs"], "verdict": {},
                "refused": result.get("refused", [])}
    begin = channel.request("begin_test", None, source, sorted(_names_read(source) & set(graded)))
    status, outputs = _run_here(channel, namespace, mine, graded, source, name, quiet=False)
    end = channel.request("end_test", None)
    verdict = dict(begin, **end)
    reasons = list(verdict.pop("reasons", []))
    if reasons and status == "ok":
        status = "error"
        outputs.append({"output_type": "error", "ename": "GradingRefused", "evalue": " ".join(reasons),
                        "traceback": ["GradingRefused: " + " ".join(reasons)]})
    return {"status": status, "outputs": outputs, "verdict": verdict, "refused": end.get("refused", [])}


def _run_here(channel: Channel, namespace: dict, mine: dict, graded: dict, source: str, name: str,
              quiet: bool) -> tuple[str, list]:
    """Run a chapter cell in the judge. Names it reads: the judge's own binding of a chapter name, the
    host's object for an exercise's name or anything else the chapter's cells here did not bind."""
    wanted = sorted(n for n in _names_read(source) if n in graded or n not in mine)
    wanted = [n for n in wanted if n in graded or not hasattr(builtins, n)]
    for bound, value in mine.items():
        namespace[bound] = value
    for stale in [n for n in namespace if n not in mine and not n.startswith("__")]:
        del namespace[stale]
    if wanted:
        namespace.update(channel.request("lookup", None, wanted))
    out, err = _Capture(), _Capture()
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    status, error = "ok", None
    try:
        exec(compile(source, f"{TRUSTED_PREFIX}{name}>", "exec"), namespace)
    except RemoteGone:
        raise
    except BaseException as exc:  # noqa: BLE001 - a failed test, reported as its cell's error
        status, error = "error", _error_output(exc)
    finally:
        sys.stdout, sys.stderr = saved
    if quiet:
        return status, []
    return status, _stream_outputs(out, err) + ([error] if error else [])


def _reference_prints(references: list) -> dict:
    """{fingerprint: qualname} of the chapter's taught reference functions, from the judge's engine."""
    prints = {}
    for module_name, qualname in references:
        try:
            code = code_of(named(module_name, qualname))
        except (ImportError, AttributeError):
            continue
        mark = fingerprint(code) if code is not None else None
        if mark:
            prints[mark] = code.co_qualname
    return prints


def copies_of_the_reference(names: list, graded: dict, sources: dict, prints: dict) -> list[str]:
    """The graded functions whose code, as typed into the learner's cell that last defined them, is a
    reference's by meaning (renamed or reformatted): read from the cell's text, never from the host."""
    found = []
    for name in names:
        source = sources.get(name)
        if source is None:
            continue
        try:
            module = compile(source, "<learner cell>", "exec")
        except (SyntaxError, ValueError):
            continue
        methods = graded[name].get("methods")
        wanted = {f"{name}.{m}" for m in methods} if methods else {name}
        for code in every_code(module):
            mark = fingerprint(code) if code.co_qualname in wanted else None
            if mark in prints:
                found.append(f"{code.co_qualname if methods else name} has the code of the reference's "
                             f"{prints[mark]}")
    return sorted(set(found))


def _shadow_run(shadow: dict, source: str, name: str) -> None:
    """A cell in the edition judge's copy of the notebook, quietly (its outputs are the host's)."""
    saved = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = _Capture()
    try:
        exec(compile(source, f"<shadow {name}>", "exec"), shadow)
    except BaseException:  # noqa: BLE001 - the host reports the cell's own error
        pass
    finally:
        sys.stdout, sys.stderr = saved

