"""The kernel process: builds a learner's Triton kernel from its text and launches it on tensors sent as data.

It runs as `python -I -S -c <this file's text>` (engine.course.grading.kernel.kernel_argv), started by the
grader when the judge asks for it and in the sandbox where the host runs in one, with nothing of the
course on its path and no key: it imports torch and triton only. Each request is one launch (the
kernel's text, as engine.course.grading.reading.kernels took it from the cell, its constants, the grid, the arguments
with each tensor as a view of a storage, the storages' bytes); the reply is every storage's bytes after
the launch, or the error as plain strings. The judge (engine.course.grading.sealed.kernelbox) trusts nothing it
says beyond bytes of the sizes it sent.

A launch may ask for the loads of some storages to be watched (`watch`: their indices). In Triton's
interpreter every load passes through one builder method, which this process wraps for the launch:
for each watched storage the reply carries, after the storages, one byte per byte of it, 1 where a
load with its mask on began. That is all a watch reports: which bytes the kernel read. What they
mean (an entry past a block-table row's end) is for the judge to say; a compiled launch is not
watched (its bytes stay 0), as in the lab.
"""
import json
import os
import struct
import traceback

HEADER = struct.Struct("!QQ")          # JSON length, then the length of the bytes after it


def _read(stream, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = stream.read(min(left, 1 << 22))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _send(stream, header: dict, blobs: list) -> None:
    body = json.dumps(header).encode()
    stream.write(HEADER.pack(len(body), sum(len(b) for b in blobs)) + body)
    for blob in blobs:
        stream.write(blob)
    stream.flush()


def _kernel_line(error: BaseException, filename: str):
    """The innermost line of the kernel's own text in the error or what it wraps, else None."""
    seen, found = set(), None
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        for frame in traceback.extract_tb(error.__traceback__):
            if frame.filename == filename:
                found = frame.lineno
        error = error.__cause__ or error.__context__
    return found


def _not_implemented(error: BaseException) -> bool:
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, NotImplementedError) or "NotImplementedError" in str(error)[:2000]:
            return True
        error = error.__cause__ or error.__context__
    return False


class LoadWatch:
    """During a launch in the interpreter: which bytes of the watched storages the kernel's loads read."""

    def __init__(self, builder, storages: list, watched: list):
        import numpy as np
        self.np, self.builder = np, builder
        self.spans = [(s.data_ptr(), s.nbytes(), np.zeros(s.nbytes(), dtype=np.uint8))
                      for s in (storages[i].untyped_storage() for i in watched)]

    def __enter__(self):
        if self.spans:
            load = self.builder.create_masked_load
            np, spans = self.np, self.spans

            def watched(ptrs, mask, *rest):
                try:           # a load the interpreter refuses raises its own error below, not the watch's
                    addresses = np.asarray(ptrs.data).astype(np.int64, copy=False)
                    read = addresses[np.broadcast_to(np.asarray(mask.data, dtype=bool), addresses.shape)]
                except (ValueError, TypeError, AttributeError):
                    read = np.zeros(0, dtype=np.int64)
                for base, size, marks in spans:
                    marks[read[(read >= base) & (read < base + size)] - base] = 1
                return load(ptrs, mask, *rest)
            self.builder.create_masked_load = watched
        return self

    def __exit__(self, *exc):
        vars(self.builder).pop("create_masked_load", None)

    def marks(self) -> list:
        return [marks.tobytes() for _, _, marks in self.spans]


def main() -> None:
    protocol_in = os.fdopen(os.dup(0), "rb", buffering=0)
    protocol_out = os.fdopen(os.dup(1), "wb", buffering=0)
    quiet = os.open(os.devnull, os.O_RDWR)
    os.dup2(quiet, 0)                  # what a kernel prints goes nowhere, never into the replies
    os.dup2(quiet, 1)
    import torch
    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
    import linecache

    import triton
    import triton.language as tl
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        from triton.runtime.interpreter import interpreter_builder
    built: dict = {}
    _send(protocol_out, {"ready": True, "device": device}, [])
    while True:
        try:
            json_size, blob_size = HEADER.unpack(_read(protocol_in, HEADER.size))
            request = json.loads(_read(protocol_in, json_size))
            blob = _read(protocol_in, blob_size)
        except EOFError:
            return
        name, text = request["name"], request["text"]
        filename = f"<kernel {name}>"
        try:
            key = (name, text, json.dumps(request["constants"], sort_keys=True))
            if key not in built:
                linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
                namespace = {"tl": tl, "triton": triton, **request["constants"]}
                exec(compile(text, filename, "exec"), namespace)
                built[key] = triton.jit(namespace[name])
            storages, at = [], 0
            for size in request["storages"]:
                raw = torch.frombuffer(bytearray(blob[at:at + size]), dtype=torch.uint8) if size else \
                    torch.empty(0, dtype=torch.uint8)
                storages.append(raw.to(device))
                at += size

            def value(spec):
                if isinstance(spec, dict):
                    dtype = getattr(torch, spec["dtype"])
                    return torch.empty(0, dtype=dtype, device=device).set_(
                        storages[spec["storage"]].untyped_storage(), spec["offset"], spec["shape"], spec["stride"])
                return spec
            args = [value(a) for a in request["args"]]
            kwargs = {k: value(v) for k, v in request["kwargs"].items()}
            watched = sorted({i for i in request.get("watch", []) if type(i) is int and 0 <= i < len(storages)})
            if device == "cpu":
                with LoadWatch(interpreter_builder, storages, watched) as watch:
                    built[key][tuple(request["grid"])](*args, **kwargs)
                marks = watch.marks()
            else:
                built[key][tuple(request["grid"])](*args, **kwargs)
                torch.cuda.synchronize()
                marks = [bytes(storages[i].numel()) for i in watched]
            _send(protocol_out, {"ok": True}, [s.cpu().numpy().tobytes() for s in storages] + marks)
        except BaseException as error:  # noqa: BLE001 - every failure goes back as text
            _send(protocol_out, {"error": {"type": type(error).__name__[:60], "message": str(error)[:4000],
                                           "line": _kernel_line(error, filename),
                                           "not_implemented": _not_implemented(error)}}, [])


if __name__ == "__main__":
    main()
