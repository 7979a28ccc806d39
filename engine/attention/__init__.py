"""Attention over the paged KV pool: `paged_attention` picks the torch reference or a Triton kernel.

Importing this package is cheap and needs no Triton: the kernel modules (triton_decode,
triton_prefill) are imported only when a Triton backend is first used. Triton ships Linux wheels
only, so on macOS or Windows everything but the kernels works. The Triton setup (installed or not,
interpreter or GPU, stand-ins) lives in `triton_setup`; its names are re-exported here.
"""

from __future__ import annotations

import torch

from engine.attention.triton_setup import (  # noqa: F401  (re-exported: notebooks, checks and tools import them here)
    KERNEL_MODULES, TritonUnavailable, prepare_triton, require_triton, triton_installed, triton_modules,
    use_interpreter_without_gpu,
)

BACKENDS = ("auto", "torch", "triton", "sdpa")


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
