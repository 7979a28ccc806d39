"""A judge kept warm: one process per grader that imports torch, the engine and the checks once, and
forks a fresh judge for each notebook, so a notebook does not pay for those imports again.

The warm process runs no cell of any notebook and never holds a key: each fork gets its descriptors (the
grader's command and result pipes, its end of the host's socket, its socket for asking the grader for a
kernel process) over a Unix socket, and its key and plan afterwards, on the command pipe, as a judge
started on its own would. A fork is the warm process as it was before the fork: what one notebook's judge
did stays in that fork.

Where bubblewrap works the warm process runs in a sandbox of its own (`confine`, from
engine.course.grading.sandbox.confine): nobody, the grader's engine and the libraries read-only, no course, no
network, its own PID namespace and tmpfs. Each fork works in a folder of its own there, and is not
dumpable (PR_SET_DUMPABLE 0): another judge of the same warm process (the same user, the same sandbox)
cannot ptrace it, read its memory or open its descriptors.

The grader (engine.course.grading.kernel.SealedKernel) asks `judge(...)` for a judge; `None` means it starts one
the plain way (a system without pidfd, a warm process that died).

Nothing outlives the grader: the warm process dies with it (PR_SET_PDEATHSIG, set by its command line;
it is started from `lasting`, a thread that lasts as long as the grader, since that signal follows the
thread that started the process), and each judge dies with the warm process (the same signal, set in
the fork).
"""
from __future__ import annotations

import json
import os
import queue
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading

# What every judge imports, done once in the warm process (a plan's `preimport` is added as it comes).
WARM_IMPORTS = ("torch", "engine.course.grading.sealed.judge", "engine.checks", "engine.course.grading.sandbox")

_WARM: dict = {}
_WARM_LOCK = threading.Lock()


class Forked:
    """A judge forked by the warm process, with what SealedKernel uses of a Popen: pid, poll, wait. It is
    followed through a pidfd (the warm process is its parent and reaps it), so its pid is never reused
    while this object says it runs."""

    def __init__(self, pid: int, pidfd: int):
        self.pid, self.pidfd, self.returncode = _own_pid(pidfd, pid), pidfd, None

    def poll(self):
        if self.returncode is None and select.select([self.pidfd], [], [], 0)[0]:
            self._ended()
        return self.returncode

    def wait(self, timeout: float | None = None):
        if self.returncode is None:
            if not select.select([self.pidfd], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired("judge", timeout)
            self._ended()
        return self.returncode

    def _ended(self) -> None:
        os.close(self.pidfd)
        self.returncode = 0    # its exit status belongs to the warm process; the grader reads only the end


def _own_pid(pidfd: int, pid: int) -> int:
    """The judge's pid as this process sees it (the warm process may see it in a PID namespace of its
    own): the pidfd's Pid line, which Linux gives in the reader's namespace; `pid` where it has none."""
    try:
        with open(f"/proc/self/fdinfo/{pidfd}") as info:
            for line in info:
                if line.startswith("Pid:"):
                    found = int(line.split()[1])
                    return found if found > 0 else pid
    except (OSError, ValueError, IndexError):
        pass
    return pid


_STARTS: queue.SimpleQueue = queue.SimpleQueue()
_LASTING: list = []              # the one thread that starts this grader's long-lived processes
_LASTING_LOCK = threading.Lock()


def lasting(start):
    """`start()` run in a thread that lasts as long as this grader (a daemon thread, started once): a
    process it starts with PR_SET_PDEATHSIG dies with the grader, not with the job's thread that first
    asked for it (a thread pool's thread may end while the warm process still serves others)."""
    with _LASTING_LOCK:
        if not _LASTING or not _LASTING[0].is_alive():
            _LASTING[:] = [threading.Thread(target=_starter, name="paged-kv-lasting", daemon=True)]
            _LASTING[0].start()
    answer: queue.SimpleQueue = queue.SimpleQueue()
    _STARTS.put((start, answer))
    ok, value = answer.get()
    if not ok:
        raise value
    return value


def _starter() -> None:
    while True:
        start, answer = _STARTS.get()
        try:
            answer.put((True, start()))
        except BaseException as error:  # noqa: BLE001 - handed to the caller, raised there
            answer.put((False, error))


class Warm:
    """The warm process of one grader, for one environment: started on the first request."""

    def __init__(self, argv: list[str], env: dict | None, confine=None):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        command = argv + [str(theirs.fileno())]
        if confine is not None:
            command = confine(command) or command
        try:
            self.process = lasting(lambda: subprocess.Popen(
                command, env=env, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.sock, self.lock = ours, threading.Lock()

    def fork(self, fds: tuple[int, ...], cwd: str | None, env: dict | None, preimport: list[str],
             timeout: float) -> Forked | None:
        """A judge on the descriptors, in `cwd` (None: a fresh folder of its own) with `env`; None when the
        warm process did not answer."""
        request = json.dumps({"cwd": cwd, "env": env, "preimport": list(preimport)}).encode()
        with self.lock:
            try:
                self.sock.settimeout(timeout)
                socket.send_fds(self.sock, [request], list(fds))
                reply, got, _, _ = socket.recv_fds(self.sock, 1024, 1)
            except OSError:
                return None
        try:
            pid = json.loads(reply or b"{}").get("pid")
        except ValueError:
            pid = None
        if not isinstance(pid, int) or len(got) != 1:
            for fd in got:
                os.close(fd)
            return None
        return Forked(pid, got[0])

    def close(self) -> None:
        self.sock.close()
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


def judge(argv: list[str], fds: tuple[int, ...], cwd: str | None, env: dict | None, preimport: list[str],
          timeout: float = 120, confine=None) -> Forked | None:
    """A judge forked from this grader's warm process for `env` (started with `argv` on first use, through
    `confine(argv)` where given: its sandbox), or None."""
    if not hasattr(os, "pidfd_open") or not hasattr(socket, "send_fds"):
        return None
    key = (tuple(argv), tuple(sorted((env or {}).items())), confine is not None)
    with _WARM_LOCK:
        warm = _WARM.get(key)
        if warm is not None and warm.process.poll() is not None:
            warm.close()
            warm = None
        if warm is None:
            try:
                warm = _WARM[key] = Warm(argv, env, confine)
            except OSError:
                return None
    forked = warm.fork(fds, cwd, env, preimport, timeout)
    if forked is None:
        with _WARM_LOCK:
            if _WARM.get(key) is warm:
                del _WARM[key]
        warm.close()
    return forked


def close_all() -> None:
    """End every warm process of this grader (at exit; a warm process also ends when its grader does)."""
    with _WARM_LOCK:
        for warm in _WARM.values():
            warm.close()
        _WARM.clear()


def main() -> None:
    """The warm process: import once, then fork a judge for each request until the grader hangs up."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    control = socket.socket(fileno=int(sys.argv[-1]))
    folders: dict = {}                    # pid -> the folder this warm process made for that judge
    os.environ.setdefault("MPLBACKEND", "Agg")
    _imports(WARM_IMPORTS)
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(control, 1 << 16, 4)
        except OSError:
            return
        if not message:
            return
        request = json.loads(message)
        _imports(request.get("preimport", []))
        _tidy(folders)
        if request.get("cwd") is None:        # in the sandbox: a folder of its own on the sandbox's tmpfs
            request["cwd"] = tempfile.mkdtemp(prefix="judge-")
        warm = os.getpid()
        pid = os.fork()
        if pid == 0:
            _become_judge(control, fds, request, warm)
        if request["cwd"].startswith(tempfile.gettempdir() + os.sep + "judge-"):
            folders[pid] = request["cwd"]
        for fd in fds:
            os.close(fd)
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            control.sendall(json.dumps({"pid": None}).encode())
            continue
        socket.send_fds(control, [json.dumps({"pid": pid}).encode()], [pidfd])
        os.close(pidfd)
        from engine.course.grading.sealed.remote import reap_children
        reap_children()


def _become_judge(control: socket.socket, fds: list[int], request: dict, warm: int) -> None:
    """In the fork: a judge of its own session, folder and environment, on the descriptors it was sent;
    killed when the warm process ends (so when the grader does)."""
    try:
        from engine.course.grading.sandbox import die_with_parent, not_dumpable   # imported in the warm process
        die_with_parent()
        not_dumpable()
        if os.getppid() != warm:          # the warm process ended before the line above
            os._exit(0)
        control.close()
        os.setsid()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request.get("env") or {})
        import random
        random.seed()                       # not the warm process's sequence: a fresh one, as a new process has
        from engine.course.grading.sealed import judge as judge_module
        judge_module.serve(*fds)
    except BaseException:  # noqa: BLE001 - a judge that cannot start ends; the grader sees it gone
        pass
    os._exit(0)


def _tidy(folders: dict) -> None:
    """Remove the folders of judges that ended (the warm process reaps them: their pids are gone)."""
    import shutil
    for pid in [p for p in folders if not os.path.exists(f"/proc/{p}")]:
        shutil.rmtree(folders.pop(pid), ignore_errors=True)


def _imports(modules) -> None:
    for module in modules:
        try:
            __import__(module)
        except Exception:  # a broken import fails in the judge, with its own message
            pass
