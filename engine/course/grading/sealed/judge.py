"""The judge: the process that runs a chapter's graded tests, decides what may count and signs the
verdicts; it runs no learner code at all.

The grader starts two processes per notebook. The host (engine.course.grading.sealed.host, in the sandbox)
runs every cell the notebook has and holds the learner's objects. The judge (this module, in a sandbox
of its own where bubblewrap works: engine.course.grading.sandbox.confine) holds the channel key. It runs the
chapter's test cells itself, on its own copy of the checks, the engine and the chapter's setup cells;
the names a test reads that the learner defined are `Remote`s for the host's objects
(engine.course.grading.sealed.remote), except a Triton kernel, which it takes from the cell's text
(engine.course.grading.reading.kernels) and launches in the kernel process the grader starts for it.
Whether a test may count is decided here from the cells' text (engine.course.grading.reading: own work,
not written yet, copies of the reference); nothing the host says about itself is read, and a
host reply that does not fit its schema costs the cell. Time is the host's CPU time and a wall-clock
backstop counted only while the judge waits for the host (Budget).
"""
from __future__ import annotations

import builtins
import hashlib
import hmac
import json
import os
import signal
import socket
import sys
import time
import types

from engine.course.cells import python_source
from engine.course.grading.reading import decide, likeness
from engine.course.grading.reading.names import imported, names_bound, names_read
from engine.course.grading.sealed.host import TRUSTED_PREFIX, _Capture, _error_output, _stream_outputs
from engine.course.grading.sealed.kernelbox import KernelBox, from_cell, sandboxed_kernel
from engine.course.grading.sealed.remote import Channel, OutOfTurn, RemoteGone, TooLarge, TooSlow


def _no_notebook() -> None:
    """In the student edition a taught body of the engine is a stub that runs the learner's definition
    from the running notebook. The judge runs none: here its stubs find no notebook (not written yet)."""
    try:
        from engine import _edition
    except ImportError:
        return
    _edition.notebook = lambda: {}


def main() -> None:
    """A judge started on its own: the descriptors on its command line."""
    serve(*(int(fd) for fd in sys.argv[1:5]))


def serve(command_fd: int, result_fd: int, host_fd: int, kernel_fd: int | None = None) -> None:
    """Serve one grading run: the key and plan from the grader on the command pipe, signed results on
    the result pipe, the host on its socket (engine.course.grading.sealed.warm forks a judge straight into this)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    bound_memory()
    commands = os.fdopen(command_fd, "r", encoding="utf-8", closefd=True)
    results = os.fdopen(result_fd, "w", encoding="utf-8", closefd=True)
    plan = json.loads(commands.readline())
    key = bytes.fromhex(plan.pop("key"))

    def send(message: dict) -> None:     # signed as the grader checks it (engine.course.grading.kernel)
        body = json.dumps(message)
        results.write(body + "\t" + hmac.new(key, body.encode(), hashlib.sha256).hexdigest() + "\n")
        results.flush()

    os.environ.setdefault("MPLBACKEND", "Agg")
    for module in plan.get("preimport", []):
        try:
            __import__(module)
        except Exception:
            pass
    box = KernelBox(grader=kernel_fd)     # its kernel process is the grader's, asked for on kernel_fd
    try:
        _serve(plan, send, commands, host_fd, box)
    finally:
        box.stop()


MEMORY_MB = 4096                 # the judge's own data: what the host hands it is held within this


def bound_memory() -> None:
    """Hold this judge's data within MEMORY_MB (RLIMIT_DATA), so that a host that answers with value after
    value fails the test that asked (a MemoryError), not the machine; not where a CUDA driver is present
    (sandbox.cuda_driver)."""
    import resource

    from engine.course.grading.sandbox import cuda_driver
    if not cuda_driver():
        resource.setrlimit(resource.RLIMIT_DATA, (MEMORY_MB << 20, MEMORY_MB << 20))


def _serve(plan: dict, send, commands, host_fd: int, box: "KernelBox") -> None:
    channel = Channel(socket.socket(fileno=host_fd), "T")
    learner_cells: list[str] = []        # every learner cell's text, in order: what "written" is read from
    channel.unwritten = decide.unwritten({qualname for _, qualname in plan.get("references", [])}, learner_cells)
    try:
        channel.send_plan(dict(plan, key=None))
    except RemoteGone:
        return
    _no_notebook()
    main_module = types.ModuleType("__main__")
    namespace = main_module.__dict__
    namespace["__builtins__"] = builtins
    sys.modules["__main__"] = main_module
    mine: dict = {}                       # what the judge's own run of the chapter's cells bound
    graded = dict(plan.get("graded", {}))
    graded_by_cell = plan.get("graded_by_cell", {})
    run_here = set(plan.get("judge_cells", []))
    references = likeness.reference_tokens(plan.get("references", []), graded)
    kernel_names = set(plan.get("kernels", []))
    built: dict = {}                      # kernel name -> (the judge's own build of it, or None, why not)
    notebook = decide.Notebook(graded)
    sources: dict = {}                    # graded name -> the text of the learner cell that last defined it
    send({"seq": 0, "ready": True})
    seq = 0
    for line in commands:
        seq += 1
        job = json.loads(line)
        source, kind, name = job["source"], job["kind"], job.get("name") or f"cell{seq}"
        if kind == "learner":
            source = python_source(source)      # magics and !cmd as the code they hold, for both processes
            learner_cells.append(source)
            graded.update(graded_by_cell.get(name, {}))
            sources.update((bound, source) for bound in names_bound(source))
            notebook.add(name, source)
            built.update((k, _sandboxed(box, *from_cell(k, source))) for k in kernel_names & names_bound(source))
        elif kind == "trusted":
            notebook.chapter_cell(source)
        last_run(job.get("last") is True and kind == "test")
        budget = Budget.of(job.get("timeout"))
        channel.allowance = budget.wall
        box.deadline = None if budget.wall is None else time.monotonic() + budget.wall
        try:
            used = notebook.graded_behind(names_read(source))
            reasons = notebook.reasons(used) if kind == "test" else []
            reasons += [built[k][1] for k in used if k in built and built[k][1]]
            message = _run(channel, namespace, mine, graded, source, kind, name, name in run_here,
                           reasons, budget, built)
            if kind == "test":
                message["verdict"]["copied"] = likeness.copies_of_the_reference(used, graded, sources, references)
        except TooSlow:
            message = {"status": "stuck", "outputs": [budget.exceeded()], "verdict": {}}
        except (TooLarge, OutOfTurn) as bound:   # past a bound, or a request: nothing earned, both restart
            message = {"status": "stuck", "outputs": [_plain_error(type(bound).__name__, f"{bound}{RESTARTED}")],
                       "verdict": {}}
        except RemoteGone as gone:
            message = {"status": "dead", "outputs": [_plain_error(type(gone).__name__, str(gone))], "verdict": {}}
        channel.allowance = None
        message["seq"] = seq
        send(message)
        if message["status"] in ("dead", "stuck"):
            return


def last_run(last: bool) -> None:
    """Tell the checks whether this is a test's last run (engine.checks.served: a part the exercise's
    points rest on may no longer wait for a later exercise)."""
    import engine.checks
    engine.checks.LAST_RUN = last


RESTARTED = "; this test earns nothing, and the notebook's process was restarted"


def _plain_error(ename: str, text: str) -> dict:
    """An error output of one line, without the grader's own stack (nothing in it is the learner's to read
    or fix): a broken channel, a cell past its time."""
    return {"output_type": "error", "ename": ename, "evalue": text, "traceback": [f"{ename}: {text}"]}


class Budget:
    """A cell's time: `cpu` seconds of the host's own CPU time (all its threads; the host stops its
    code past it), and a wall-clock backstop `wall` for the host's answers, counted only while the
    judge waits for them (its own work never counts). A busy machine slows the wall clock, not the
    CPU time a computation needs: the backstop is WALL_FACTOR times the cell's time limit."""

    WALL_FACTOR = 10

    def __init__(self, cpu: float | None, wall: float | None, limit: float | None):
        self.cpu, self.wall, self.limit = cpu, wall, limit

    @classmethod
    def of(cls, limit) -> "Budget":
        if not isinstance(limit, (int, float)) or limit <= 0:
            return cls(None, None, None)
        return cls(float(limit) * max(1, len(os.sched_getaffinity(0))), float(limit) * cls.WALL_FACTOR, limit)

    def exceeded(self) -> dict:
        text = (f"the notebook's code took more than {self.wall:g} s (wall clock) to answer the grader, "
                f"{self.WALL_FACTOR} times the cell's {self.limit:g} s limit (it slept or waited){RESTARTED}")
        return _plain_error("CellTimeoutError", text)


def _run(channel: Channel, namespace: dict, mine: dict, graded: dict, source: str, kind: str,
         name: str, run_here: bool, reasons: list, budget: "Budget", built: dict) -> dict:
    """One cell: the host runs learner and chapter cells; the judge runs tests (and the chapter cells
    they need) on its own, with the learner's names as Remotes. `reasons`: the judge's own, from the
    cells' text, why the test must not count; what the host reports is only shown."""
    if kind != "test":
        result = _checked(channel.request("cell", None, source, kind, name, budget.cpu), CELL_REPLY)
        if kind == "trusted" and run_here:      # the modules it imports are the judge's: never the host's
            mine.setdefault(_CHAPTER_NAMES, set()).update(imported(source))
            if _run_here(channel, namespace, mine, graded, source, name, built, quiet=True)[0] == "ok":
                mine.update((n, namespace[n]) for n in names_bound(source) if n in namespace)
        return {"status": result["status"], "outputs": result["outputs"], "verdict": {}}
    begin = _checked(channel.request("begin_test", None, budget.cpu), EMPTY_REPLY)
    status, outputs = _run_here(channel, namespace, mine, graded, source, name, built, quiet=False)
    end = _checked(channel.request("end_test", None), EMPTY_REPLY)
    if begin.get("malformed") or end.get("malformed"):
        reasons = list(reasons) + ["the notebook's process answered the grader out of turn or malformed"]
    verdict = {"reasons": list(reasons)}
    if reasons:                           # the judge's reason first: it is why the test earns nothing
        status = "error"
        outputs.insert(0, {"output_type": "error", "ename": "GradingRefused", "evalue": " ".join(reasons),
                           "traceback": ["GradingRefused: " + " ".join(reasons)]})
    return {"status": status, "outputs": outputs, "verdict": verdict}


def _run_here(channel: Channel, namespace: dict, mine: dict, graded: dict, source: str, name: str,
              built: dict, quiet: bool) -> tuple[str, list]:
    """Run a chapter cell in the judge. Names it reads: the judge's own binding of a chapter name, the
    host's object for an exercise's name or anything else the chapter's cells here did not bind."""
    chapter = mine.get(_CHAPTER_NAMES, set())
    wanted = sorted(n for n in names_read(source) if n in graded or (n not in mine and n not in chapter))
    wanted = [n for n in wanted if n in graded or not hasattr(builtins, n)]
    for bound, value in mine.items():
        namespace[bound] = value
    for stale in [n for n in namespace if n not in mine and not n.startswith("__")]:
        del namespace[stale]
    namespace["__builtins__"] = builtins
    namespace.pop(_CHAPTER_NAMES, None)
    out, err = _Capture(), _Capture()
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    status, error = "ok", None
    try:
        if wanted:
            namespace.update(_looked_up(channel.request("lookup", None, wanted), wanted))
        for kernel, (fn, why) in built.items():   # a kernel is the text's, launched in the kernel process
            if kernel in wanted:
                namespace[kernel] = fn if fn is not None else _not_a_kernel(why)
        exec(compile(source, f"{TRUSTED_PREFIX}{name}>", "exec"), namespace)
    except RemoteGone:
        raise
    except MemoryError:
        status, error = "error", _plain_error("MemoryError", f"the grader's check held more than its {MEMORY_MB:,} "
                                              "MiB of memory: what the notebook's process answered was too large")
    except BaseException as exc:  # noqa: BLE001 - a failed test, reported as its cell's error
        status, error = "error", _error_output(exc)
    finally:
        sys.stdout, sys.stderr = saved
    if quiet:
        return status, []
    return status, _stream_outputs(out, err) + ([error] if error else [])


_CHAPTER_NAMES = "__chapter_names__"   # in `mine`: the names the chapter's cells the judge ran import


class ReplyRefused(Exception):
    """The host answered a request with something it was not asked for: the test fails, saying what."""


def _looked_up(reply, wanted: list) -> dict:
    """The host's objects for the names a test reads: a mapping of some of exactly those names (a name
    it lacks stays unbound, as in a notebook), each to data or a Remote. A reply with another name
    (the checks' module, a builtin, a name of the judge's), or not a mapping of names, is refused
    whole: nothing of it reaches the test's names."""
    if type(reply) is not dict:
        raise ReplyRefused(f"the notebook's process answered the grader's request for {', '.join(wanted)} with "
                           f"a {type(reply).__name__}, not the names asked for")
    extra = sorted(repr(k)[:40] for k in reply if type(k) is not str or k not in wanted)
    if extra:
        raise ReplyRefused(f"the notebook's process answered the grader's request for {', '.join(wanted)} with "
                           f"names it did not ask for ({', '.join(extra[:5])}): this test does not count")
    return reply


def _sandboxed(box: KernelBox, program, why: str):
    """(what the checks launch for a kernel the judge took from the text, why it cannot be one)."""
    return (sandboxed_kernel(box, program) if program is not None else None), why


def _not_a_kernel(why: str):
    def refused(*args, **kwargs):
        raise NotImplementedError(why)
    return refused


CELL_REPLY = {"status": str, "outputs": list}
EMPTY_REPLY: dict = {}             # begin_test and end_test: any mapping (nothing in it is read)
_OUTPUT_TYPES = {"stream", "error", "display_data", "execute_result"}


def _checked(reply, schema: dict) -> dict:
    """The host's reply if it has the schema's fields with their types (outputs as notebook outputs of
    strings, a cell's status); otherwise a reply that costs the cell, marked malformed."""
    def fine(key, kind, value) -> bool:
        if not isinstance(value, kind):
            return False
        if key == "outputs":
            return all(isinstance(o, dict) and o.get("output_type") in _OUTPUT_TYPES and all(
                isinstance(v, (str, list, dict)) for v in o.values()) for o in value)
        return key != "status" or value in ("ok", "error", "interrupted")
    if isinstance(reply, dict) and all(fine(k, t, reply.get(k)) for k, t in schema.items()):
        checked = {k: reply[k] for k in schema}
        if "outputs" in checked:
            checked["outputs"] = _bounded(checked["outputs"])
        return checked
    broken = {k: ([] if t is list else "error") for k, t in schema.items()}
    if "outputs" in broken:
        broken["outputs"] = [{"output_type": "error", "ename": "GradingRefused", "evalue": MALFORMED,
                              "traceback": [f"GradingRefused: {MALFORMED}"]}]
    return dict(broken, malformed=True)


MALFORMED = "the notebook's process sent the grader a malformed reply: this cell does not count"
MAX_OUTPUT_CHARS = 200_000       # a cell's outputs, all together, as the host sent them


def _bounded(outputs: list) -> list:
    """A cell's outputs up to MAX_OUTPUT_CHARS in all (the host's own bound is per stream); what is past
    it is cut, saying so."""
    kept, used = [], 0
    for output in outputs:
        size = len(json.dumps(output))
        if used + size > MAX_OUTPUT_CHARS:
            kept.append({"output_type": "stream", "name": "stderr", "text": f"[the cell's outputs past "
                         f"{MAX_OUTPUT_CHARS:,} characters were cut: {len(outputs) - len(kept)} more outputs]\n"})
            break
        kept.append(output)
        used += size
    return kept
