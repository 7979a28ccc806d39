"""The host: the process that runs a notebook's cells and holds the learner's objects for the judge.

`make grade` and nbgrader's autograde (through engine.course.grading.autograde_step.SealedExecute) run a
learner's notebook in two processes (engine.course.grading.kernel.SealedKernel). This one, the host, runs every
cell (in the sandbox: engine.course.grading.sandbox) and answers the requests of the judge
(engine.course.grading.sealed.judge), which runs the graded tests on the grader's own engine, decides from the
cells' text what may count, and signs the verdicts. The host holds no key and decides nothing: what it
can do to a score is answer the checks' questions. It imports its own copy of the chapter's host engine
(engine.course.authoring.edition.host_engine), whose taught bodies are stubs and whose checks hold only what the
chapter's own cells use (edition.host_checks), on a path with nothing else of the course
(engine.course.grading.kernel.host_argv).

Nothing in it refuses what learner code does: it holds nothing of value (no key, no answers, nothing of
the judge's), so a scratch cell may import, open, inspect and print what it likes. What confines it is
the sandbox around it. What it still does beside running cells:

- **CPU time.** A cell, and the host's answers during a test, may use the CPU seconds the judge grants
  (cpu_limit): a busy machine slows them down without making them need more.
"""
from __future__ import annotations

import builtins
import io
import os
import resource
import signal
import sys
import traceback
import types

from engine.course.cells import LEARNER_PREFIX, TRUSTED_PREFIX
from engine.course.grading.reading.names import named

MAX_STREAM_CHARS = 50_000        # per cell and stream: a flood of prints is cut, not shipped

# ----------------------------------------------------------------------------- running cells

class _Capture(io.TextIOBase):
    """A stream that keeps what is written (up to MAX_STREAM_CHARS)."""

    def __init__(self):
        self.parts, self.size = [], 0

    def write(self, text):
        text = str.__str__(text) if isinstance(text, str) else str(text)
        if self.size < MAX_STREAM_CHARS:
            self.parts.append(text[:MAX_STREAM_CHARS - self.size])
            self.size += len(text)
        return len(text)

    def writable(self):
        return True

    def text(self) -> str:
        value = "".join(self.parts)
        return value + ("\n[... output cut ...]\n" if self.size > MAX_STREAM_CHARS else "")


def _stream_outputs(out: _Capture, err: _Capture) -> list[dict]:
    """A cell's printed text as notebook stream outputs (nothing for a stream it did not write to)."""
    return [{"output_type": "stream", "name": name, "text": capture.text()}
            for name, capture in (("stdout", out), ("stderr", err)) if capture.text()]


def _error_output(exc: BaseException) -> dict:
    try:
        ename = type(exc).__name__
        said = str(exc)
        evalue = said or _memory_bound(exc)
        lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
        if evalue != said:                # the bound it met, on the traceback's last line too
            lines[-1] = f"{ename}: {evalue}\n"
    except BaseException as broken:  # an exception whose __str__ misbehaves
        ename, evalue, lines = type(exc).__name__, f"(its message could not be shown: {type(broken).__name__})", []
    return {"output_type": "error", "ename": str.__str__(ename)[:200], "evalue": _cut(str.__str__(evalue)),
            "traceback": [_cut(str.__str__(line), MAX_LINE_CHARS) for line in lines][-12:]}


MAX_LINE_CHARS = 4_000           # a traceback line (it quotes values)


def _memory_bound(exc: BaseException) -> str:
    """What a bare MemoryError met: the sandbox's bound on one process's data (RLIMIT_DATA), if it set one."""
    limit = resource.getrlimit(resource.RLIMIT_DATA)[0]
    if not isinstance(exc, MemoryError) or limit == resource.RLIM_INFINITY:
        return ""
    return f"the cell asked for more memory than the grader lets the notebook hold ({limit >> 20:,} MiB)"


def _cut(text: str, limit: int = MAX_STREAM_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + f" [... {len(text) - limit:,} more characters cut]"


def _prepare(plan: dict) -> None:
    """What the chapter's cells need, imported before any learner code runs (and recorded after)."""
    if plan.get("mpl_agg", True):
        os.environ.setdefault("MPLBACKEND", "Agg")
    import warnings
    warnings.filterwarnings("ignore", message=".*non-interactive.*")
    warnings.filterwarnings("ignore", message=".*FigureCanvasAgg.*")
    for module in plan.get("preimport", []):
        try:
            __import__(module)
        except Exception:  # a broken import fails later, in its cell, with its own message
            pass


class Host:
    """The notebook's namespace and what the judge asks of it: cells, names, and a test's start and end."""

    def __init__(self):
        main_module = types.ModuleType("__main__")  # the notebook's namespace, as in a kernel
        self.namespace = main_module.__dict__
        self.namespace["__builtins__"] = builtins
        sys.modules["__main__"] = main_module
        self.pid = os.getpid()

    def run_cell(self, source: str, kind: str, name: str, cpu: float | None = None) -> dict:
        """A learner's or a chapter's cell, in the notebook's namespace (at most `cpu` seconds of this
        process's CPU time): its outputs and status."""
        filename = f"{TRUSTED_PREFIX if kind == 'trusted' else LEARNER_PREFIX}{name}>"
        out, err = _Capture(), _Capture()
        status, error = "ok", None
        saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = out, err
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            code = compile(source, filename, "exec")     # parsed before the CPU timer is armed
            cpu_limit(cpu)
            try:
                exec(code, self.namespace)
            finally:
                cpu_limit(None)       # before the error is formatted (3.11's traceback parses source)
        except KeyboardInterrupt as exc:
            status, error = "interrupted", _error_output(exc)
        except BaseException as exc:  # SystemExit included: leaving early is a failed cell
            status, error = "error", _error_output(exc)
        finally:
            cpu_limit(None)
            if os.getpid() != self.pid:
                os._exit(0)  # a process the notebook forked, back in the host's loop: it may not speak
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            sys.stdout, sys.stderr = saved
            from engine.course.grading.sealed.remote import reap_children
            reap_children()
        outputs = _stream_outputs(out, err) + ([error] if error else [])
        if "matplotlib.pyplot" in sys.modules:
            try:
                sys.modules["matplotlib.pyplot"].close("all")
            except Exception:
                pass
        return {"status": status, "outputs": outputs}

    def begin_test(self, cpu: float | None = None) -> dict:
        """Before the judge runs a test: the test's CPU time starts."""
        cpu_limit(cpu)
        return {}

    def end_test(self) -> dict:
        """After the test: its CPU time stops."""
        cpu_limit(None)
        return {}

    def serve(self, op, target, args, kwargs):
        if op == "cell":
            return self.run_cell(*args)
        if op == "lookup":
            return {n: self.namespace[n] for n in args[0] if n in self.namespace}
        if op == "begin_test":
            return self.begin_test(*args)
        if op == "end_test":
            return self.end_test()
        if op == "call_engine":          # a check's helper that runs where the learner's objects are: the
            module_name, qualname, *rest = args      # host's own copy, so what it returns is the host's word
            return named(module_name, qualname)(*rest, **kwargs)
        raise ValueError(f"unknown operation {op!r}")


def main() -> None:
    """Host one notebook: read the plan from the judge, then run cells and answer its requests."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the grader interrupts cells, never the host itself
    import socket
    from engine.course.grading.sealed.remote import Channel, RemoteGone
    channel = Channel(socket.socket(fileno=int(sys.argv[1])), "L")
    try:
        plan = channel._receive()["plan"]
    except (RemoteGone, KeyError, TypeError):
        return
    signal.signal(signal.SIGPROF, _out_of_cpu)
    _prepare(plan)
    host = Host()
    channel.serve = host.serve
    channel._send({"ready": True})
    while True:
        try:
            message = channel._receive()
        except RemoteGone:
            return
        channel.answer(message)


def cpu_limit(seconds: float | None) -> None:
    """Stop this process's code (TimeoutError) once it has used `seconds` more of CPU time, all its
    threads together (None: no limit). CPU time, not the wall clock: a busy machine slows a cell down
    but does not make it need more CPU time."""
    signal.setitimer(signal.ITIMER_PROF, seconds if seconds else 0)
    _CPU_LIMIT[0] = seconds


_CPU_LIMIT = [None]


def _out_of_cpu(signum, frame) -> None:
    signal.setitimer(signal.ITIMER_PROF, 0)
    raise TimeoutError(f"the cell used more than its {_CPU_LIMIT[0] or 0:g} s of CPU time and was stopped")


if __name__ == "__main__":
    main()
