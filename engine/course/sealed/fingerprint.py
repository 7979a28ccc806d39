"""What a function does, with its names taken out: the same code after renaming reads the same here.

A code object's fingerprint hashes its bytecode (operations and their arguments: renaming identifiers
consistently keeps every name's index, so the bytes stay the same), its argument counts and its
constants (nested functions by their own fingerprints; the docstring left out). It leaves out every
name (co_names, variables, the function's own name), the file it was compiled from and its line
numbers, so neither `exec`, `compile` under another file name, reformatting nor renaming changes it.

Short functions are not compared: a three-operation formula is written the same way by everyone, so
only code of at least MIN_OPS operations (nested functions included) gets a fingerprint.
"""
from __future__ import annotations

import hashlib
import types

MIN_OPS = 24


def operations(code: types.CodeType) -> int:
    """The number of bytecode operations of `code` and of the functions nested in it."""
    count = len(code.co_code) // 2
    return count + sum(operations(c) for c in code.co_consts if isinstance(c, types.CodeType))


def _feed(code: types.CodeType, digest) -> None:
    digest.update(b"code")
    digest.update(code.co_code)
    digest.update(repr((code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount,
                        code.co_flags & 0x2F, len(code.co_varnames), len(code.co_names))).encode())
    consts = list(code.co_consts)
    if consts and (consts[0] is None or isinstance(consts[0], str)) and code.co_flags & 0x0F:
        # a function's docstring, or the None that stands in its place when it has none
        consts = consts[1:]
    for const in consts:
        if isinstance(const, types.CodeType):
            _feed(const, digest)
        else:
            digest.update(repr((type(const).__name__, const)).encode(errors="replace"))


def fingerprint(code: types.CodeType) -> str | None:
    """The hex fingerprint of a function's code, or None when it is too short to compare."""
    if not isinstance(code, types.CodeType) or operations(code) < MIN_OPS:
        return None
    digest = hashlib.sha256()
    _feed(code, digest)
    return digest.hexdigest()


def code_of(value) -> types.CodeType | None:
    """The code object behind a function, method, static/class method or Triton kernel."""
    value = getattr(value, "__func__", value)
    value = getattr(value, "fn", value) if not isinstance(value, types.FunctionType) else value
    code = getattr(value, "__code__", None)
    return code if isinstance(code, types.CodeType) else None


def every_code(code: types.CodeType):
    """`code` and every code object nested in it."""
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from every_code(const)
