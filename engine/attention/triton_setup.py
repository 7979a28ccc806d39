"""Triton setup for the kernel modules: is Triton installed, interpreter or GPU, and stand-ins without it.

The kernel modules (triton_decode, triton_prefill, triton_primer) call `prepare_triton` before
`import triton`; a notebook asks `triton_modules` for (triton, tl). Nothing here imports Triton
itself, and nothing imports the kernel modules, so they sit above this module (no import circle).
"""

from __future__ import annotations

import importlib.util
import os
import sys

import torch

KERNEL_MODULES = ("engine.attention.triton_decode", "engine.attention.triton_prefill",
                  "engine.attention.triton_primer")


class TritonUnavailable(RuntimeError):
    """Triton is not installed here, so the Triton backend cannot run."""


def triton_installed() -> bool:
    """Whether triton is installed, checked without importing it (importing it costs seconds)."""
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):  # a broken install, or a stub module without a spec
        return False


def require_triton() -> None:
    """Raise TritonUnavailable, saying where the kernels can run, when Triton is not installed."""
    if not triton_installed():
        raise TritonUnavailable(
            f"backend='triton' needs the triton package, which is not installed for this Python ({sys.platform}). "
            "Triton ships Linux wheels only: run the kernel chapter on Linux, in WSL2 on Windows, or in a hosted "
            "notebook (Colab, Kaggle). backend='torch' computes the same attention everywhere."
        )


def use_interpreter_without_gpu() -> bool:
    """Set TRITON_INTERPRET=1 when there is no CUDA device, so the kernels run on the CPU; returns whether it is on.

    Triton reads the switch when a kernel is *defined* (@triton.jit), so it must be set before
    the kernel modules are imported; once they exist compiled, setting it changes nothing.
    """
    if os.environ.get("TRITON_INTERPRET") == "1":
        return True
    if torch.cuda.is_available():
        return False
    # A kernel module records INTERPRETED once its kernels exist (a module still importing has not yet).
    compiled = [name for name in KERNEL_MODULES if getattr(sys.modules.get(name), "INTERPRETED", None) is False]
    if compiled:
        raise RuntimeError(
            f"{', '.join(compiled)} already defined its kernels without TRITON_INTERPRET=1 on a machine without "
            "CUDA, so they are compiled for a GPU that is not there. Set TRITON_INTERPRET=1 before the first import "
            "of triton or engine.attention's kernels (at the top of the notebook, or in the shell), then restart."
        )
    os.environ["TRITON_INTERPRET"] = "1"
    return True


def prepare_triton() -> bool:
    """Check Triton is installed and choose interpreter or GPU; the kernel modules call it before `import triton`."""
    require_triton()
    return use_interpreter_without_gpu()


class _Unavailable:
    """Stands in for `triton` and `triton.language` where Triton is not installed (macOS, Windows).

    Kernels still *define* (`@triton.jit` returns a stand-in, `tl.constexpr` is a name), so a
    notebook's other cells run; launching one raises TritonUnavailable, which says why.
    """

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str):
        if attr == "jit":
            return _unavailable_kernel
        return _Unavailable(f"{self._name}.{attr}")

    def __call__(self, *args, **kwargs):
        require_triton()


class _UnavailableKernel:
    """What `@triton.jit` gives without Triton: indexing it with a grid and launching raises."""

    def __init__(self, fn):
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", "kernel")

    def __getitem__(self, grid):
        return self

    def __call__(self, *args, **kwargs):
        require_triton()


def _unavailable_kernel(fn=None, **kwargs):
    return _UnavailableKernel(fn) if fn is not None else _UnavailableKernel


def triton_modules():
    """(triton, triton.language) for a notebook: the real ones, or stand-ins where Triton cannot install.

    With Triton, this first turns on the interpreter when there is no CUDA device (before any
    kernel is defined). Without it, kernels defined with the stand-ins raise TritonUnavailable
    when launched, and everything that does not launch a kernel still works.
    """
    if not triton_installed():
        return _Unavailable("triton"), _Unavailable("triton.language")
    prepare_triton()
    import triton
    import triton.language as tl
    return triton, tl
