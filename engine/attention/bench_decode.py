"""Decode bandwidth: the paged Triton kernel against torch SDPA on the same KV laid out contiguously.

    python -m engine.attention.bench_decode [--batch 64] [--contexts 1024 2048] [--peak-gbs 3350]

Decode reads every cached key and value once per token and does little math on them, so its
speed limit is memory bandwidth: the figure of merit is bytes of K/V read per second, next to
the card's peak. Prints one JSON line per (context, implementation). Without a GPU it runs a
tiny check in Triton's interpreter instead and exits 0.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from engine.attention import choose_num_splits, prepare_triton, triton_installed
from engine.attention.paged_reference import gather_history, paged_attention_reference

# Peak HBM bandwidth in GB/s by device-name fragment; the first match wins, so specific names come first.
PEAK_GBS = (
    ("H200", 4800), ("H100 NVL", 3900), ("H100 PCIe", 2000), ("H100", 3350),
    ("A100-SXM4-80GB", 2039), ("A100 80GB PCIe", 1935), ("A100", 1555), ("L4", 300),
)
# Qwen3-0.6B's attention: 16 query heads share 8 KV heads of dimension 128.
Q_HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE = 16, 8, 128, 16


def peak_bandwidth(device_name: str, override: float | None = None) -> float | None:
    """The card's peak GB/s: --peak-gbs if given, else from PEAK_GBS by name, else None (unknown card)."""
    if override:
        return override
    return next((gbs for fragment, gbs in PEAK_GBS if fragment in device_name), None)


def scrambled_batch(batch: int, context: int, dtype: torch.dtype, device, seed: int = 0):
    """A full pool of `batch` sequences of `context` tokens whose blocks are spread over it in random order."""
    gen = torch.Generator(device=device).manual_seed(seed)
    blocks_per_seq = -(-context // BLOCK_SIZE)
    shape = (batch * blocks_per_seq, KV_HEADS, BLOCK_SIZE, HEAD_DIM)
    k_pool = torch.randn(shape, generator=gen, device=device, dtype=dtype)
    v_pool = torch.randn(shape, generator=gen, device=device, dtype=dtype)
    tables = torch.randperm(shape[0], generator=gen, device=device).view(batch, blocks_per_seq)
    q = torch.randn(batch, Q_HEADS, 1, HEAD_DIM, generator=gen, device=device, dtype=dtype)
    kv_lens = torch.full((batch,), context, device=device, dtype=torch.long)
    return q, k_pool, v_pool, tables, (kv_lens - 1)[:, None], kv_lens


def kv_bytes(batch: int, context: int, dtype: torch.dtype) -> int:
    """Bytes of K and V one decode step must read: every cached key and value of every sequence."""
    return 2 * batch * context * KV_HEADS * HEAD_DIM * torch.finfo(dtype).bits // 8


FP16_TOLERANCE = 1e-2   # fp16 inputs, fp32 math: differences stay near fp16's resolution


def bench_context(batch: int, context: int, peak: float | None, num_splits: int | None) -> list[dict]:
    """Time the paged kernel and contiguous SDPA at one context length; one result dict each."""
    from triton.testing import do_bench

    from engine.attention.triton_decode import paged_decode

    device, dtype = torch.device("cuda"), torch.float16
    q, k_pool, v_pool, tables, positions, kv_lens = scrambled_batch(batch, context, dtype, device)
    splits = num_splits or choose_num_splits(batch, KV_HEADS, tables.shape[1], BLOCK_SIZE, device)
    paged = lambda: paged_decode(q, k_pool, v_pool, tables, positions, kv_lens, num_splits=splits)  # noqa: E731
    # SDPA's input: the same keys and values gathered into one contiguous [B, Hkv, L, D] tensor each.
    keys = gather_history(k_pool, tables, kv_lens).contiguous()
    values = gather_history(v_pool, tables, kv_lens).contiguous()
    sdpa = lambda: torch.nn.functional.scaled_dot_product_attention(q, keys, values, enable_gqa=True)  # noqa: E731
    max_diff = (paged().float() - sdpa().float()).abs().max().item()
    results = []
    for name, run, extra in (("paged_triton", paged, {"num_splits": splits}), ("sdpa_contiguous", sdpa, {})):
        ms = do_bench(run)
        gbs = kv_bytes(batch, context, dtype) / (ms * 1e-3) / 1e9
        results.append({"impl": name, "batch": batch, "context": context, "dtype": "float16", **extra,
                        "ms": round(ms, 4), "gbs": round(gbs, 1), "peak_gbs": peak,
                        "fraction_of_peak": round(gbs / peak, 3) if peak else None,
                        "max_abs_diff_vs_sdpa": max_diff})
    return results        # the pools go with this frame; the caller empties CUDA's cache between contexts


def compare_kernels(batch: int = 32, context: int = 4096, kernel=None, peak_gbs: float | None = None) -> list[dict]:
    """On CUDA, one fp16 batch: the per-head kernel (or `kernel`, a kernel with its signature), the
    grouped kernel `paged_attention` runs, and SDPA on the same K/V made contiguous.

    One dict per implementation: ms per step, GB/s of K/V read, the fraction of the card's peak and
    of SDPA's bandwidth, and the largest difference from SDPA's output.
    """
    from triton.testing import do_bench

    from engine.attention.triton_decode import paged_decode, paged_decode_per_head

    device, dtype = torch.device("cuda"), torch.float16
    peak = peak_bandwidth(torch.cuda.get_device_name(), peak_gbs)
    q, k_pool, v_pool, tables, positions, kv_lens = scrambled_batch(batch, context, dtype, device)
    keys = gather_history(k_pool, tables, kv_lens).contiguous()
    values = gather_history(v_pool, tables, kv_lens).contiguous()
    splits = choose_num_splits(batch, KV_HEADS, tables.shape[1], BLOCK_SIZE, device)
    runs = {
        "sdpa_contiguous": lambda: torch.nn.functional.scaled_dot_product_attention(q, keys, values,
                                                                                    enable_gqa=True),
        "per_head_kernel": lambda: paged_decode_per_head(q, k_pool, v_pool, tables, positions, kv_lens,
                                                         kernel=kernel),
        "grouped_kernel": lambda: paged_decode(q, k_pool, v_pool, tables, positions, kv_lens, num_splits=splits),
    }
    expected = runs["sdpa_contiguous"]().float()
    rows = []
    for name, run in runs.items():
        diff = (run().float() - expected).abs().max().item()
        ms = do_bench(run)
        gbs = kv_bytes(batch, context, dtype) / (ms * 1e-3) / 1e9
        rows.append({"impl": name, "batch": batch, "context": context, "ms": round(ms, 4), "gbs": round(gbs, 1),
                     "peak_gbs": peak, "fraction_of_peak": round(gbs / peak, 3) if peak else None,
                     "max_abs_diff_vs_sdpa": diff})
    sdpa_gbs = rows[0]["gbs"]
    for row in rows:
        row["vs_sdpa"] = round(row["gbs"] / sdpa_gbs, 3)
    return rows


def smoke_in_interpreter() -> dict:
    """A few tokens through the decode kernel in Triton's interpreter, checked against the torch reference."""
    from engine.attention.triton_decode import paged_decode

    args = scrambled_batch(batch=2, context=40, dtype=torch.float32, device="cpu")
    diff = (paged_decode(*args, num_splits=2) - paged_attention_reference(*args)).abs().max().item()
    return {"smoke": "decode, batch 2, context 40, interpreter", "max_abs_diff_vs_reference": diff, "ok": diff < 1e-4}


def main(argv: list[str] | None = None) -> int:
    """Parse the flags; benchmark on CUDA, or explain and smoke-test on a CPU."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--contexts", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--peak-gbs", type=float, default=None, help="the card's peak memory bandwidth, GB/s")
    parser.add_argument("--splits", type=int, default=None, help="split-K count (default: the dispatch heuristic)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(json.dumps({"note": "bench_decode measures GPU memory bandwidth and needs a CUDA device; "
                                  "running a tiny interpreter smoke test instead"}))
        if triton_installed():
            prepare_triton()
            smoke = smoke_in_interpreter()
            print(json.dumps(smoke))
            return 0 if smoke["ok"] else 1
        return 0
    name = torch.cuda.get_device_name()
    peak = peak_bandwidth(name, args.peak_gbs)
    print(json.dumps({"device": name, "peak_gbs": peak, "q_heads": Q_HEADS, "kv_heads": KV_HEADS,
                      "head_dim": HEAD_DIM, "block_size": BLOCK_SIZE}), flush=True)
    worst = 0.0
    for context in args.contexts:
        for result in bench_context(args.batch, context, peak, args.splits):
            print(json.dumps(result), flush=True)
            worst = max(worst, result["max_abs_diff_vs_sdpa"])
        torch.cuda.empty_cache()          # the last context's pools are gone: hand their memory back
    if worst > FP16_TOLERANCE:            # a fast kernel that computes the wrong thing is a failure
        print(json.dumps({"error": f"paged kernel differs from SDPA by {worst:.3g} > {FP16_TOLERANCE}"}))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
