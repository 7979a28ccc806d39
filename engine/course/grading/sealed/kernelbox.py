"""The judge's side of the kernel process: a learner's kernel launched where the judge is not.

A Triton kernel's body runs as Python in the interpreter (and its compiler runs on a GPU), so the judge
never builds or launches one. It hands the checks a `SandboxedKernel` instead: a Triton kernel to the
engine's launchers (`kernel[grid](...)`), whose launch sends the kernel's text (as
engine.course.grading.reading.kernels took it from the cell), the grid and the arguments as data to a
process of its own (engine.course.grading.sealed.kernel_runner: fresh per notebook, started with the
host's sandbox, no key, nothing of the course). In the grader that process is the grader's: the judge asks
for one on its kernel socket and gets its stdin and stdout
(engine.course.grading.kernel.SealedKernel._kernel_request), since inside the judge's own sandbox it could
not be started in the submission's cgroups. Each tensor argument goes as its whole storage (a kernel
writes through pointers, past its view too), and comes back as exactly as many bytes, which the judge
copies into its own tensors; nothing else of the reply is believed but an error's type name, message and
kernel line, as text. A launch past the cell's wall-clock time or a process that crashed fails that
launch, and the next one starts a fresh process.

A check may watch a tensor's loads (`SandboxedKernel.loads_of`, as the lab's check watches the
interpreter's own): the launch then asks the kernel process for one byte per byte of that storage,
1 where a load began, exactly that many bytes more, and the check reads from them which entries the
kernel read. That is the kernel process's word, so it only ever fails a kernel: a process that hid
its reads would earn what an honest kernel earns, never more.
"""
from __future__ import annotations

import contextlib
import json
import linecache
import os
import select
import signal
import socket
import struct
import subprocess
import time

import torch

from engine.course.grading.reading.kernels import kernel_text

HEADER = struct.Struct("!QQ")
MAX_REPLY_JSON = 1 << 16               # an error's text; more is not an answer
SCALARS = (bool, int, float, type(None))
GRADER_WAIT_S = 60                     # how long the grader may take to hand over a kernel process


class KernelProcessError(RuntimeError):
    """The kernel process crashed, sent what was not asked for, or did not answer in time."""


class CompilationError(RuntimeError):
    """Triton's compiler refused the kernel (named as Triton names it, for the checks' hints)."""


class KernelBox:
    """One kernel process at a time for one judge, started on its first launch: asked of the grader on
    the socket `grader` (a descriptor: the judge's), or started here with `argv` (the tests')."""

    def __init__(self, argv: list[str] | None = None, cwd: str | None = None, grader: int | None = None):
        self.argv, self.cwd = argv, cwd
        self.grader = socket.socket(fileno=grader) if grader is not None else None
        self.process: subprocess.Popen | None = None     # started here (with argv)
        self.stdin = self.stdout = None                 # the kernel process's, wherever it was started
        self.deadline: float | None = None      # the wall clock of the cell being judged (monotonic)
        self.launches = 0
        self.watches: list[Loads] = []          # the tensors whose loads the launches now report

    def _start(self) -> None:
        if self.grader is not None:
            self.stdin, self.stdout = self._from_grader()
        elif self.argv:
            self.process = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                            stderr=subprocess.DEVNULL, cwd=self.cwd, preexec_fn=_die_with_judge)
            self.stdin, self.stdout = self.process.stdin, self.process.stdout
        else:
            raise KernelProcessError("this grader has no kernel process to launch a kernel in")
        ready, _ = self._reply(expected=0)
        if not ready.get("ready"):
            self.stop()
            raise KernelProcessError("the kernel process did not start")

    def _from_grader(self):
        """A fresh kernel process's stdin and stdout, from the grader (which ends the one before)."""
        try:
            self.grader.settimeout(GRADER_WAIT_S)
            self.grader.sendall(b"s")
            answer, fds, _, _ = socket.recv_fds(self.grader, 1, 2)
        except OSError:
            raise KernelProcessError("the grader did not hand over a kernel process") from None
        if answer != b"y" or len(fds) != 2:
            for fd in fds:
                os.close(fd)
            raise KernelProcessError("this grader has no kernel process to launch a kernel in")
        return os.fdopen(fds[0], "wb"), os.fdopen(fds[1], "rb")

    def _running(self) -> bool:
        """A kernel process that waits for a launch: started, not ended, nothing unasked waiting from it
        (between launches it sends nothing: what can be read is its end, or bytes no one asked for)."""
        if self.stdin is None or (self.process is not None and self.process.poll() is not None):
            return False
        return not select.select([self.stdout], [], [], 0)[0]

    def stop(self) -> None:
        """End the kernel process: the one started here (its process group: the sandbox's launcher and
        what it started), or ask the grader to end its one."""
        process, streams = self.process, (self.stdin, self.stdout)
        self.process = self.stdin = self.stdout = None
        for stream in streams:
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        if process is not None:
            if process.poll() is None:
                process.kill()
            process.wait()
        elif self.grader is not None and streams[0] is not None:
            try:
                self.grader.settimeout(GRADER_WAIT_S)
                self.grader.sendall(b"x")
            except OSError:
                pass

    def launch(self, program, grid, args: tuple, kwargs: dict) -> None:
        """Launch `program` (kernels.Program) on `grid`; the tensors among the arguments get what the
        kernel wrote into their storages."""
        storages, keys = [], {}

        def spec(value, where: str):
            if isinstance(value, torch.Tensor):
                storage = value.untyped_storage()
                key = (storage.data_ptr(), storage.nbytes(), str(value.device))
                if key not in keys:
                    keys[key] = len(storages)
                    storages.append(storage)
                return {"storage": keys[key], "dtype": str(value.dtype).removeprefix("torch."),
                        "shape": list(value.shape), "stride": list(value.stride()), "offset": value.storage_offset()}
            if type(value) in SCALARS:
                return value
            raise TypeError(f"a kernel launch takes tensors and numbers, not {type(value).__name__} ({where})")
        sent = {"name": program.name, "text": program.text, "constants": program.constants,
                "grid": _grid(grid, kwargs), "args": [spec(a, f"argument {i}") for i, a in enumerate(args)],
                "kwargs": {str(k): spec(v, k) for k, v in kwargs.items()}}
        blobs = [_bytes(s) for s in storages]
        sent["storages"] = [len(b) for b in blobs]
        watched = {keys[w.key]: w for w in self.watches if w.key in keys}
        sent["watch"] = sorted(watched)
        expected = sum(sent["storages"]) + sum(sent["storages"][i] for i in sent["watch"])
        if not self._running():
            self.stop()
            self._start()
        self.launches += 1
        body = json.dumps(sent).encode()
        try:
            self.stdin.write(HEADER.pack(len(body), sum(sent["storages"])) + body + b"".join(blobs))
            self.stdin.flush()
        except OSError:
            self.stop()
            raise KernelProcessError("the kernel process ended before the launch (it crashed)") from None
        reply, back = self._reply(expected=expected)
        if "error" in reply:
            raise _kernel_error(program, reply["error"])
        if reply != {"ok": True}:
            self.stop()
            raise KernelProcessError("the kernel process answered the launch with something it was not asked for")
        at = 0
        for storage, size in zip(storages, sent["storages"]):
            _write(storage, back[at:at + size])
            at += size
        for index in sent["watch"]:
            size = sent["storages"][index]
            watched[index].add(back[at:at + size])
            at += size

    @contextlib.contextmanager
    def watching(self, tensor: torch.Tensor):
        """Within it, every launch on `tensor`'s storage reports which of its bytes the kernel loaded
        (the kernel process's word: for failing a kernel, never for passing one)."""
        loads = Loads(tensor)
        self.watches.append(loads)
        try:
            yield loads
        finally:
            self.watches.remove(loads)

    def _reply(self, expected: int) -> tuple[dict, bytes]:
        """The next reply: a small JSON object, then either no bytes or exactly `expected`."""
        try:
            json_size, blob_size = HEADER.unpack(self._read(HEADER.size))
            if json_size > MAX_REPLY_JSON or blob_size not in (0, expected):
                raise KernelProcessError(f"the kernel process sent a reply of {json_size} + {blob_size} bytes "
                                         f"(a launch's reply is at most {MAX_REPLY_JSON} bytes of text and "
                                         f"exactly the {expected} bytes asked for: the tensors it was sent, "
                                         f"and what the kernel loaded of a watched one)")
            reply = json.loads(self._read(json_size))
            back = self._read(blob_size)
            if not isinstance(reply, dict) or (blob_size and reply != {"ok": True}):
                raise KernelProcessError("the kernel process sent a malformed reply")
            return reply, back
        except (KernelProcessError, ValueError, UnicodeDecodeError) as error:
            self.stop()
            raise KernelProcessError(str(error) if isinstance(error, KernelProcessError)
                                     else "the kernel process sent a malformed reply") from None

    def _read(self, size: int) -> bytes:
        chunks, left = [], size
        stream = self.stdout
        while left:
            wait = None if self.deadline is None else self.deadline - time.monotonic()
            if wait is not None and (wait <= 0 or not select.select([stream], [], [], wait)[0]):
                raise KernelProcessError("the kernel did not finish within the cell's time (it was stopped)")
            chunk = os.read(stream.fileno(), min(left, 1 << 22))
            if not chunk:
                raise KernelProcessError("the kernel process ended during the launch (it crashed)")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)


class Loads:
    """What the launches within `KernelBox.watching` loaded of one tensor's storage."""

    def __init__(self, tensor: torch.Tensor):
        storage = tensor.untyped_storage()
        self.tensor = tensor
        self.key = (storage.data_ptr(), storage.nbytes(), str(tensor.device))
        self.marks = torch.zeros(storage.nbytes(), dtype=torch.bool)

    def add(self, data: bytes) -> None:
        if data:
            self.marks |= torch.frombuffer(bytearray(data), dtype=torch.uint8).bool()

    def read(self) -> torch.Tensor:
        """Booleans of the tensor's shape: True where a load read any byte of that element."""
        item, view = self.tensor.element_size(), self.tensor
        usable = self.marks.numel() // item * item
        elements = self.marks[:usable].view(-1, item).any(dim=1)
        if view.numel() == 0:
            return torch.zeros(view.shape, dtype=torch.bool)
        return elements.as_strided(tuple(view.shape), tuple(view.stride()), view.storage_offset())


class Program:
    """A kernel as the judge knows it: its name, its text and the cell's constants it reads."""

    def __init__(self, name: str, text: str, constants: dict):
        self.name, self.text, self.constants = name, text, constants
        self.filename = f"<kernel {name}>"
        linecache.cache[self.filename] = (len(text), None, text.splitlines(True), self.filename)
        # the function's code, compiled and never run: its source for the checks' reading of it
        self.code = next(c for c in compile(text, self.filename, "exec").co_consts
                         if getattr(c, "co_name", None) == name)


def from_cell(name: str, source: str):
    """(the kernel `name` as the cell's text defines it, a Program, '') or (None, why not)."""
    found, why = kernel_text(name, source)
    return (Program(name, *found) if found is not None else None), why


def sandboxed_kernel(box: KernelBox, program: Program):
    """What the checks get for a learner's kernel: launched in `box`, indexed by a grid as a Triton kernel."""
    import triton

    class SandboxedKernel(triton.runtime.KernelInterface):
        """A learner's kernel, launched in the kernel process; `fn` is its code (for reading its source)."""

        def __init__(self):
            self.fn, self.__name__ = program.code, program.name

        def run(self, *args, grid, warmup, **kwargs):
            if warmup:
                return None
            box.launch(program, grid, args, kwargs)
            return None

        def loads_of(self, tensor: torch.Tensor):
            """A context whose launches report which elements of `tensor` the kernel loaded
            (KernelBox.watching): `.read()` after it."""
            return box.watching(tensor)

        def __repr__(self):
            return f"<your kernel {program.name}, launched in the kernel process>"

    return SandboxedKernel()


def _grid(grid, meta: dict) -> list[int]:
    if callable(grid):
        grid = grid(meta)
    grid = (grid,) if isinstance(grid, int) else tuple(grid)
    if not 1 <= len(grid) <= 3 or not all(type(g) is int and g >= 0 for g in grid):
        raise TypeError(f"a launch's grid is 1 to 3 whole numbers, not {grid!r}")
    return list(grid)


def _bytes(storage) -> bytes:
    flat = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
    return flat.cpu().numpy().tobytes()


def _write(storage, data: bytes) -> None:
    flat = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
    if data:
        flat.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8).to(storage.device))


def _kernel_error(program: Program, error) -> Exception:
    """The kernel process's error as an exception of the judge's own: a NotImplementedError for a stub,
    Triton's CompilationError by name, else a RuntimeError; raised from the kernel's line where it said
    one (so the checks can quote that line of the text the judge holds)."""
    if not isinstance(error, dict):
        return KernelProcessError("the kernel process sent a malformed error")
    name = error.get("type") if isinstance(error.get("type"), str) and error["type"].isidentifier() else "Error"
    message = str(error.get("message", ""))[:4000]
    if error.get("not_implemented") is True:
        made: Exception = NotImplementedError(message)
    elif name == "CompilationError":
        made = CompilationError(message)
    else:
        made = type(name[:60], (RuntimeError,), {"__module__": "kernel process"})(message)
    line = error.get("line")
    if type(line) is int and 0 < line <= len(program.text.splitlines()):
        code = compile("\n" * (line - 1) + "raise made", program.filename, "exec")
        code = code.replace(co_name=program.name, **({"co_qualname": program.name}
                                                     if hasattr(code, "co_qualname") else {}))
        try:       # the judge's own one-line raise, placed at that line of the kernel's file, named as it
            exec(code, {"made": made})
        except type(made) as raised:
            wrapper = RuntimeError(f"your kernel raised {name}: {message}")
            wrapper.__cause__ = raised
            return wrapper
    return made


def _die_with_judge() -> None:
    """In the kernel process before it starts: killed when the judge ends, whatever ends the judge."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
