"""Attention over the paged KV pool: `paged_attention` picks the torch reference or a Triton kernel.

Importing this package is cheap and needs no Triton: the kernel modules (triton_decode,
triton_prefill) are imported only when a Triton backend is first used. Triton ships Linux wheels
only, so on macOS or Windows everything but the kernels works.
"""

from __future__ import annotations

import importlib.util
import os
import sys

import torch

KERNEL_MODULES = ("engine.attention.triton_decode", "engine.attention.triton_prefill",
                  "engine.attention.triton_primer")
BACKENDS = ("auto", "torch", "triton", "sdpa")


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


_SM_COUNTS: dict = {}


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device, asked once per device (the decode path asks every layer)."""
    key = device.index
    if key not in _SM_COUNTS:
        _SM_COUNTS[key] = torch.cuda.get_device_properties(device).multi_processor_count
    return _SM_COUNTS[key]


def choose_num_splits(batch: int, kv_heads: int, max_blocks: int, block_size: int, device: torch.device) -> int:
    """Split-K count for decode: split only when (sequence, KV head) programs cannot fill the GPU's SMs.

    See `decode_config.split_count`: about two programs per SM, slices of at least 512 keys, at most
    16 splits. Uses the block table's width as the context bound, so it never reads lengths off the GPU.
    """
    if device.type != "cuda":
        return 1
    from engine.attention.decode_config import split_count
    return split_count(batch, kv_heads, max_blocks, block_size, sm_count(device))


def paged_attention(q, k_pool, v_pool, block_tables, q_positions, kv_lens, backend: str = "auto",
                    num_splits: int | None = None) -> torch.Tensor:
    """Attention of q [B, Hq, T, D] over each row's paged history; returns [B, Hq, T, D].

    k_pool, v_pool [N, Hkv, block_size, D]; block_tables [B, M] int; q_positions [B, T] long
    (-1 for padding); kv_lens [B] long. backend "auto" runs Triton on CUDA tensors (when
    installed) and "sdpa" (fused torch attention) otherwise; "torch" is the plain reference the
    kernels are checked against. With Triton, T == 1 uses the decode kernel (split-K when
    num_splits > 1, or when the heuristic picks it), longer T the prefill kernel.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        backend = "triton" if q.is_cuda and triton_installed() else "sdpa"
    if backend == "sdpa":                     # the fast torch path: gather, then fused attention
        from engine.attention.sdpa import paged_sdpa
        return paged_sdpa(q, k_pool, v_pool, block_tables, q_positions, kv_lens)
    if backend == "torch":
        from engine.attention.paged_reference import paged_attention_reference
        return paged_attention_reference(q, k_pool, v_pool, block_tables, q_positions, kv_lens)
    prepare_triton()
    if q.ndim == 4 and q.shape[2] == 1:
        from engine.attention.triton_decode import paged_decode
        if num_splits is None:
            num_splits = choose_num_splits(q.shape[0], k_pool.shape[1], block_tables.shape[-1],
                                           k_pool.shape[2], q.device)
        return paged_decode(q, k_pool, v_pool, block_tables, q_positions, kv_lens, num_splits=num_splits)
    from engine.attention.triton_prefill import paged_prefill
    return paged_prefill(q, k_pool, v_pool, block_tables, q_positions, kv_lens)
