"""The learner's objects, used from the judge through a one-way, data-only channel.

The judge (the grader's checks) and the learner's host (the notebook's cells) are two processes joined by
one socket. Only the judge asks; the host answers. A value crosses as data: numbers, strings, containers,
tensors (their values' bytes and shape), dtypes, the engine's enum members and frozen dataclasses,
exceptions (by name, message and where they were raised), and an engine class or function by its name
(the host takes its own copy). An object of the host's that is not data stays there and the judge gets
a `Remote` for it: attribute reads, calls, indexing and iteration on a `Remote` are requests the host
answers. Nothing received is ever unpickled or run.

The judge sends nothing else: an object of its own is refused as it is encoded (`JudgeObjectRefused`),
so the host never holds anything of the judge's it could call; an object that learner code needs (a
cache, a sequence) is built in the host by the checks' `where_it_lives` helpers. A request from the
host is never served: it breaks the channel (`OutOfTurn`), which costs the test it came in.

A tensor or a generator crosses as a copy, in either direction: what one side writes into its copy, or
draws from it, stays on that side. A check that changes a learner's tensor does it where the tensor
lives (a `where_it_lives` helper), and one that needs what a call wrote gets it back as the answer.
"""
from __future__ import annotations

import base64
import dataclasses
import enum
import json
import math
import numbers
import os
import socket
import struct
import sys
import threading
import time
import types

import torch

_HEADER = struct.Struct("!Q")
MAX_FRAME = 1 << 26          # a message larger than this is refused (a flood, not a value)
MAX_ELEMENTS = 1_000_000     # ... and one holding more values than this, all its containers together
MAX_DEPTH = 60               # containers nested deeper than this are refused


class RemoteGone(ConnectionError):
    """The other process stopped answering (it exited, crashed or was killed)."""


class TooSlow(RemoteGone):
    """The other process took longer than its allowance (wall clock, the waiting side's own work not
    counted) to answer: it is stuck or asleep, and the channel cannot be trusted to be in step again."""


class TooLarge(RemoteGone):
    """The other process sent a message past a bound (bytes or values): the test it answered earns
    nothing, and both processes start again."""


class OutOfTurn(RemoteGone):
    """The notebook's process sent the judge a request: the judge answers none, so the test it came in
    earns nothing, and both processes start again."""


class JudgeObjectRefused(PermissionError):
    """A check tried to hand the notebook's process an object of the judge's: only data crosses."""


class RemoteError(Exception):
    """An exception raised on the other side whose type this side does not know (a learner's own class)."""

    def __init__(self, type_name: str, message: str):
        super().__init__(message)
        self.type_name = type_name

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def _trusted_module(name: str) -> bool:
    """Modules whose classes may be rebuilt from a name: the engine's own and Python's built-ins."""
    return name == "builtins" or name == "engine" or name.startswith("engine.")


def _resolve(module: str, qualname: str, any_kind: bool = False):
    """The class (or with any_kind, function) `module.qualname` on this side, or None (unknown or
    untrusted module)."""
    if not _trusted_module(module):
        return None
    try:
        target = sys.modules[module]       # only what this side imported itself: receiving imports nothing
        for part in qualname.split("."):
            target = getattr(target, part)
    except Exception:
        return None
    if any_kind and isinstance(target, types.FunctionType) and "<locals>" not in qualname:
        return target
    return target if isinstance(target, type) else None


def _name_of(cls: type) -> tuple[str, str]:
    return cls.__module__, cls.__qualname__


class _Live:
    """A container an attribute holds: sent as a reference, so a caller's append or pop changes the
    owner's own list (an attribute read otherwise copies)."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


_LIVE_TYPES = (list, dict, set)


class Channel:
    """One end of the connection: a table of this side's objects the other side holds, and the socket."""

    def __init__(self, sock: socket.socket, side: str, serve=None):
        self.sock, self.side = sock, side
        self.other = "T" if side == "L" else "L"
        self.objects: dict[int, object] = {}     # id -> object the other side holds a Remote for
        self.remotes: dict[int, Remote] = {}      # the other side's id -> our Remote (one per object)
        self.methods: dict[int, set] = {}         # the other side's id -> names of its class's methods read
        self.serve = serve                        # optional hook: serve(request) -> handled reply or None
        self.unwritten = lambda qualname: False   # whether this side knows `qualname` is not written yet
        self.lock = threading.RLock()
        self.next_call = 0
        self.allowance: float | None = None       # seconds the other side may still take to answer, or None
        self.broken: RemoteGone | None = None     # why it is out of step (too late, too large): raised again
        self.elements_left = MAX_ELEMENTS         # values the message being read may still hold

    # ------------------------------------------------------------------------------------- encoding
    def encode(self, value, depth: int = 0):
        """`value` as JSON-ready data; objects that are not data become references to this side."""
        if depth > MAX_DEPTH:
            raise ValueError("a value nested too deeply to send")
        if value is None or isinstance(value, (bool, str)) or type(value) in (int, float):
            return value
        kind = type(value)
        if kind in (list, tuple, set, frozenset):
            items = [self.encode(v, depth + 1) for v in value]
            return {"~": kind.__name__, "v": items}
        if kind is dict:
            return {"~": "dict", "v": [[self.encode(k, depth + 1), self.encode(v, depth + 1)]
                                      for k, v in value.items()]}
        if isinstance(value, Remote) and value._channel is self:
            return {"~": "ref", "owner": self.other, "id": value._id}
        if kind is _Live:                 # an attribute's list or dict: its owner was handed out already
            return self._encode_ref(value.value)
        if kind is _Method:               # a method of an object the other side holds: the object and a name
            return {"~": "method", "owner": self.side, "id": id(value.target), "name": value.name}
        if kind is _RemoteMethod and value._owner._channel is self:   # sent back: the owner's object and name
            return {"~": "method", "owner": self.other, "id": value._owner._id, "name": value._name}
        if self.side == "T" and _by_name(value):
            return {"~": "class", "c": _name_of(value)}    # the host's own copy of the engine's class
        if isinstance(value, torch.Tensor):
            return self._encode_tensor(value)
        if kind is torch.Generator:       # by its state
            return {"~": "generator", "device": str(value.device),
                    "v": base64.b64encode(bytes(value.get_state().numpy())).decode()}
        if isinstance(value, torch.dtype):
            return {"~": "dtype", "v": str(value).removeprefix("torch.")}
        if isinstance(value, torch.device):
            return {"~": "device", "v": str(value)}
        if kind is torch.Size:
            return {"~": "size", "v": list(value)}
        if kind is slice:
            return {"~": "slice", "v": [self.encode(value.start), self.encode(value.stop), self.encode(value.step)]}
        if value is Ellipsis:
            return {"~": "..."}
        if kind is range:
            return {"~": "range", "v": [value.start, value.stop, value.step]}
        if kind is bytes:
            return {"~": "bytes", "v": base64.b64encode(value).decode()}
        if isinstance(value, numbers.Real) and not isinstance(value, enum.Enum):   # numpy's scalars too
            return int(value) if isinstance(value, numbers.Integral) else float(value)
        if isinstance(value, enum.Enum) and _trusted_module(kind.__module__):
            return {"~": "enum", "c": _name_of(kind), "v": value.name}
        if isinstance(value, BaseException):
            return self._encode_exception(value)
        if (dataclasses.is_dataclass(value) and not isinstance(value, type) and _trusted_module(kind.__module__)
                and kind.__dataclass_params__.frozen):
            fields = {f.name: self.encode(getattr(value, f.name), depth + 1)
                      for f in dataclasses.fields(value)}
            return {"~": "frozen", "c": _name_of(kind), "v": fields}
        if self.side == "T":
            raise JudgeObjectRefused(_not_data(value))
        return self._encode_ref(value)

    def _encode_ref(self, value) -> dict:
        self.objects[id(value)] = value
        cls = value if isinstance(value, type) else type(value)
        known = [_name_of(c) for c in cls.__mro__ if _trusted_module(c.__module__) and c is not object]
        name = getattr(value, "__name__", None)
        return {"~": "ref", "owner": self.side, "id": id(value), "is_class": isinstance(value, type),
                "type": _name_of(type(value)), "known": known[:1], "name": name if isinstance(name, str) else None}

    def _encode_tensor(self, value: torch.Tensor) -> dict:
        """Its values in order (a copy: not its storage, strides or views), as bytes."""
        raw = value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        return {"~": "tensor", "dtype": str(value.dtype).removeprefix("torch."), "shape": list(value.shape),
                "device": str(value.device), "data": base64.b64encode(raw).decode()}

    def _encode_exception(self, error: BaseException) -> dict:
        cls = type(error)
        where = getattr(error, "_course_where", None)
        if where is None:
            where = _learner_frames(error.__traceback__)
        args = []
        for arg in error.args:
            try:
                args.append(self.encode(arg))
            except Exception:
                args.append(str(arg))
        attrs = {}
        for name, value in list(getattr(error, "__dict__", {}).items()):
            if isinstance(name, str) and not name.startswith("_"):
                try:
                    attrs[name] = self.encode(value)
                except Exception:
                    pass
        try:
            message = str(error)
        except Exception:
            message = f"({cls.__name__}: its message could not be shown)"
        return {"~": "error", "c": _name_of(cls), "args": args, "attrs": attrs, "message": message,
                "where": where, "mro": [_name_of(c) for c in cls.__mro__]}

    # ------------------------------------------------------------------------------------- decoding
    def decode(self, data, depth: int = 0):
        """The value `data` stands for on this side (a Remote for the other side's objects)."""
        if depth > MAX_DEPTH:
            raise ValueError("a value nested too deeply to receive")
        if data is None or isinstance(data, (bool, int, float, str)):
            return data
        if isinstance(data, list):        # plain JSON arrays only appear inside tagged values
            raise ValueError("an untagged list on the channel")
        if not isinstance(data, dict):
            raise ValueError(f"a {type(data).__name__} where a tagged value belongs")
        tag = data.get("~")
        value = data.get("v")
        if isinstance(value, list):
            self.elements_left -= len(value)
            if self.elements_left < 0:
                self.broken = TooLarge(f"the notebook's process sent the grader more than {MAX_ELEMENTS:,} values "
                                       "in one answer (the grader's bound)")
                raise self.broken
        if tag in ("list", "tuple", "set", "frozenset"):
            items = [self.decode(v, depth + 1) for v in value]
            return {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}[tag](items)
        if tag == "dict":
            return {self.decode(k, depth + 1): self.decode(v, depth + 1) for k, v in value}
        if tag == "ref":
            if data["owner"] == self.side:
                try:
                    return self.objects[data["id"]]
                except KeyError:
                    raise ValueError("a reference to an object this side never sent") from None
            remote = self.remotes.get(data["id"])
            if remote is None:
                remote = Remote(self, data["id"], data)
                self.remotes[data["id"]] = remote
            return remote
        if tag == "method":               # the host's object and a method's name, either way
            mine = data.get("owner") == self.side == "L"
            owner = self.objects.get(data.get("id")) if mine else (
                self.remotes.get(data.get("id")) if data.get("owner") == self.other else None)
            if owner is None or not isinstance(data.get("name"), str):
                raise ValueError("a method of an object this side holds no reference to")
            if mine:
                return getattr(owner, data["name"])
            self.methods.setdefault(owner._id, set()).add(data["name"])
            return _RemoteMethod(owner, data["name"])
        if tag == "tensor":
            return self._decode_tensor(data)
        if tag == "class" and self.side == "L":
            cls = _resolve(*data["c"], any_kind=True)
            if cls is None:
                raise ValueError(f"unknown class or function {data['c']}")
            return cls
        if tag == "generator":
            generator = torch.Generator(device=str(data.get("device", "cpu")))
            state = base64.b64decode(value)
            generator.set_state(torch.frombuffer(bytearray(state), dtype=torch.uint8))
            return generator
        if tag == "dtype":
            dtype = getattr(torch, str(value), None)
            if not isinstance(dtype, torch.dtype):
                raise ValueError(f"unknown dtype {value!r}")
            return dtype
        if tag == "device":
            return torch.device(str(value))
        if tag == "size":
            return torch.Size(int(v) for v in value)
        if tag == "slice":
            return slice(*(self.decode(v, depth + 1) for v in value))
        if tag == "...":
            return Ellipsis
        if tag == "range":
            return range(*(int(v) for v in value))
        if tag == "bytes":
            return base64.b64decode(value)
        if tag == "enum":
            cls = _resolve(*data["c"])
            if cls is None or not issubclass(cls, enum.Enum):
                raise ValueError(f"unknown enum {data['c']}")
            return cls[value]
        if tag == "frozen":
            cls = _resolve(*data["c"])
            if cls is None or not dataclasses.is_dataclass(cls) or not cls.__dataclass_params__.frozen:
                raise ValueError(f"unknown frozen dataclass {data['c']}")
            names = {f.name for f in dataclasses.fields(cls)}
            if not isinstance(value, dict) or set(value) != names:
                raise ValueError(f"a {cls.__name__} whose fields are not its class's ({sorted(names)})")
            fields = {k: self.decode(v, depth + 1) for k, v in value.items()}
            made = object.__new__(cls)
            for name, field_value in fields.items():
                object.__setattr__(made, name, field_value)
            return made
        if tag == "error":
            return self._decode_exception(data)
        raise ValueError(f"an unknown value on the channel ({tag!r})")

    def _decode_tensor(self, data: dict) -> torch.Tensor:
        dtype = getattr(torch, data["dtype"], None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"unknown dtype {data['dtype']!r}")
        raw = bytearray(base64.b64decode(data["data"]))
        shape = [int(s) for s in data["shape"]]
        if min(shape, default=0) < 0 or len(raw) != math.prod(shape) * torch.empty(0, dtype=dtype).element_size():
            raise ValueError(f"a tensor of shape {shape} whose bytes ({len(raw):,}) do not fit it")
        flat = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
        tensor = flat.view(dtype).reshape(shape)
        device = data.get("device", "cpu")
        return tensor.to(device) if device != "cpu" else tensor

    def _decode_exception(self, data: dict) -> BaseException:
        args = [self.decode(a) if not isinstance(a, str) else a for a in data.get("args", [])]
        error = None
        for module, qualname in data.get("mro", [data["c"]]):   # the first class of it this side knows
            cls = _resolve(module, qualname)
            if cls is None:
                continue
            # Only exceptions a check can expect: never one that stops the process or the channel.
            if not issubclass(cls, Exception) or issubclass(cls, RemoteGone):
                break
            if (module, qualname) != tuple(data["c"]):    # the learner's own class: its nearest known base
                cls = _stand_in(cls, str(data["c"][1]))
            try:
                made = cls.__new__(cls)
                made.args = tuple(args)
                error = made
            except Exception:
                pass
            break
        if error is None:
            error = RemoteError(data["c"][1], data.get("message", ""))
        for name, value in (data.get("attrs") or {}).items():   # the raised exception's own attributes
            try:
                if not hasattr(error, str(name)):
                    setattr(error, str(name), self.decode(value))
            except Exception:
                pass
        error._course_where = data.get("where")
        # "not written yet" is this side's own knowledge of the qualname named, never the sender's word
        qualname = getattr(error, "qualname", None)
        error._course_edition = isinstance(error, NotImplementedError) and isinstance(qualname, str) and \
            self.unwritten(qualname) is True
        error._course_calls_itself = ["engine._edition", "CallsItself"] in data.get("mro", [])
        return error

    # ------------------------------------------------------------------------------------- transport
    def _send(self, message: dict) -> None:
        body = json.dumps(message).encode()
        try:
            self.sock.sendall(_HEADER.pack(len(body)) + body)
        except OSError as error:
            raise RemoteGone(f"the other process is gone ({error})") from None

    def _receive(self) -> dict:
        header = self._read_exactly(_HEADER.size)
        (size,) = _HEADER.unpack(header)
        if size > MAX_FRAME:
            self.broken = TooLarge(f"the notebook's process sent the grader a message of {size:,} bytes (the "
                                   f"grader's bound is {MAX_FRAME:,})")
            raise self.broken
        try:
            message = json.loads(self._read_exactly(size))
        except (ValueError, RecursionError):
            message = None
        if not isinstance(message, dict):
            self.broken = RemoteGone("the other process sent something that is not a message")
            raise self.broken
        self.elements_left = MAX_ELEMENTS
        return message

    def _read_exactly(self, size: int) -> bytes:
        chunks, left = [], size
        while left:
            try:
                chunk = self.sock.recv(min(left, 1 << 22))
            except InterruptedError:
                continue
            if not chunk:
                raise RemoteGone("the other process closed the connection")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def send_plan(self, plan: dict) -> None:
        """The judge's first message: the plan; the host answers once it is ready."""
        self._send({"plan": plan})
        if not self._receive().get("ready"):
            raise RemoteGone("the host did not start")

    def request(self, op: str, target, *args, **kwargs):
        """Ask the other side to do `op` on `target` (a Remote), and wait for its reply (the judge's side:
        the host asks nothing)."""
        if self.broken is not None:       # a check that caught the first raise is not answered either
            raise type(self.broken)(*self.broken.args)
        with self.lock:
            return self._request(op, target, args, kwargs)

    def _request(self, op: str, target, args, kwargs):
        self.next_call += 1
        call = self.next_call
        message = {"call": call, "op": op, "target": target._id if isinstance(target, Remote) else None,
                   "args": self.encode(list(args)), "kwargs": self.encode(dict(kwargs))}
        self._send(message)
        return self._wait(call)

    def _wait(self, call: int):
        message = self._timed_receive()
        if "reply" not in message:        # the judge answers no requests: nothing of it is the host's to call
            self.broken = OutOfTurn("the notebook's process sent the grader a request; the grader answers "
                                    "none (only the grader asks, and the notebook's process answers)")
            raise self.broken
        if message["reply"] != call:
            raise RemoteGone("the other process answered out of turn")
        if "error" in message:
            raise self.decode(message["error"])
        return self.decode(message["value"])

    def _timed_receive(self) -> dict:
        """The next message, within the allowance (what is left of it after the wait)."""
        if self.allowance is None:
            return self._receive()
        started = time.monotonic()
        self.sock.settimeout(max(self.allowance, 0.001))
        try:
            return self._receive()
        except TimeoutError:
            self.broken = TooSlow("the notebook's code took longer than its time to answer")
            raise self.broken from None
        finally:
            self.sock.settimeout(None)
            self.allowance -= time.monotonic() - started

    def answer(self, message: dict) -> None:
        """Do what one request asks, and send the reply (the result, or the exception it raised)."""
        reply = {"reply": message.get("call")}
        try:
            target = self.objects[message["target"]] if message.get("target") is not None else None
            args = self.decode(message.get("args"))
            kwargs = self.decode(message.get("kwargs"))
            reply["value"] = self.encode(self.perform(message.get("op"), target, args, kwargs))
        except RemoteGone:
            raise
        except BaseException as error:  # noqa: BLE001 - it goes back to the caller, as raised
            if isinstance(error, (SystemExit, KeyboardInterrupt)):
                error = RuntimeError(f"{type(error).__name__} during a call from the grader")
            reply["error"] = self.encode(error)
        self._send(reply)

    def perform(self, op: str, target, args: list, kwargs: dict):
        """The operation a request names, on this side's object (the host's: the judge performs none)."""
        if op == "getattr":
            value = getattr(target, args[0])
            if len(args) == 1 and not isinstance(target, (type, types.ModuleType)) and \
                    _class_method(target, args[0], value):
                return _Method(target, args[0])
            return _Live(value) if type(value) in _LIVE_TYPES else value
        if op == "callmethod":            # obj.name(...) in one request
            return getattr(target, args[0])(*args[1:], **kwargs)
        if op == "copy":
            return target
        if op == "setattr":
            setattr(target, args[0], args[1])
            return None
        if op == "call":
            return target(*args, **kwargs)
        if op == "getitem":
            return target[args[0]]
        if op == "setitem":
            target[args[0]] = args[1]
            return None
        if op == "len":
            return len(target)
        if op == "iter":
            return list(target) if not hasattr(target, "__next__") else iter(target)
        if op == "next":
            return next(target)
        if op == "contains":
            return args[0] in target
        if op == "repr":
            return repr(target)
        if op == "str":
            return str(target)
        if op == "bool":
            return bool(target)
        if self.serve is not None:
            return self.serve(op, target, args, kwargs)
        raise ValueError(f"unknown operation {op!r}")


_STAND_INS: dict = {}


def _stand_in(base: type, qualname: str) -> type:
    """A class of this side's, named as the learner's exception class and derived from `base`, the nearest
    class of its own this side knows: `except OutOfBlocks` catches a learner's `class PoolFull(OutOfBlocks)`."""
    name = qualname.rpartition(".")[2][:60]
    name = name if name.isidentifier() else "LearnersError"
    if (base, name) not in _STAND_INS:
        _STAND_INS[base, name] = type(name, (base,), {"__module__": "your notebook"})
    return _STAND_INS[base, name]


def _learner_frames(tb) -> list:
    """[(file name, line, function)] of the traceback's frames, innermost last (for the checks' messages)."""
    frames = []
    while tb is not None:
        code = tb.tb_frame.f_code
        frames.append([code.co_filename, tb.tb_lineno, getattr(code, "co_qualname", code.co_name)])
        tb = tb.tb_next
    return frames[-12:]


class _Method:
    """A method of target's class read as `target.name`: sent as the object and the name, so the judge
    can call it later without asking for the attribute again."""

    __slots__ = ("target", "name")

    def __init__(self, target, name: str):
        self.target, self.name = target, name


def _not_data(value) -> str:
    """Why the judge refused to send `value`, naming it: a check hands the notebook's process data only."""
    inner = getattr(value, "__func__", None) or getattr(value, "func", None) or value
    if isinstance(inner, types.ModuleType):
        what, name = "module", inner.__name__
    elif isinstance(inner, (type, types.FunctionType, types.BuiltinFunctionType)):
        what = "class" if isinstance(inner, type) else "function"
        name = f"{getattr(inner, '__module__', None) or '?'}.{inner.__qualname__}"
    else:
        what, name = "object", f"{type(inner).__module__}.{type(inner).__qualname__}"
    return (f"the grader does not hand the notebook's process its own {what} {name}: a check sends data "
            "only (an object learner code needs is built where the learner's object lives: "
            "engine.checks.where_it_lives, made_beside)")


def _by_name(value) -> bool:
    """An engine class or module-level function, sent by its module and name: the other side takes its own
    copy of it (never a handle to this side's)."""
    return isinstance(value, (type, types.FunctionType)) and _trusted_module(
        getattr(value, "__module__", "") or "") and _resolve(*_name_of(value), any_kind=True) is value


def _class_method(target, name: str, value) -> bool:
    """Whether `value`, just read as `target.name`, is a function of target's class bound to target."""
    import inspect
    if not isinstance(value, types.MethodType) or value.__self__ is not target or isinstance(target, type):
        return False
    if name in (getattr(target, "__dict__", None) or {}):
        return False
    return isinstance(inspect.getattr_static(type(target), name, None), types.FunctionType)


class _RemoteMethod:
    """`remote.name` where that name was a method of the remote object's class: the object and the name.
    Calling it is one request (`callmethod`), so a check that calls a method in a loop pays one round trip
    per call, not two. Anything else done with it asks for the bound method."""

    __slots__ = ("_owner", "_name")

    def __init__(self, owner: "Remote", name: str):
        self._owner, self._name = owner, name

    def __call__(self, *args, **kwargs):
        return self._owner._channel.request("callmethod", self._owner, self._name, *args, **kwargs)

    def _bound(self):
        return self._owner._channel.request("getattr", self._owner, self._name, True)

    def __getattr__(self, name):
        if name in _RemoteMethod.__slots__:
            raise AttributeError(name)           # a copy being built: its slots are not set yet
        if name == "__name__":
            return self._name
        return getattr(self._bound(), name)

    def __repr__(self):
        return repr(self._bound())

    def __eq__(self, other):
        return type(other) is _RemoteMethod and other._owner is self._owner and other._name == self._name

    def __hash__(self):
        return hash((id(self._owner), self._name))


class Remote:
    """An object that lives in the other process. Operations on it are requests to that process."""

    __slots__ = ("_channel", "_id", "_info", "__weakref__")

    def __init__(self, channel: Channel, ident: int, info: dict):
        object.__setattr__(self, "_channel", channel)
        object.__setattr__(self, "_id", ident)
        object.__setattr__(self, "_info", info)

    def _ask(self, op, *args, **kwargs):
        return self._channel.request(op, self, *args, **kwargs)

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__") and name not in _FORWARDED_DUNDERS:
            raise AttributeError(name)
        if name in self._channel.methods.get(self._id, ()):   # the class's method, read before: not asked again
            return _RemoteMethod(self, name)
        return self._ask("getattr", name)

    def __setattr__(self, name, value):
        self._channel.methods.get(self._id, set()).discard(name)     # set on the object: it hides the class's
        self._ask("setattr", name, value)

    def __call__(self, *args, **kwargs):
        return self._ask("call", *args, **kwargs)

    def __getitem__(self, key):
        return self._ask("getitem", key)

    def __setitem__(self, key, value):
        self._ask("setitem", key, value)

    def __len__(self):
        return self._ask("len")

    def __iter__(self):
        items = self._ask("iter")
        return iter(items) if isinstance(items, list) else _RemoteIterator(items)

    def __next__(self):
        return self._ask("next")

    def __contains__(self, item):
        return self._ask("contains", item)

    def __bool__(self):
        return self._ask("bool")

    def __repr__(self):
        return self._ask("repr")

    def __str__(self):
        return self._ask("str")

    def __eq__(self, other):
        """The same object, or a remote list or dict with equal contents; the other side's own __eq__
        is never asked (an object that says yes to everything would pass for the right answer)."""
        if self is other:
            return True
        contents = Remote.plain_copy(self)
        return type(contents) is not Remote and contents == _contents(other)

    def __ne__(self, other):
        return not self.__eq__(other)

    def __hash__(self):
        return hash((self._info.get("owner"), self._id))

    @property
    def __class__(self):
        """The nearest engine class of the remote object's type (so isinstance sees what the engine
        would), else Remote."""
        for module, qualname in self._info.get("known") or []:
            cls = _resolve(module, qualname) if str(module).startswith("engine") else None
            if cls is not None:
                return type if self._info.get("is_class") else cls
        return Remote

    @property
    def __name__(self):
        return self._info.get("name") or self._ask("getattr", "__name__")

    # A remote list joined with another: its contents, as data.
    def __add__(self, other):
        return Remote.plain_copy(self) + _contents(other)

    def __mro_entries__(self, bases):
        raise TypeError("a class of the learner's process cannot be subclassed in the judge's: build the "
                        "subclass where the class lives (engine.checks.where_it_lives)")

    @staticmethod
    def plain_copy(remote):
        """The remote container's contents, as data (for comparing with a plain value)."""
        return remote._ask("copy")

    @staticmethod
    def call_there(remote, fn, *args, **kwargs):
        """Call the engine's `fn` (by its module and name) in the process `remote` lives in."""
        return remote._channel.request("call_engine", None, fn.__module__, fn.__qualname__, *args, **kwargs)


_FORWARDED_DUNDERS = {"__qualname__", "__wrapped__", "__func__", "__self__", "__signature__", "__annotations__",
                      "__defaults__", "__kwdefaults__", "__dict__", "__mro__", "__file__", "__version__"}


def _contents(value):
    return Remote.plain_copy(value) if type(value) is Remote else value


class _RemoteIterator:
    def __init__(self, remote: Remote):
        self.remote = remote

    def __iter__(self):
        return self

    def __next__(self):
        return self.remote._ask("next")


def reap_children() -> None:
    """Collect the exit status of every child that ended (the host's notebook processes, the warm
    process's judges), so none stays a zombie; returns when none is left to collect."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
