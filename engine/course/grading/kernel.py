"""The grader's side of a sealed run: one notebook, run cell by cell in two processes (SealedKernel).

`run_cell` never hangs and never raises for the learner's sake: an error comes back as the cell's
outputs, a cell past its time is stopped (a CellTimeoutError output, as nbgrader writes it), and a host
that died (os._exit, a segfault) or stopped answering is reported so the caller can `restart` both
processes and replay what the later cells need.
"""
from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from nbformat import NotebookNode


def parse_one_at_a_time() -> None:
    """Make `ast.parse` in this process take a lock (once; calling it again changes nothing).

    CPython 3.11 counts the AST constructor's recursion in one place for the whole interpreter: when
    two of the grader's threads (make grade's and make autograde's jobs) parse at once, and a garbage
    collection in the middle of one parse runs a finalizer that hands the interpreter to the other, the
    count goes wrong and the parse fails with "SystemError: AST constructor recursion depth mismatch"
    (python/cpython#106905), more often on a busy machine. One parse at a time cannot race."""
    import ast
    import threading
    if getattr(ast.parse, "_one_at_a_time", False):
        return
    lock, parse = threading.RLock(), ast.parse

    def locked_parse(*args, **kwargs):
        with lock:
            return parse(*args, **kwargs)
    locked_parse._one_at_a_time = True
    locked_parse.__doc__, locked_parse.__wrapped__ = parse.__doc__, parse
    ast.parse = locked_parse


parse_one_at_a_time()    # the grader's threads parse cells (cells_to_run, the judge's plan, the flags)

INTERRUPT_GRACE_S = 5.0  # how long an interrupted cell may take to stop before both are restarted
BACKSTOP_FACTOR = 30     # a sealed cell's judge may take this many times the cell's limit (it keeps the limit)


@dataclass
class CellRun:
    """What running one cell did. status: ok | error | timeout | dead; usable: the kernel still works."""

    status: str
    outputs: list = field(default_factory=list)
    usable: bool = True


def _error(ename: str, evalue: str) -> NotebookNode:
    """An error output, as the kernel would have written it."""
    return NotebookNode(output_type="error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"])


# The folder the grader's own `engine` package is imported from: the judge imports that one and nothing
# from its working folder, the environment's PYTHON* variables or the user's site-packages (python -I).
ENGINE_HOME = str(Path(__file__).resolve().parents[3])


# The first statement of every grading process's command line: Linux kills the process (SIGKILL) when the
# thread that started it ends (PR_SET_PDEATHSIG), so a grader killed with SIGKILL leaves none running.
DIE_WITH_PARENT = "sys.platform.startswith('linux') and __import__('ctypes').CDLL(None).prctl(1, 9); "
# ... and of the judge's (and the warm process's): no process of the same user may ptrace it, read its memory
# or open its descriptors through /proc (PR_SET_DUMPABLE 0; a fork keeps it, an exec would not).
NOT_DUMPABLE = "sys.platform.startswith('linux') and __import__('ctypes').CDLL(None).prctl(4, 0); "


def worker_argv(code: str, home: str = ENGINE_HOME) -> list[str]:
    """The command line of the judge running `code`: isolated Python, the engine of `home` first; it
    dies with the thread that started it and is not dumpable."""
    import sys
    return [sys.executable, "-I", "-c",
            f"import sys; {DIE_WITH_PARENT}{NOT_DUMPABLE}sys.path.insert(0, {home!r}); {code}"]


def library_paths() -> list[str]:
    """The standard library and the environment's site-packages: the only folders, besides its engine's,
    on the host's Python path. Not `site` (python -S): its .pth files would install the editable finder
    that leads back into the repository."""
    import sys
    import sysconfig
    places = [p for p in sys.path if p and p.startswith((sys.base_prefix, sys.base_exec_prefix))
              and "site-packages" not in p]
    for key in ("purelib", "platlib"):
        path = sysconfig.get_path(key)
        if path not in places:
            places.append(path)
    return places


def host_argv(code: str, home: str) -> list[str]:
    """The host's command line: isolated Python without `site`, on a path of `home` and the libraries;
    it dies with the thread that started it (in the sandbox: with the sandbox, which dies with it)."""
    import sys
    path = [home, *library_paths()]
    return [sys.executable, "-I", "-S", "-c", f"import sys; {DIE_WITH_PARENT}sys.path[:] = {path!r}; {code}"]


def kernel_argv() -> list[str]:
    """The kernel process's command line: isolated Python without `site` on the libraries alone, running
    engine.course.grading.sealed.kernel_runner's text (no file of the course is on its path or opened by
    it); it dies with the thread that started it."""
    import sys

    from engine.course.grading.sealed import kernel_runner
    code = (f"import sys; {DIE_WITH_PARENT}sys.path[:] = {library_paths()!r}\n"
            + Path(kernel_runner.__file__).read_text())
    return [sys.executable, "-I", "-S", "-c", code]


def private_copy(home: str) -> str:
    """A copy of the host engine `home`/engine in a fresh temporary folder outside the repository, so that
    no path the host can see leads back to the course's files."""
    import shutil
    import tempfile
    folder = tempfile.mkdtemp(prefix="paged-kv-host-")
    shutil.copytree(Path(home) / "engine", Path(folder) / "engine", symlinks=False)
    for root, dirs, files in os.walk(folder):
        os.chmod(root, 0o755)
        for name in files:
            os.chmod(os.path.join(root, name), 0o644)
    return folder


ENDED = ("the process running the notebook ended during this cell (for example os._exit, sys.exit in a thread, "
         "or a crash); it was restarted")


_WARM_EXIT: list = []      # the atexit hook that ends the warm judges, once registered


class SealedKernel:
    """The host (engine.course.grading.sealed.host: the notebook's cells) and the judge
    (engine.course.grading.sealed.judge: the graded tests and the key) as one kernel: cells in, signed
    results out.

    `plan` is engine.course.authoring.exercises.Plan.for_worker() (plus the chapter cells the judge runs itself);
    `wrap` (optional) turns the host's command line into a sandboxed one (engine.course.grading.sandbox);
    `host_home` is the folder of the engine the host imports (engine.course.authoring.edition.host_engine).
    Results are accepted only when signed with the key this object sent the judge and numbered in order.
    `warm`: the judge is forked from a process that imported the grader's engine once (sealed/warm.py).
    """

    def __init__(self, plan: dict, cwd: Path, env: dict | None = None, wrap=None, startup_timeout: float = 180,
                 host_home: str | None = None, warm: bool = True):
        self.plan, self.cwd, self.env, self.wrap, self.warm = plan, Path(cwd), env, wrap, warm
        self.startup_timeout = startup_timeout
        self.process = self.host = None
        self.kernel_socket = self.kernel_process = None   # the judge's requests for a kernel process; the one it has
        self.host_home = host_home or ENGINE_HOME
        self.host_copy: str | None = None    # private_copy(host_home), made on entry, removed on exit
        self.tampered_channel = False

    def __enter__(self) -> "SealedKernel":
        self.host_copy = private_copy(self.host_home)
        try:
            self.start()
        except BaseException:
            self._remove_copy()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
        self._remove_copy()

    def _remove_copy(self) -> None:
        import shutil
        if self.host_copy:
            shutil.rmtree(self.host_copy, ignore_errors=True)
            self.host_copy = None

    def start(self) -> None:
        """The host (the notebook's cells; in the sandbox when `wrap` is given) and the judge (the tests
        and the key; in a sandbox of its own where bubblewrap works: engine.course.grading.sandbox.confine),
        joined by a socket; the judge's signed results come back here, and its requests for a kernel
        process on a socket of their own (`_kernel_request`)."""
        import os
        import secrets
        import socket
        import tempfile
        self.key = secrets.token_bytes(32)
        self.kernel_process = None
        judge_end, host_end = socket.socketpair()
        host_argv = self._host_command("from engine.course.grading.sealed.host import main; main()",
                                       str(host_end.fileno()))
        self.host = subprocess.Popen(host_argv, cwd=str(self.cwd), env=self.env, pass_fds=(host_end.fileno(),),
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        host_end.close()
        command_read, command_write = os.pipe()
        result_read, result_write = os.pipe()
        self.kernel_socket, kernel_end = socket.socketpair()
        self.judge_dir = tempfile.mkdtemp(prefix="paged-kv-judge-")
        fds = (command_read, result_write, judge_end.fileno(), kernel_end.fileno())
        self.process = self._warm_judge(fds) if self.warm else None
        if self.process is None:
            argv = worker_argv("from engine.course.grading.sealed.judge import main; main()") + [str(fd) for fd in fds]
            self.process = subprocess.Popen(self._confined(argv) or argv, cwd=self.judge_dir, env=self.env,
                                            pass_fds=fds, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL, start_new_session=True)
        judge_end.close()
        kernel_end.close()
        os.close(command_read)
        os.close(result_write)
        self.commands = os.fdopen(command_write, "w", encoding="utf-8")
        self.results_fd, self.buffer, self.scanned, self.seq = result_read, bytearray(), 0, 0
        import json
        self._send(json.dumps(dict(self.plan, key=self.key.hex())))
        ready = self._receive(0, time.monotonic() + self.startup_timeout)
        if ready is None:
            self.stop()   # __exit__ will not run for a failed __enter__: close the pipes here
            raise RuntimeError(f"the sealed grading worker did not start{self._why_no_start()}")

    def _warm_judge(self, fds: tuple[int, ...]):
        """The judge forked from this grader's warm process (engine.course.grading.sealed.warm), None if it has none.
        The warm process is in a sandbox of its own where bubblewrap works; each fork then gets a folder
        of its own on the sandbox's tmpfs and the sandbox's environment."""
        import atexit

        from engine.course.grading.sandbox import available, judge_env
        from engine.course.grading.sealed import warm
        if not _WARM_EXIT:
            _WARM_EXIT.append(atexit.register(warm.close_all))
        confined = available()[0]
        return warm.judge(worker_argv("from engine.course.grading.sealed.warm import main; main()"), fds,
                          None if confined else self.judge_dir, judge_env(self.env) if confined else self.env,
                          self.plan.get("preimport", []), timeout=self.startup_timeout,
                          confine=self._confined if confined else None)

    def _confined(self, argv: list[str]) -> list[str] | None:
        """`argv` (the judge's or the warm process's command line) in the judge's sandbox: nobody, the
        grader's `engine` and the libraries read-only, nothing of the course; None without bubblewrap."""
        from engine.course.grading.sandbox import confine
        return confine(argv, [Path(ENGINE_HOME) / "engine"], self.env)

    def _host_command(self, code: str, *arguments: str) -> list[str]:
        """The host's command line: its engine first, in the sandbox when `wrap` is given."""
        if self.host_copy is None:
            self.host_copy = private_copy(self.host_home)
        argv = host_argv(code, self.host_copy) + list(arguments)
        if self.wrap is None:
            return argv
        # the host's environment (COURSE_EXPLORERS=static: explorers draw one state, not every one) is
        # the grader's choice inside the sandbox too
        return self.wrap(argv, self.cwd, readable=[Path(self.host_copy)], env=self.env)

    def _kernel_command(self) -> list[str] | None:
        """The kernel process's command line (engine.course.grading.sealed.kernel_runner), for a chapter with
        Triton kernels: isolated Python on the libraries alone, nothing of the course, in the sandbox
        when the host is; started here when the judge asks (`_kernel_request`). None for a chapter
        without kernels."""
        if not self.plan.get("kernels"):
            return None
        argv = kernel_argv()
        return argv if self.wrap is None else self.wrap(argv, self.cwd, readable=[], env=self.env)

    def _kernel_request(self) -> None:
        """The judge's request on its kernel socket: b"s", a fresh kernel process (its stdin and stdout
        go to the judge, SCM_RIGHTS; b"y", or b"n" where there is none); b"x", end the one it has. The
        grader starts it, not the judge: in the judge's sandbox the sandbox's launcher could not join the
        submission's cgroups. One at a time: a request ends the one before. Served while the grader
        waits for the judge (`_receive`), which is when the judge launches kernels."""
        import socket
        try:
            asked = self.kernel_socket.recv(1)
        except OSError:
            asked = b""
        self._end_kernel_process()
        if not asked:                     # the judge hung up: nothing more to serve
            self.kernel_socket.close()
            self.kernel_socket = None
            return
        if asked != b"s":
            return
        argv = self._kernel_command()
        process = None
        if argv is not None:
            try:
                process = subprocess.Popen(argv, cwd=str(self.cwd) if self.wrap is not None else self.judge_dir,
                                           env=self.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                           stderr=subprocess.DEVNULL, start_new_session=True)
            except OSError:
                process = None
        try:
            self.kernel_socket.settimeout(10)
            if process is None:
                self.kernel_socket.sendall(b"n")
            else:
                socket.send_fds(self.kernel_socket, [b"y"], [process.stdin.fileno(), process.stdout.fileno()])
        except OSError:
            pass
        if process is not None:
            process.stdin.close()
            process.stdout.close()
            self.kernel_process = process

    def _end_kernel_process(self) -> None:
        """Kill the kernel process (its process group: the sandbox's launcher and what it started)."""
        import os
        import signal
        process, self.kernel_process = getattr(self, "kernel_process", None), None
        if process is None:
            return
        if process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        process.wait()

    def _why_no_start(self) -> str:
        """What starting Python the same way says, for the message (only run once the worker failed)."""
        try:
            probe = subprocess.run(self._host_command("import engine.course.grading.sealed.host"), cwd=str(self.cwd),
                                   env=self.env, capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as error:
            return f": starting Python the same way failed too ({error})"
        said = (probe.stderr or probe.stdout).strip()[-600:]
        return (f": starting Python the same way exits {probe.returncode}: {said}" if probe.returncode
                else " (Python itself starts the same way: the worker stopped while reading its plan)")

    def stop(self) -> None:
        import os
        import shutil
        import signal
        if self.process is None:
            return
        try:
            self.commands.close()
        except OSError:
            pass
        for process in (self.process, self.host):
            if process is not None and process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            if process is not None:
                process.wait()
        self._end_kernel_process()
        if self.kernel_socket is not None:
            self.kernel_socket.close()
            self.kernel_socket = None
        os.close(self.results_fd)
        shutil.rmtree(self.judge_dir, ignore_errors=True)
        self.process = self.host = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def _send(self, line: str) -> bool:
        try:
            self.commands.write(line + "\n")
            self.commands.flush()
            return True
        except (BrokenPipeError, OSError):
            return False

    def _receive(self, seq: int, deadline: float):
        """The signed result numbered `seq`, None when the worker died or the deadline passed."""
        import hashlib
        import hmac
        import json
        import os
        import select
        while True:
            while (end := self.buffer.find(b"\n", self.scanned)) >= 0:
                line = bytes(self.buffer[:end])
                del self.buffer[:end + 1]
                self.scanned = 0
                body, _, signature = line.decode("utf-8", "replace").rpartition("\t")
                expected = hmac.new(self.key, body.encode(), hashlib.sha256).hexdigest()
                if not hmac.compare_digest(signature, expected):
                    self.tampered_channel = True
                    continue
                message = json.loads(body)
                if message.get("seq") == seq:
                    return message
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            self.scanned = len(self.buffer)       # no line ends before here: only new bytes are searched
            kernel = [self.kernel_socket] if self.kernel_socket is not None else []
            ready, _, _ = select.select([self.results_fd] + kernel, [], [], min(remaining, 0.5))
            if kernel and kernel[0] in ready:
                self._kernel_request()
                ready = [r for r in ready if r is not kernel[0]]
            if ready:
                chunk = os.read(self.results_fd, 1 << 20)
                if not chunk:
                    return None  # the worker is gone
                self.buffer += chunk
            elif self.process.poll() is not None and not self.buffer:
                return None

    def run_cell(self, source: str, kind: str, name: str | None, timeout: float, last: bool = False) -> CellRun:
        """Run one cell (kind: trusted | learner | test) for at most `timeout` seconds; `last`: a test's run
        after every cell of the notebook (engine.checks.LAST_RUN)."""
        import json
        import os
        import signal
        self.seq += 1
        if not self._send(json.dumps({"source": source, "kind": kind, "name": name, "timeout": timeout, "last": last})):
            return CellRun("dead", [_error("DeadKernelError", "the grading worker had exited before this cell; "
                                           "it was restarted")], usable=False)
        # The judge holds the cell's time (the host's CPU time, and a wall-clock backstop for its
        # answers): this wait is only for a judge that stopped answering itself.
        message = self._receive(self.seq, time.monotonic() + timeout * BACKSTOP_FACTOR)
        if message is None and self.process.poll() is None:
            try:
                os.killpg(self.host.pid, signal.SIGINT)   # a learner cell stops; a test cannot: both restart
            except ProcessLookupError:
                pass
            message = self._receive(self.seq, time.monotonic() + INTERRUPT_GRACE_S)
            stopped = message is not None
            return CellRun("timeout", [_error("CellTimeoutError", f"the cell ran longer than {timeout:g} s and was "
                                              "stopped" + ("" if stopped else "; the worker did not respond and "
                                                           "was restarted"))], usable=stopped)
        if message is None:
            why = "the notebook's code wrote to the grader's result channel" if self.tampered_channel else ENDED
            return CellRun("dead", [_error("DeadKernelError", why)], usable=False)
        outputs = [NotebookNode(output) for output in message["outputs"]]
        for output in outputs:
            if output.get("output_type") == "error":
                output["traceback"] = list(output.get("traceback", []))
        if message["status"] == "stuck":  # the host's answer came too late: both are started again
            return CellRun("timeout", outputs, usable=False)
        if message["status"] == "dead":   # the host ended during the cell: the judge stopped too
            return CellRun("dead", outputs + [_error("DeadKernelError", ENDED)], usable=False)
        status = {"ok": "ok", "interrupted": "timeout"}.get(message["status"], "error")
        run = CellRun(status, outputs)
        run.verdict = message.get("verdict", {})
        return run
