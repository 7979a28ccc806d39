"""Run one submission's process tree inside bubblewrap, as an unprivileged user with bounded resources.

`Sandbox(workdir, hide=[...], limits=Limits())` wraps ONE command line (`sandbox(argv, cwd) -> argv`);
the grader passes it as `wrap=` to the process it starts for a submission. Inside:

- **Nobody, with nothing.** The tree runs as uid/gid 65534 with no capabilities (none permitted,
  effective, inheritable, ambient or in the bounding set; no_new_privs), in new mount, PID, network,
  IPC, UTS and cgroup namespaces. Under root, bubblewrap builds the sandbox as root (so it can bind the
  Python installation wherever it lives, /root included) and util-linux's `setpriv` then drops to
  uid 65534: on the host too the processes belong to nobody. Not as root, bubblewrap maps uid 65534 in a
  user namespace onto the caller's uid and forbids further user namespaces. (Where root lacks setpriv
  or bwrap 0.8, it falls back to that user namespace, uid 0 on the host without capabilities, and
  limits_note() says so.)
- **Sees only what it needs, read-only.** The file system is built up from nothing: /usr, /etc and the
  other system folders, the Python installation, the virtual environment and the host's own copy of its
  engine (never the repository's), all read-only, plus a /proc of its own and a minimal /dev. The course
  directory, the submissions, every student's results, /run, /sys, /home and /root are not there at all
  (nothing is hidden behind a layer that could be lifted); folders in `hide` that lie inside what is
  bound are covered by empty folders.
- **Writes only to its own folders, with a quota.** Its working folder (/home/learner: the cwd and
  HOME), /tmp and /dev/shm are size-limited tmpfs made fresh for each start, inside the sandbox: nothing
  written there reaches the host, and the grader trusts nothing from them (results travel on the
  grader's pipes).
- **One memory limit and one process limit for the whole submission**, through a cgroup (v1 memory and
  pids controllers, or v2), which it cannot leave: no cgroup file system is mounted inside, and the
  cgroup files belong to root. Where no cgroup can be made, the memory limit falls back to an
  address-space limit per process and limits_note() says what is not bounded.
- **A deadline for the whole notebook,** enforced from outside: `timeout` (outside the sandbox, parent
  of bubblewrap) kills the sandbox's PID namespace when the notebook's time is up, restarts included;
  after that `expired` is true and `expired_message` says "the notebook ran past its N s limit".
  Per-process CPU seconds, file size, data (no more than the whole submission's memory: a huge
  allocation is a MemoryError in its cell, not a process the OOM killer ends) and core dumps are
  bounded by rlimits.
- **Nothing outlives its grader.** The launcher asks Linux to kill it when the thread that started it
  ends (PR_SET_PDEATHSIG, kept through its exec of `timeout`), and bubblewrap's --die-with-parent kills
  the sandbox when `timeout` ends: a grader killed with SIGKILL takes the whole sandbox with it.

Needs `bwrap` 0.8 or later for the disk quota (Debian/Ubuntu: `apt-get install bubblewrap`);
`available()` says whether it runs here and why not.
"""
from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
DELEGATED = "paged-kv-grading"   # a v1 cgroup the instructors' group may make cgroups in (hub/setup.sh)
SANDBOX_UID = 65534                       # nobody
HOME_INSIDE = "/home/learner"             # the working folder inside the sandbox
SYSTEM = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc")
# What the grader's environment may pass on: the course's own switches and the locale; no secrets.
ENV_NAMES = {"PATH", "LANG", "LANGUAGE", "TZ", "PYTHONPATH", "MPLBACKEND"}
ENV_PREFIXES = ("LC_", "CUDA_", "TRITON_", "HF_", "TRANSFORMERS_", "OMP_", "MKL_", "OPENBLAS_", "NUMEXPR_",
                "COURSE_", "PYDEVD_", "TORCH", "PYTORCH_")


@dataclass(frozen=True)
class Limits:
    """What one submission may use, all its processes together."""

    memory_mb: int = 6144          # resident memory of the whole submission (memory cgroup); torch alone ~0.5 GB
    processes: int = 128           # processes and threads at once (pids cgroup)
    disk_mb: int = 512             # its working folder; /tmp gets as much again, /dev/shm 64 MB
    notebook_seconds: int = 1800   # wall clock for the whole notebook, restarts included
    cpu_seconds: int = 900         # CPU time per process
    file_mb: int = 256             # largest file it may write


# ----------------------------------------------------------------------------- what this machine offers

@functools.lru_cache(maxsize=None)
def _bwrap_features() -> frozenset:
    bwrap = shutil.which("bwrap")
    if not bwrap:
        return frozenset()
    help_text = subprocess.run([bwrap, "--help"], capture_output=True, text=True).stdout
    return frozenset(flag for flag in ("--size", "--disable-userns", "--perms", "--cap-drop", "--new-session")
                     if flag in help_text)


@functools.lru_cache(maxsize=None)
def _mode() -> tuple[str, str]:
    """(how bubblewrap is started, why not): "drop" (root: bubblewrap builds the sandbox as root, then
    setpriv drops to uid 65534 with no capabilities), "userns" (bubblewrap maps uid 65534 in a user
    namespace onto the caller's uid: under root that is uid 0 on the host, without capabilities), or ""
    with the reason it cannot run."""
    if not shutil.which("bwrap"):
        return "", ("bubblewrap is not installed (the `bwrap` command): submissions would run unconfined; "
                    "install it with `apt-get install bubblewrap`")
    tried = []
    modes = ("drop", "userns") if os.geteuid() == 0 else ("userns",)
    for mode in modes:
        if mode == "drop" and not (Path("/usr/bin/setpriv").is_file() and "--perms" in _bwrap_features()):
            tried.append("drop: needs /usr/bin/setpriv (util-linux) and bwrap 0.8's --perms")
            continue
        binds = [Path("/") / name for name in SYSTEM if (Path("/") / name).exists()]
        probe = _command(mode, binds, [], [], "/", {}, None, ["true"], quota=1)
        try:
            result = subprocess.run(probe, capture_output=True, text=True, timeout=60, cwd="/")
        except (OSError, subprocess.TimeoutExpired) as error:
            tried.append(f"{mode}: {error}")
            continue
        if result.returncode == 0:
            return mode, ""
        tried.append(f"{mode}: {(result.stderr or result.stdout).strip()[-300:] or result.returncode}")
    return "", "bubblewrap cannot create a sandbox here: " + "; ".join(tried)


def available() -> tuple[bool, str]:
    """(usable, why not): bwrap installed and able to build the sandbox here."""
    mode, why = _mode()
    return bool(mode), why


def _own_cgroup(controller: str) -> str | None:
    """This process's cgroup path in a v1 hierarchy with `controller` ("" for v2's unified line)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, names, path = line.split(":", 2)
        if (controller and controller in names.split(",")) or (not controller and not names and line.startswith("0:")):
            return path
    return None


def _cgroup_parents() -> dict[str, Path]:
    """{controller: the folder a submission's cgroup is made in} for memory and pids, where writable."""
    found = {}
    v2 = (CGROUP_ROOT / "cgroup.controllers").is_file()
    for controller in ("memory", "pids"):
        if v2:
            own = _own_cgroup("")
            for parent in ([CGROUP_ROOT / own.lstrip("/")] if own else []) + [CGROUP_ROOT]:
                enabled = (parent / "cgroup.subtree_control")
                if enabled.is_file() and os.access(parent, os.W_OK) and (
                        controller in enabled.read_text().split() or _enable(enabled, controller)):
                    found[controller] = parent
                    break
        else:   # this process's own cgroup, else the one delegated to the grading accounts
            root, own = CGROUP_ROOT / controller, _own_cgroup(controller)
            if (root / "cgroup.procs").is_file() and own is not None:
                for parent in (root / own.lstrip("/"), root / DELEGATED):
                    if parent.is_dir() and os.access(parent, os.W_OK | os.X_OK):
                        found[controller] = parent
                        break
    return found


def _tasks_of(uid: int) -> int:
    """How many processes and threads the account runs now (what RLIMIT_NPROC counts)."""
    count = 0
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":", 1) for line in status.read_text().splitlines() if ":" in line)
            if int(fields["Uid"].split()[0]) == uid:
                count += int(fields["Threads"])
        except (OSError, KeyError, ValueError):
            continue
    return count


def _enable(subtree_control: Path, controller: str) -> bool:
    """Turn a v2 controller on for a cgroup's children (refused while the cgroup itself holds processes)."""
    try:
        subtree_control.write_text(f"+{controller}")
        return True
    except OSError:
        return False


def limits_note() -> str:
    """'' when every limit and the unprivileged user are enforced here, else what is not (one sentence)."""
    mode, _ = _mode()
    missing = []
    if mode == "userns" and os.geteuid() == 0:
        missing.append("the submission runs as uid 0 on the host (in a user namespace, without capabilities): "
                       "install util-linux's setpriv and bwrap 0.8 to run it as nobody")
    parents = _cgroup_parents()
    if "memory" not in parents:
        missing.append("no writable memory cgroup: memory is bounded per process (address space), not for "
                       "the whole submission")
    if "pids" not in parents:
        missing.append("no writable pids cgroup: the processes a submission starts are bounded for its whole "
                       "account (RLIMIT_NPROC), not for the submission alone")
    if mode and "--size" not in _bwrap_features():
        missing.append("this bwrap has no --size (needs 0.8): the working folder has no disk quota")
    if not missing:
        return ""
    return "; ".join(missing) + (" (run autograde as root, or as an instructor after make hub-setup, which "
                                 f"delegates the {DELEGATED} cgroups, or on a machine with cgroup delegation)")


# ----------------------------------------------------------------------------- the command line

def _outermost(paths) -> list[Path]:
    paths = sorted({Path(p) for p in paths})
    return [p for p in paths if not any(p != q and p.is_relative_to(q) for q in paths)]


def _python_paths() -> list[Path]:
    """The Python installation and the environment, as the host will open them (and where symbolic links
    lead), outside the system folders that are bound anyway. Not the grader's `engine`: the host gets
    its own copy (`readable`, engine.course.grading.kernel.private_copy)."""
    places = {sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        places.add(sysconfig.get_path(key))
    executable = Path(sys.executable)
    places.add(str(executable.parent))
    places.add(str(executable.resolve().parent.parent))
    found = set()
    for place in places:
        if place and Path(place).exists():
            found.update({Path(place).absolute(), Path(place).resolve()})
    system = [Path("/") / name for name in SYSTEM]
    return [p for p in _outermost(found) if p != Path("/") and not any(p.is_relative_to(s) for s in system)]


def _command(mode: str, binds: list[Path], hide: list[Path], cgroups: list[Path], cwd: str, env: dict,
             seconds: float | None, argv: list[str], quota: int, limits: Limits | None = None,
             home: str = HOME_INSIDE) -> list[str]:
    """launcher (outside: join the cgroups, set rlimits) + timeout + bwrap (+ setpriv, inside) + argv."""
    features = _bwrap_features()
    perms = (lambda octal: ["--perms", octal]) if "--perms" in features else (lambda octal: [])
    sized = (lambda mb: ["--size", str(mb << 20)]) if "--size" in features else (lambda mb: [])
    if mode == "drop":   # no user namespace: root builds it, setpriv (below) leaves nobody without capabilities
        box = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
               "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP"]
        argv = ["/usr/bin/setpriv", f"--reuid={SANDBOX_UID}", f"--regid={SANDBOX_UID}", "--clear-groups",
                "--bounding-set=-all", "--inh-caps=-all", "--no-new-privs", "--", *argv]
    else:
        box = ["--unshare-all", "--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID)]
        box += ["--disable-userns"] if "--disable-userns" in features else []
        box += ["--cap-drop", "ALL"] if "--cap-drop" in features else []
    box += ["--hostname", "sandbox", "--die-with-parent"] + (["--new-session"] if "--new-session" in features else [])
    box += [*perms("1777"), *sized(quota), "--tmpfs", "/tmp"]   # first: binds that live under /tmp go on top
    made = {Path("/"), Path("/tmp")}
    for path in binds:   # the folders above each bind, readable by all (bwrap would make them 0700)
        for parent in reversed(path.parents):
            if parent not in made and not (parent.parent == Path("/") and parent.name in SYSTEM):
                box += [*perms("0755"), "--dir", str(parent)]
                made.add(parent)
    for path in binds:
        if path.parent == Path("/") and path.name in SYSTEM and path.is_symlink():
            box += ["--symlink", os.readlink(path), str(path)]
        else:
            box += ["--ro-bind", str(path), str(path)]
    box += ["--proc", "/proc", "--dev", "/dev"]
    box += [*perms("1777"), *sized(64), "--tmpfs", "/dev/shm", *perms("0777"), *sized(quota), "--tmpfs", home]
    for path in hide:
        box += ["--tmpfs", str(path)]
    box += ["--remount-ro", "/", "--chdir", cwd, "--clearenv"]
    for name, value in env.items():
        box += ["--setenv", name, value]
    command = [shutil.which("bwrap"), *box, "--", *argv]
    if seconds is not None and shutil.which("timeout"):
        command = [shutil.which("timeout"), "--signal=KILL", f"{max(seconds, 0.1):.1f}", *command]
    rlimits = {"RLIMIT_CORE": 0}
    if limits is not None:
        rlimits.update(RLIMIT_CPU=limits.cpu_seconds, RLIMIT_FSIZE=limits.file_mb << 20)
        if not cuda_driver():
            # One process asking for more than the whole submission may hold gets a MemoryError at once,
            # in its own cell, instead of filling the memory cgroup until the kernel's OOM killer ends it.
            rlimits["RLIMIT_DATA"] = limits.memory_mb << 20
        if not any((c / "memory.max").exists() or (c / "memory.limit_in_bytes").exists() for c in cgroups):
            rlimits["RLIMIT_AS"] = limits.memory_mb << 20   # no memory cgroup: bounded per process at least
        if not any((c / "pids.max").exists() for c in cgroups):   # no pids cgroup: for the account it runs as
            uid = SANDBOX_UID if mode == "drop" else os.getuid()
            rlimits["RLIMIT_NPROC"] = limits.processes + _tasks_of(uid)
    spec = {"cgroups": [str(c / "cgroup.procs") for c in cgroups], "rlimits": rlimits, "argv": command}
    return [sys.executable, "-I", "-S", str(Path(__file__).resolve()), "--launch", json.dumps(spec)]


def cuda_driver() -> bool:
    """Whether an NVIDIA driver is present: CUDA maps large private regions of its own, so a process there
    gets no bound on its data (RLIMIT_DATA)."""
    return os.path.exists("/dev/nvidiactl")


def _sandbox_env(env: dict | None) -> dict:
    """The environment inside: the course's switches from the grader's, and the sandbox's own home."""
    source = os.environ if env is None else env
    kept = {k: v for k, v in source.items() if k in ENV_NAMES or k.startswith(ENV_PREFIXES)}
    return dict(kept, HOME=HOME_INSIDE, TMPDIR="/tmp", USER="learner", LOGNAME="learner",
                MPLCONFIGDIR=f"{HOME_INSIDE}/.config/matplotlib")


JUDGE_HOME = "/home/judge"                # the judge's working folder inside its own sandbox
JUDGE_DISK_MB = 256                       # its working folder and /tmp (it writes nothing it keeps)


def judge_env(env: dict | None) -> dict:
    """The judge's environment in its sandbox: the course's switches from `env` (else this process's),
    its own home; what the grader's environment holds besides (secrets included) stays outside."""
    return dict(_sandbox_env(env), HOME=JUDGE_HOME, USER="judge", LOGNAME="judge",
                MPLCONFIGDIR=f"{JUDGE_HOME}/.config/matplotlib")


def confine(argv: list[str], readable: list[Path], env: dict | None) -> list[str] | None:
    """The grader's own process `argv` (the judge, or the warm process that forks judges) in a sandbox of
    its own, or None where bubblewrap cannot run here (the caller then starts `argv` as it is).

    Inside: as the submission's sandbox, nobody (uid 65534: `setpriv` under root, else a user namespace),
    no capabilities, no network, its own PID, IPC, UTS and mount namespaces, a fresh tmpfs for its
    working folder (JUDGE_HOME), /tmp and /dev/shm, and read-only only the system, the Python
    installation and `readable` (the grader's `engine`): no course folder, no results, no submission.
    It dies with the thread that started it (the launcher's PR_SET_PDEATHSIG, bubblewrap's
    --die-with-parent). Unlike a submission it joins no cgroup and has no deadline: the grader bounds
    its time, and inside it the launcher could not join a cgroup anyway. Descriptors the caller passes
    (pass_fds) reach `argv` as they are."""
    mode, _ = _mode()
    if not mode:
        return None
    binds = [Path("/") / name for name in SYSTEM if (Path("/") / name).exists()] + _python_paths()
    cpu = Path("/sys/devices/system/cpu")
    if cpu.is_dir():
        binds.append(cpu)
    binds += [Path(p).resolve() for p in readable]
    return _command(mode, binds, [], [], JUDGE_HOME, judge_env(env), None, list(argv), JUDGE_DISK_MB,
                    home=JUDGE_HOME)


class Sandbox:
    """Wraps a submission's command line in the sandbox; one per submission (close() kills what is left
    and removes its cgroups). The first call starts the notebook's clock."""

    def __init__(self, workdir: Path, hide: list[Path] = (), limits: Limits = Limits(), env: dict | None = None):
        self.workdir = Path(workdir).resolve()     # where the wrapped command starts, outside: never bound in
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.hide = [Path(p).resolve() for p in hide if Path(p).exists()]
        self.limits = limits
        self.env = env
        self.deadline: float | None = None
        self.cgroups: list[Path] = []
        name = f"paged-kv-grade-{uuid.uuid4().hex[:12]}"
        for controller, parent in _cgroup_parents().items():
            try:
                group = parent / name
                group.mkdir(exist_ok=True)
                if controller == "memory":
                    self._set_memory(group, limits.memory_mb << 20)
                else:
                    (group / "pids.max").write_text(str(limits.processes))
                if group not in self.cgroups:
                    self.cgroups.append(group)
            except OSError:
                pass

    @staticmethod
    def _set_memory(group: Path, limit: int) -> None:
        if (group / "memory.max").exists():          # v2
            (group / "memory.max").write_text(str(limit))
            if (group / "memory.swap.max").exists():
                (group / "memory.swap.max").write_text("0")
        else:                                        # v1: memory, then memory + swap (which must not be lower)
            (group / "memory.limit_in_bytes").write_text(str(limit))
            if (group / "memory.memsw.limit_in_bytes").exists():
                (group / "memory.memsw.limit_in_bytes").write_text(str(limit))

    @property
    def expired(self) -> bool:
        """Whether the notebook's time is up (its processes were or will be killed)."""
        return self.deadline is not None and time.monotonic() >= self.deadline

    @property
    def expired_message(self) -> str:
        return f"the notebook ran past its {self.limits.notebook_seconds:g} s limit"

    def __call__(self, argv: list[str], cwd: Path, readable: list[Path] = (), env: dict | None = None) -> list[str]:
        """The sandboxed command line of `argv`; the course's switches (COURSE_*, MPLBACKEND ...) come from
        `env` (the environment the grader starts the process with), else from the sandbox's own."""
        mode, why = _mode()
        if not mode:
            raise RuntimeError(why)
        if self.deadline is None:
            self.deadline = time.monotonic() + self.limits.notebook_seconds
        if self.expired:   # a restart after the deadline: say why instead of starting anything
            return ["/bin/sh", "-c", 'echo "$0" >&2; exit 124', self.expired_message]
        binds = [Path("/") / name for name in SYSTEM if (Path("/") / name).exists()] + _python_paths()
        cpu = Path("/sys/devices/system/cpu")  # what torch reads to count cores (read-only, no secrets)
        if cpu.is_dir():
            binds.append(cpu)
        binds += [Path(p).resolve() for p in readable]     # the host's engine (engine.course.authoring.edition)
        hide = [h for h in self.hide if any(h.is_relative_to(b) for b in binds)]
        chosen = _sandbox_env(env if env is not None else self.env)
        return _command(mode, binds, hide, self.cgroups, HOME_INSIDE, chosen,
                        self.deadline - time.monotonic(), list(argv), self.limits.disk_mb, self.limits)

    def close(self) -> None:
        """Kill whatever is left in the submission's cgroups and remove them."""
        for group in self.cgroups:
            _empty(group)
        self.cgroups = []


def _empty(group: Path) -> None:
    if (group / "cgroup.kill").exists():
        try:
            (group / "cgroup.kill").write_text("1")
        except OSError:
            pass
    for _ in range(100):  # killed processes take a moment to leave the cgroup
        try:
            pids = (group / "cgroup.procs").read_text().split()
            for pid in pids:
                try:
                    os.kill(int(pid), 9)
                except (ProcessLookupError, ValueError):
                    pass
            if not pids:
                group.rmdir()
                return
        except FileNotFoundError:
            return
        except OSError:
            pass
        time.sleep(0.1)


# ----------------------------------------------------------------------------- the launcher (outside, as the grader)

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Have Linux kill this process (SIGKILL) when the thread that started it ends, the grader killed with
    SIGKILL included; kept across exec (not of a set-user-ID program). Nothing where there is no prctl.
    Safe as a Popen preexec_fn: it only calls the C library."""
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, 9)


PR_SET_DUMPABLE = 4


def not_dumpable() -> None:
    """Make this process not dumpable: no process of the same user may ptrace it, read its memory or open
    its descriptors through /proc, and it leaves no core (a fork keeps this; an exec would not)."""
    if _PRCTL is not None:
        _PRCTL(PR_SET_DUMPABLE, 0)


def _prctl():
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _prctl()     # looked up once, before any fork that calls die_with_parent


def _launch(spec: dict) -> None:
    """Join the submission's cgroups and set its rlimits (as the grader, outside), then exec the rest;
    killed with the thread of the grader (or judge) that started it, whatever ends that."""
    import resource
    die_with_parent()
    if os.getppid() == 1:      # the grader ended before the line above: nothing to run for
        os._exit(125)
    try:
        for procs in spec["cgroups"]:
            with open(procs, "w") as handle:
                handle.write(str(os.getpid()))
        for name, value in spec["rlimits"].items():
            resource.setrlimit(getattr(resource, name), (value, value))
        os.execv(spec["argv"][0], spec["argv"])
    except OSError as error:
        print(f"sandbox launcher: {error}", file=sys.stderr)
        os._exit(125)


if __name__ == "__main__" and sys.argv[1:2] == ["--launch"]:
    _launch(json.loads(sys.argv[2]))
