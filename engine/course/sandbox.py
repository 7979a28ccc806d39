"""Run a submission's grading worker inside bubblewrap: read-only system, its own folder, no network.

`Sandbox(workdir, hide=[...])` is a command-line wrapper for engine.course.kernel.SealedKernel. Inside:

- the whole file system is mounted read-only (the repository and the venv included), /tmp is a fresh
  empty tmpfs (a repository or venv that lives under /tmp is bound back into it, read-only), and every
  folder in `hide` (the course directory, the submissions, other students' homes, solutions/) is replaced
  by an empty tmpfs, so no other student's notebook can be read;
- the one writable place is `workdir`, the submission's own working folder (also HOME and the cwd);
- no network (a new network namespace with only a loopback that is down), a new PID namespace (other
  processes are invisible, and every process the submission starts dies with it), new IPC/UTS;
- bounded: address space per process (RLIMIT_AS), CPU seconds (RLIMIT_CPU), file size (RLIMIT_FSIZE),
  and the number of processes, through a pids cgroup where the machine offers one (cgroup v1 or v2,
  usually only as root); where it does not, `limits_note()` says the process count is not bounded.

Needs the `bwrap` command (Debian/Ubuntu: `apt-get install bubblewrap`); `available()` says whether it
runs here and why not.
"""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

CGROUP_V1 = Path("/sys/fs/cgroup/pids")
CGROUP_V2 = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class Limits:
    """What one submission's worker may use."""

    memory_mb: int = 6144        # address space per process (torch alone maps ~2 GB)
    cpu_seconds: int = 900       # CPU time per process
    file_mb: int = 256           # largest file it may write
    processes: int = 128         # processes and threads at once (pids cgroup)


@functools.lru_cache(maxsize=None)
def available() -> tuple[bool, str]:
    """(usable, why not): bwrap installed and able to build a namespace here."""
    bwrap = shutil.which("bwrap")
    if not bwrap:
        return False, ("bubblewrap is not installed (the `bwrap` command): submissions would run "
                       "unconfined; install it with `apt-get install bubblewrap`")
    probe = subprocess.run([bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-net",
                            "--unshare-pid", "--die-with-parent", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return False, f"bubblewrap cannot create a sandbox here: {probe.stderr.strip() or probe.returncode}"
    return True, ""


def _pids_cgroup_root() -> Path | None:
    if (CGROUP_V1 / "cgroup.procs").exists() and os.access(CGROUP_V1, os.W_OK):
        return CGROUP_V1
    controllers = CGROUP_V2 / "cgroup.controllers"
    if controllers.exists() and "pids" in controllers.read_text().split() and os.access(CGROUP_V2, os.W_OK):
        return CGROUP_V2
    return None


def _needed_under_tmp() -> list[Path]:
    """The folder `engine` is imported from and the Python installation, where under /tmp (outermost only).

    The package's folder, not repo_root(): it is what the worker imports, and it exists in an installed copy too.
    """
    tmp = Path("/tmp").resolve()
    places = {Path(__file__).resolve().parents[2], Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve()}
    inside = sorted(p for p in places if p.is_relative_to(tmp) and p != tmp)
    return [p for p in inside if not any(p != q and p.is_relative_to(q) for q in inside)]


def limits_note() -> str:
    """'' when every limit is enforced here, else what is not."""
    return "" if _pids_cgroup_root() else ("no writable pids cgroup here: the number of processes a "
                                           "submission starts is not bounded (run autograde as root, or "
                                           "on a machine with cgroup delegation)")


class Sandbox:
    """Wraps a worker's command line in bubblewrap; one per submission (close() removes its cgroup)."""

    def __init__(self, workdir: Path, hide: list[Path] = (), limits: Limits = Limits()):
        self.workdir = Path(workdir).resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.hide = [Path(p).resolve() for p in hide if Path(p).exists()]
        self.limits = limits
        self.cgroup = None
        root = _pids_cgroup_root()
        if root is not None:
            try:
                self.cgroup = root / f"paged-kv-grade-{uuid.uuid4().hex[:12]}"
                self.cgroup.mkdir()
                (self.cgroup / "pids.max").write_text(str(limits.processes))
            except OSError:
                self.cgroup = None

    def __call__(self, argv: list[str], cwd: Path) -> list[str]:
        ok, why = available()
        if not ok:
            raise RuntimeError(why)
        box = [shutil.which("bwrap"), "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
               "--tmpfs", "/tmp", "--tmpfs", "/dev/shm"]
        for path in _needed_under_tmp():  # a clone or venv in /tmp would vanish under the fresh tmpfs
            box += ["--ro-bind", str(path), str(path)]
        for path in self.hide:  # the working folder may sit inside one: it is bound again below
            box += ["--tmpfs", str(path)]
        box += ["--bind", str(self.workdir), str(self.workdir), "--chdir", str(self.workdir),
                "--setenv", "HOME", str(self.workdir), "--setenv", "TMPDIR", "/tmp",
                "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--die-with-parent", "--"]
        limits = self.limits
        prlimit = ["prlimit", f"--as={limits.memory_mb << 20}", f"--cpu={limits.cpu_seconds}",
                   f"--fsize={limits.file_mb << 20}", "--core=0", "--"] if shutil.which("prlimit") else []
        command = box + prlimit + argv
        if self.cgroup is not None:
            command = ["/bin/sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(self.cgroup)] + command
        return command

    def close(self) -> None:
        """Remove the pids cgroup (its processes are gone by now)."""
        if self.cgroup is None:
            return
        for _ in range(50):  # killed processes take a moment to leave the cgroup
            try:
                pids = (self.cgroup / "cgroup.procs").read_text().split()
                for pid in pids:
                    try:
                        os.kill(int(pid), 9)
                    except (ProcessLookupError, ValueError):
                        pass
                if not pids:
                    self.cgroup.rmdir()
                    break
            except FileNotFoundError:
                break
            except OSError:
                pass
            time.sleep(0.1)
        self.cgroup = None
