"""The host: the process that runs a notebook's cells and holds the learner's objects for the judge.

`make grade` and nbgrader's autograde (through engine.course.nbgrader_course.SealedExecute) run a
learner's notebook in two processes (engine.course.kernel.SealedKernel). This one, the host, runs every
cell (in the sandbox under autograde) and answers the requests of the judge (engine.course.sealed.judge),
which runs the graded tests on the grader's own engine and signs their verdicts. The host holds no key;
what it can do to a score is answer the checks' questions. It imports the chapter's host engine
(engine.course.edition.host_engine), whose taught bodies are stubs.

The host also keeps the watch the course had before the judge existed, now for the instructor's flags:

- **Pristine state.** Before any learner code runs, the host imports the checks, the engine and what
  the chapter's locked cells import, and records every module's functions, classes and constants. Before
  each graded test what was changed is put back and reported; what changes during it is reported too.
- **Refusals.** An audit hook, installed first, refuses what learner code could use to probe a grader:
  frame and garbage-collector introspection, ctypes, tracing hooks, building code objects, /proc,
  starting programs.
- **Own work.** Before a test, each graded name it uses must be the learner's code: a function defined
  in the notebook, or a class whose taught methods are; calls from learner code into the engine's
  reference or the checks' helpers during a test are recorded. Either makes the test earn 0.
"""
from __future__ import annotations

import builtins
import enum
import io
import os
import re
import signal
import sys
import sysconfig
import threading
import traceback
import types

from engine.course.sealed.fingerprint import every_code

ENGINE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
MAX_STREAM_CHARS = 50_000        # per cell and stream: a flood of prints is cut, not shipped
TRUSTED_PREFIX = "<trusted "     # the file name of every chapter cell the worker compiles
LEARNER_PREFIX = "<learner "     # ... and of every learner cell

# Events refused when the first frame above them that is neither library nor engine code is learner code.
BLOCKED_EVENTS = {
    "gc.get_objects": "walk the garbage collector's objects",
    "gc.get_referrers": "walk the garbage collector's objects",
    "gc.get_referents": "walk the garbage collector's objects",
    "sys._current_frames": "inspect other frames",
    "sys._getframe": "inspect frames",
    "sys.settrace": "install a tracing hook",
    "sys.setprofile": "install a profiling hook",
    "code.__new__": "build code objects",
    "function.__new__": "build functions from code objects",
    "marshal.loads": "load raw bytecode",
    "marshal.load": "load raw bytecode",
}
BLOCKED_PREFIXES = ("ctypes.", "_ctypes")
FRAME_ATTRIBUTES = {"tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back"}
FUNCTION_ATTRIBUTES = {"__code__", "__globals__", "__closure__", "__defaults__", "__kwdefaults__"}
# /proc itself and every process's folder in it (memory, maps, fds, environment), however the path is
# spelled: `/proc//self/mem`, `..`, a relative path after chdir, a symbolic link.
PROC_PROCESS = re.compile(r"^/proc(/+(self|thread-self|\d+)(/.*)?)?/*$")
# Starting another program: it would run outside this worker's audit hook (and could read its memory).
PROCESS_EVENTS = ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
                  "os.forkpty", "pty.spawn", "os.startfile")
PATH_EVENTS = ("open", "os.listdir", "os.scandir", "os.chdir", "os.symlink", "os.link", "shutil.copyfile",
               "os.truncate", "os.rename")


def process_path(path) -> bool:
    """Whether `path` (str, bytes or path-like; relative to the cwd) names /proc or a process's folder
    in it, before or after resolving `.`, `..`, repeated slashes and symbolic links."""
    try:
        text = os.fsdecode(os.fspath(path))
    except TypeError:
        return False                       # a file descriptor: opened already, by a path checked then
    absolute = text if text.startswith("/") else os.path.join(os.getcwd(), text)
    spellings = (absolute, os.path.normpath(absolute), os.path.realpath(absolute))
    return any(PROC_PROCESS.match(spelling) for spelling in spellings)
# Modules whose functions/constants are guarded (prefix match); others may change as they like.
GUARDED = ("engine", "torch", "numpy", "builtins", "math", "operator", "functools", "itertools",
           "collections", "random", "copy", "types", "sys", "hmac", "hashlib", "json", "traceback",
           "warnings", "contextlib", "dataclasses", "typing", "inspect", "abc", "re", "unittest")
# Re-checked on every return from learner code while a test runs (cheap, and what a check relies on).
CRITICAL = ("engine.checks", "builtins", "torch", "engine.course.seal", "sys", "functools")


def _library_prefixes() -> tuple[str, ...]:
    paths = set()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        for scheme_vars in ({}, {"base": sys.base_prefix, "platbase": sys.base_exec_prefix}):
            try:
                paths.add(os.path.realpath(sysconfig.get_path(key, vars=scheme_vars or None)))
                paths.add(sysconfig.get_path(key, vars=scheme_vars or None))
            except (KeyError, TypeError):
                pass
    for path in sys.path:
        if path and ("site-packages" in path or "dist-packages" in path or path.startswith(sys.base_prefix)):
            paths.add(path)
    return tuple(sorted(p.rstrip(os.sep) + os.sep for p in paths if p and p not in ("/", ENGINE_DIR)))


def kind_of(filename: str, libraries: tuple[str, ...]) -> str:
    """trusted (a chapter cell), engine (engine/, the grader included), library, or learner."""
    if filename.startswith(TRUSTED_PREFIX):
        return "trusted"
    if filename.startswith(ENGINE_DIR):
        return "engine"
    if filename.startswith(libraries) or filename.startswith("<frozen"):
        return "library"
    return "learner"


# ----------------------------------------------------------------------------- the pristine record

def _guarded(name: str) -> bool:
    return any(name == g or name.startswith(g + ".") for g in GUARDED)


def _learner_made(code, libraries) -> bool:
    """Code compiled from a learner cell, or from a file the learner wrote (not "<string>": the standard
    library makes those too, e.g. dataclass methods)."""
    name = code.co_filename
    return name.startswith(LEARNER_PREFIX) or (not name.startswith("<") and kind_of(name, libraries) == "learner")


def _is_learner_object(value, libraries) -> bool:
    """A function or class made by learner code."""
    if isinstance(value, types.FunctionType):
        return _learner_made(value.__code__, libraries)
    if isinstance(value, type):
        return any(isinstance(v, types.FunctionType) and _learner_made(v.__code__, libraries)
                   for v in list(vars(value).values()))
    return False


def _entries_of(owner: dict) -> list:
    """(dict, key, value, extras) for every guarded value of a module or class dict."""
    entries = []
    for key, value in list(owner.items()):
        if isinstance(value, (types.FunctionType, types.BuiltinFunctionType, types.ModuleType, type,
                              types.MethodType, staticmethod, classmethod, property, bool, int, float, str,
                              bytes, tuple, frozenset, type(None))) or callable(value):
            extras = ()
            if isinstance(value, types.FunctionType):
                extras = (value.__code__, value.__defaults__, value.__kwdefaults__,
                          tuple(c.cell_contents if _cell_full(c) else c for c in value.__closure__ or ()))
            entries.append((owner, key, value, extras))
    return entries


def _cell_full(cell) -> bool:
    try:
        cell.cell_contents
        return True
    except ValueError:
        return False


def snapshot(modules: dict) -> tuple:
    """Everything guarded, as an immutable record (objects kept alive, compared by identity)."""
    entries = []
    module_ids = []
    for name, module in list(modules.items()):
        if _guarded(name):
            module_ids.append((name, module))
        if not isinstance(module, types.ModuleType) or not _guarded(name):
            continue
        namespace = vars(module)
        engine_module = name.startswith("engine")
        if name.startswith("torch") and name not in ("torch", "torch.nn.functional", "torch.testing",
                                                     "torch.functional"):
            # torch's many submodules: identity of functions and classes only
            entries += [(namespace, k, v, ()) for k, v in list(namespace.items())
                        if isinstance(v, (types.FunctionType, types.BuiltinFunctionType, type))]
            continue
        entries += _entries_of(namespace)
        if engine_module or name == "torch":
            for value in list(namespace.values()):
                if isinstance(value, type) and (value.__module__ == name or value.__module__.startswith("torch")
                                                and name == "torch" and value.__name__ == "Tensor"):
                    entries.append((None, value, tuple(vars(value).items()), ()))
        else:   # the standard library's own classes (json.JSONEncoder, hmac.HMAC, ...): their methods
            for value in list(namespace.values()):
                if isinstance(value, type) and value.__module__ == name and not isinstance(value, enum.EnumMeta):
                    methods = tuple((k, v) for k, v in vars(value).items() if _is_method(v))
                    entries.append((_METHODS, value, methods, ()))
    return tuple(module_ids), tuple(entries)


_METHODS = "methods"          # a class entry that guards the methods only (the stdlib's classes)


def _is_method(value) -> bool:
    return isinstance(value, (types.FunctionType, staticmethod, classmethod, property))


def _methods_changed(cls, items) -> bool:
    current = vars(cls)
    now = [k for k, v in current.items() if _is_method(v)]
    return len(now) != len(items) or any(current.get(k, _MISSING) is not v for k, v in items)


def _class_items_changed(cls, items) -> bool:
    current = vars(cls)
    if len(current) != len(items):
        return True
    return any(current.get(k, _MISSING) is not v for k, v in items
               if k not in ("__weakref__", "__dict__", "_abc_impl", "__parameters__"))


_MISSING = object()


def _put_back(cls, items, guarded) -> None:
    """Give `cls` the recorded `items` again, dropping attributes added since that `guarded` covers."""
    recorded = dict(items)
    for k in [k for k, v in list(vars(cls).items()) if guarded(v) and k not in recorded]:
        try:
            delattr(cls, k)
        except (AttributeError, TypeError):
            pass
    for k, v in items:
        if vars(cls).get(k, _MISSING) is not v:
            try:
                setattr(cls, k, v)
            except (AttributeError, TypeError):
                pass


def differences(record: tuple, modules: dict, libraries: tuple[str, ...], repair: bool) -> list[str]:
    """What differs from the record (put back when repair)."""
    module_ids, entries = record
    found = []
    for name, module in module_ids:
        if modules.get(name) is not module:
            found.append(f"sys.modules[{name!r}]")
            if repair:
                modules[name] = module
    for owner, key, value, extras in entries:
        if owner is _METHODS:  # a standard-library class: key is the class, value its methods
            if _methods_changed(key, value):
                found.append(f"{key.__module__}.{key.__qualname__}")
                if repair:
                    _put_back(key, value, _is_method)
            continue
        if owner is None:  # a class: key is the class, value its items
            if _class_items_changed(key, value):
                found.append(f"{key.__module__}.{key.__qualname__}")
                if repair:
                    _put_back(key, value, lambda v: True)
            continue
        current = owner.get(key, _MISSING)
        changed = current is not value
        if not changed and extras:
            code, defaults, kwdefaults, closure = extras
            now = tuple(c.cell_contents if _cell_full(c) else c for c in value.__closure__ or ())
            changed = (value.__code__ is not code or value.__defaults__ is not defaults
                       or value.__kwdefaults__ is not kwdefaults or len(now) != len(closure)
                       or any(a is not b for a, b in zip(now, closure)))
            if changed and repair:
                value.__code__, value.__defaults__, value.__kwdefaults__ = code, defaults, kwdefaults
                for cell, content in zip(value.__closure__ or (), closure):
                    if _cell_full(cell) and cell.cell_contents is not content:
                        cell.cell_contents = content
        if changed:
            label = owner.get("__name__", "?") if isinstance(owner, dict) else "?"
            found.append(f"{label}.{key}")
            if repair and current is not value:
                owner[key] = value
    recorded = {name for name, _ in module_ids}
    for name, module in list(modules.items()):  # entries new since the record: no learner code inside
        if name in recorded or not _guarded(name):
            continue
        if not isinstance(module, types.ModuleType):
            found.append(f"sys.modules[{name!r}] (not a module)")
        elif any(_is_learner_object(v, libraries) for v in list(vars(module).values())):
            found.append(f"sys.modules[{name!r}] (a module made by the notebook)")
        else:
            continue
        if repair:
            del modules[name]
    return found


def hooks_state(baseline_threads: int) -> list[str]:
    """Hooks and threads that would let code run during a check unseen."""
    found = []
    if sys.gettrace() is not None:
        found.append("a tracing hook (sys.settrace)")
    if threading._trace_hook is not None or threading._profile_hook is not None:  # noqa: SLF001
        found.append("a thread tracing hook")
    if len(sys._current_frames()) > baseline_threads:
        found.append("a thread the notebook started, still running")
    return found


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


def named(module_name: str, qualname: str):
    """The object `qualname` (a function, class or Class.method) of a module, imported if need be."""
    target = sys.modules.get(module_name) or __import__(module_name, fromlist=["_"])
    for part in qualname.split("."):
        target = getattr(target, part)
    return target


def _error_output(exc: BaseException) -> dict:
    try:
        ename = type(exc).__name__
        evalue = str(exc)
        lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
    except BaseException as broken:  # an exception whose __str__ misbehaves
        ename, evalue, lines = type(exc).__name__, f"(its message could not be shown: {type(broken).__name__})", []
    return {"output_type": "error", "ename": str.__str__(ename), "evalue": str.__str__(evalue),
            "traceback": [str.__str__(line) for line in lines][-12:]}


def _names_bound(source: str) -> set[str]:
    """Top-level names a cell binds (assignments, imports, defs, classes)."""
    import ast
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                names.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for sub in ast.walk(target):
                    if isinstance(sub, ast.Name):
                        names.add(sub.id)
    return names


def _names_read(source: str) -> set[str]:
    import ast
    try:
        return {n.id for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Name)}
    except SyntaxError:
        return set()


def _own_work(name: str, spec: dict, namespace: dict, libraries, written: dict) -> str:
    """'' when `name` is the learner's code; else why not.

    Learner code is code the worker compiled from a learner cell's own text (`written`: id -> code
    object, every function nested in a cell): not a file name, which exec and compile can choose."""
    if name not in namespace:
        return ""  # the test fails on its own (NameError)
    value = namespace[name]
    methods = spec.get("methods")
    where = spec.get("reference") or "the engine"

    def origin(fn) -> str:
        code = getattr(fn, "__code__", None)
        if not isinstance(fn, types.FunctionType) or code is None:
            return f"not a function written in the notebook ({type(fn).__name__})"
        kind = kind_of(code.co_filename, libraries)
        if written.get(id(code)) is code:
            return ""
        if kind == "learner":
            return ("code made while the notebook ran (exec, compile or a function built from code), not "
                    "written in a notebook cell")
        return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', '?')}, the {kind}'s code"

    if not methods:
        why = origin(value)
        return f"{name} is {why}" if why else ""
    if not isinstance(value, type):
        return f"{name} is not a class written in the notebook ({type(value).__name__})"
    for method in methods:
        owner = next((k for k in value.__mro__ if method in vars(k)), None)
        if owner is None:
            return f"{name} has no method {method}"
        fn = vars(owner)[method]
        fn = getattr(fn, "__func__", fn)
        why = origin(fn)
        if why:
            inherited = f" (inherited from {owner.__module__}.{owner.__qualname__})" if owner is not value else ""
            return f"{name}.{method} is {why}{inherited}"
    del where
    return ""


def make_profile(critical: tuple, references: frozenset, libraries: tuple, audit, getframe_unused=None):
    """The profiling function used while a test runs: no closure, its state in immutable defaults."""

    # Returns are checked from learner cells and learner files only: "<string>" code is the standard
    # library's too (dataclass and namedtuple methods, Triton's interpreter), and checking each of its
    # returns made an interpreted kernel several times slower. A learner patch done inside such code is
    # still seen when the learner frame that ran it returns.
    def profile(frame, event, arg, _critical=critical, _refs=references, _libs=libraries, _audit=audit,
                _kind=kind_of, _learner=_learner_made, _missing=_MISSING):
        if event == "call":
            if frame.f_code in _refs:
                caller = frame.f_back      # a chapter helper in between does not launder the call
                while caller is not None and _kind(caller.f_code.co_filename, _libs) in ("library", "trusted"):
                    caller = caller.f_back
                if caller is not None and _kind(caller.f_code.co_filename, _libs) == "learner":
                    _audit("course.delegation", frame.f_code.co_qualname, caller.f_code.co_filename)
        elif event == "return" and _learner(frame.f_code, _libs):
            for owner, key, value in _critical:
                if owner.get(key, _missing) is not value:
                    _audit("course.tamper", f"{owner.get('__name__', '?')}.{key}")
                    break
    return profile


def not_dumpable() -> bool:
    """Mark this process not dumpable (Linux prctl), before any learner code runs: no other process of
    the same user (a child it starts included) may then read its memory through /proc/<pid>/mem or
    ptrace, so the key cannot be read from outside. False where the system offers no prctl."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(4, 0, 0, 0, 0) == 0 and libc.prctl(3, 0, 0, 0, 0) == 0   # SET / GET_DUMPABLE
    except (OSError, AttributeError):
        return False


def main() -> None:
    """Host one notebook: read the plan from the judge, then run cells and answer its requests."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the grader interrupts cells, never the host itself
    not_dumpable()
    import socket
    from engine.course.sealed.remote import Channel, RemoteGone
    channel = Channel(socket.socket(fileno=int(sys.argv[1])), "L")
    try:
        plan = channel._receive()["plan"]
    except (RemoteGone, KeyError, TypeError):
        return
    libraries = _library_prefixes()
    state = {"events": [], "delegations": [], "tampered": []}
    guard = [False]

    def audit_hook(event, args, _libs=libraries, _kind=kind_of, _blocked=BLOCKED_EVENTS,
                   _harness=os.path.abspath(__file__)):
        if event.startswith("course."):
            if event == "course.delegation":
                state["delegations"].append(f"{args[0]} (called from {args[1]})")
            elif event == "course.tamper":
                state["tampered"].append(str(args[0]))
            return
        reason = _blocked.get(event)
        refusal = ValueError
        if reason is None:
            if event.startswith(BLOCKED_PREFIXES):
                reason = "use ctypes"
            elif event == "sys.addaudithook":
                raise RuntimeError("graded code may not add audit hooks")
            elif event == "object.__getattr__" and args[1] in FRAME_ATTRIBUTES:
                reason = "inspect frames"
            elif event == "object.__setattr__" and args[1] in FUNCTION_ATTRIBUTES:
                reason = f"replace a function's {args[1]}"
            elif event in PATH_EVENTS and any(process_path(arg) for arg in args[:2]
                                              if isinstance(arg, (str, bytes, os.PathLike))):
                reason = "read the process's memory or files in /proc"
                refusal = PermissionError
            elif event.startswith(PROCESS_EVENTS):
                reason = "start another program"
                refusal = PermissionError      # an OSError: libraries that try a tool handle it
            elif event == "compile" and len(args) > 1 and isinstance(args[1], str) and not (
                    args[1].startswith("<") and not args[1].startswith((TRUSTED_PREFIX, LEARNER_PREFIX,
                                                                        "<frozen"))):
                reason = f"compile code under the file name {args[1]!r}"
                if not args[1].startswith("<"):
                    event = "marshal.compile"  # an import compiling a library file is fine: only direct calls
            else:
                return
        if guard[0]:
            return
        guard[0] = True
        try:
            frame = sys._getframe(1)
            immediate = True
            while frame is not None:
                kind = _kind(frame.f_code.co_filename, _libs)
                # A chapter cell's function does not vouch for its caller: learner code may call a
                # chapter helper after rebinding the globals it reads. The walk goes on to the grader.
                if kind == "learner":
                    # Loading bytecode or setting a function's code: only learner code doing it
                    # itself (the standard library's namedtuple sets its functions' defaults).
                    if (event.startswith("marshal.") or event == "object.__setattr__") and not immediate:
                        return
                    state["events"].append(reason)
                    raise refusal(f"graded code may not {reason} (the grader refused {event})")
                if kind == "engine" and frame.f_code.co_filename == _harness:
                    return  # the grader's own code (learner code it runs sits above it on the stack)
                immediate = False
                frame = frame.f_back
        finally:
            guard[0] = False

    sys.addaudithook(audit_hook)
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
    references = _install_references(plan.get("references", []), plan.get("helpers", []))
    record = snapshot(sys.modules)
    critical = tuple((vars(m), k, v) for name, m in list(sys.modules.items())
                     if isinstance(m, types.ModuleType) and (name in CRITICAL or name.startswith("engine.checks"))
                     for k, v in list(vars(m).items())
                     if isinstance(v, (types.FunctionType, types.BuiltinFunctionType, type, types.ModuleType)))
    baseline_threads = len(sys._current_frames())
    main_module = types.ModuleType("__main__")  # the notebook's namespace, as in a kernel
    namespace = main_module.__dict__
    namespace["__builtins__"] = builtins
    sys.modules["__main__"] = main_module
    trusted_bindings: dict = {}
    written: dict = {}                  # id -> code object of everything compiled from a learner cell
    graded = dict(plan.get("graded", {}))
    graded_by_cell = plan.get("graded_by_cell", {})
    worker_pid = os.getpid()
    test: dict = {}                     # the test the judge is running now: what begin_test found

    def run_cell(source: str, kind: str, name: str) -> dict:
        """A learner's or a chapter's cell, in the notebook's namespace: its outputs and status."""
        if kind == "learner":             # a name defined again takes this cell's spec from here on
            graded.update(graded_by_cell.get(name, {}))
        filename = f"{TRUSTED_PREFIX if kind == 'trusted' else LEARNER_PREFIX}{name}>"
        out, err = _Capture(), _Capture()
        status, error = "ok", None
        saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = out, err
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            code = compile(source, filename, "exec")
            if kind == "learner":
                written.update((id(c), c) for c in every_code(code))
            exec(code, namespace)
        except KeyboardInterrupt as exc:
            status, error = "interrupted", _error_output(exc)
        except BaseException as exc:  # SystemExit included: leaving early is a failed cell
            status, error = "error", _error_output(exc)
        finally:
            if os.getpid() != worker_pid:
                os._exit(0)  # a process the notebook forked, back in the host's loop: it may not speak
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            sys.stdout, sys.stderr = saved
            _reap_children()
        outputs = _stream_outputs(out, err) + ([error] if error else [])
        if "matplotlib.pyplot" in sys.modules:
            try:
                sys.modules["matplotlib.pyplot"].close("all")
            except Exception:
                pass
        if kind == "trusted" and status == "ok":
            for bound in _names_bound(source):
                if bound in namespace:
                    trusted_bindings[bound] = namespace[bound]
        return {"status": status, "outputs": outputs, "refused": _events()}

    def _events() -> list:
        events = sorted(set(state["events"]))
        state["events"].clear()
        return events

    def begin_test(source: str, names: list) -> dict:
        """Before the judge runs a test: put back what learner code changed, bind the chapter's names
        again, and look at whether the graded names it uses are the learner's own work."""
        notes, own = [], []
        repaired = differences(record, sys.modules, libraries, repair=True)
        repaired += hooks_state(baseline_threads)
        sys.settrace(None)
        threading.settrace(None)  # type: ignore[arg-type]
        if repaired:
            notes.append("put back before this test: " + ", ".join(sorted(set(repaired))[:8]))
        chapter_names = tuple((namespace, k, v) for k, v in trusted_bindings.items() if k not in graded)
        for _, bound, value in chapter_names:
            namespace[bound] = value
        for used in names:
            if used in graded:
                why = _own_work(used, graded[used], namespace, libraries, written)
                if why:
                    own.append(why)
        state["delegations"].clear()
        state["tampered"].clear()
        test.clear()
        test.update(chapter_names=chapter_names, own=own)
        sys.setprofile(make_profile(critical + chapter_names, references, libraries, sys.audit))
        return {"notes": notes, "own_work": own}

    def end_test() -> dict:
        """After the test: what changed while it ran, and the reasons (if any) it must not count."""
        sys.setprofile(None)
        chapter_names = test.get("chapter_names", ())
        after = differences(record, sys.modules, libraries, repair=True) + hooks_state(baseline_threads)
        after += [f"the chapter's {k}" for _, k, v in chapter_names if namespace.get(k, _MISSING) is not v]
        for _, k, v in chapter_names:
            namespace[k] = v
        tampered = sorted(set(after + state["tampered"]))
        reasons = []
        if test.get("own"):
            reasons.append("; ".join(test["own"]) + ": the exercise must be your own code")
        if state["delegations"]:
            reasons.append("the code under test called the engine's reference or the checks' own helpers "
                           f"({', '.join(sorted(set(state['delegations']))[:3])}): the exercise must be your "
                           "own code")
        if tampered:
            reasons.append("the code under test changed what the checks rely on ("
                           + ", ".join(tampered[:6]) + "); a test only counts when the course's code runs "
                           "as shipped")
        return {"delegations": sorted(set(state["delegations"])), "tampered": tampered, "reasons": reasons,
                "refused": _events()}

    def serve(op, target, args, kwargs):
        if op == "cell":
            return run_cell(*args)
        if op == "lookup":
            return {n: namespace[n] for n in args[0] if n in namespace}
        if op == "begin_test":
            return begin_test(*args)
        if op == "end_test":
            return end_test()
        if op == "call_engine":          # a check's helper that must run where the learner's class is
            module_name, qualname, *rest = args
            if not (module_name == "engine" or module_name.startswith("engine.")):
                raise PermissionError(f"{module_name} is not the engine's")
            return named(module_name, qualname)(*rest, **kwargs)
        raise ValueError(f"unknown operation {op!r}")

    channel.serve = serve
    channel._send({"ready": True})
    while True:
        try:
            message = channel._receive()
        except RemoteGone:
            return
        channel.answer(message)


def _reap_children() -> None:
    """Collect the exit status of processes the notebook started and left (so none stays a zombie)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _install_references(references: list, helpers: list) -> frozenset:
    """The code objects of the taught reference functions and the checks' helpers (called from learner
    code during a test, they void it)."""
    codes = set()
    for module_name, qualname in references:
        try:
            target = named(module_name, qualname)
            target = getattr(target, "__func__", target)
            # An edition stub (engine.course.edition: it calls the learner's own definition) is not
            # the reference: calling it runs the learner's code.
            if isinstance(target, types.FunctionType) and "_edition" not in target.__code__.co_names:
                codes.add(target.__code__)
        except Exception:
            pass
    for module_name in helpers:
        module = sys.modules.get(module_name)
        if module is None:
            continue
        for value in list(vars(module).values()):
            if isinstance(value, types.FunctionType) and value.__module__ == module_name \
                    and not getattr(value, "is_check", False):
                codes.add(value.__code__)
            elif isinstance(value, type) and value.__module__ == module_name:
                codes.update(v.__code__ for v in vars(value).values() if isinstance(v, types.FunctionType))
    return frozenset(codes)


if __name__ == "__main__":
    main()
