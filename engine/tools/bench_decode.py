"""Decode bandwidth: the paged Triton kernels against torch SDPA on the same K/V laid out contiguously.

    python -m engine.tools.bench_decode [--batch 64] [--contexts 1024 4096 16384] [--dtype float16]
                                            [--peak-gbs GBS] [--splits S] [--no-tune] [--ladder]

Decode reads every cached key and value once per token and does little math on them, so its speed
limit is memory bandwidth: the figure of merit is bytes of K/V read per second, next to the card's
peak (found by name in PEAK_GBS, or --peak-gbs) and next to SDPA reading the same bytes from one
contiguous tensor. Per context it prints one JSON line per implementation: the engine's kernel with
its default config, the fastest of the config candidates (each candidate's time listed), and SDPA.
`--ladder` adds the steps from the chapter's per-head kernel to the engine's (group the heads, the
dtype of the products, split-K), each measured. Without a GPU it runs a tiny correctness check in
Triton's interpreter instead (no timing: the interpreter runs at the speed of Python) and exits 0.
"""
from __future__ import annotations

import json
import sys

import torch

from engine.attention import choose_num_splits, prepare_triton, triton_installed
from engine.attention.paged_reference import gather_history, paged_attention_reference
from engine.tools.cli_args import Distinct, Parser, int_in, positive_float
from engine.errors import InputError
from engine.blocks import ceil_div

# Peak HBM bandwidth in GB/s by a fragment of torch.cuda.get_device_name(); the first match wins, so the
# specific names come first. None: a known name whose peak depends on the variant (pass --peak-gbs).
PEAK_GBS = (
    ("GH200", None), ("H200", 4800), ("H100 NVL", 3900), ("H100 PCIe", 2000), ("H100", 3350),
    ("A100-SXM4-80GB", 2039), ("A100 80GB PCIe", 1935), ("A100", 1555), ("L40", 864), ("A10", 600),
    ("L4", 300),
)
# Qwen3-0.6B's attention: 16 query heads share 8 KV heads of dimension 128; the engine's 16-token blocks.
Q_HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE = 16, 8, 128, 16
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
# Largest |paged - SDPA| accepted: both accumulate in float32, then round to the output dtype.
TOLERANCE = {torch.float16: 1e-2, torch.bfloat16: 5e-2, torch.float32: 1e-4}
MAX_BATCH, MAX_CONTEXT = 4096, 1 << 20


def peak_bandwidth(device_name: str, override: float | None = None) -> float | None:
    """The card's peak GB/s: --peak-gbs if given, else from PEAK_GBS by name, else None (unknown card)."""
    if override:
        return override
    return next((gbs for fragment, gbs in PEAK_GBS if fragment in device_name), None)


def scrambled_batch(batch: int, context: int, dtype: torch.dtype, device, seed: int = 0):
    """A full pool of `batch` sequences of `context` tokens whose blocks are spread over it in random order."""
    gen = torch.Generator(device=device).manual_seed(seed)
    blocks_per_seq = ceil_div(context, BLOCK_SIZE)
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


def check_fits(batch: int, contexts: list[int], dtype: torch.dtype) -> None:
    """Refuse, before allocating, a run whose pools and their contiguous copy exceed the free GPU memory."""
    free, _ = torch.cuda.mem_get_info()
    need = 2.2 * kv_bytes(batch, max(contexts), dtype)      # the pool, SDPA's contiguous copy, slack
    if need > free:
        raise InputError(f"--batch {batch} x --contexts {max(contexts)} need about {need / 2**30:.1f} GiB of GPU "
                         f"memory (the paged pool and its contiguous copy), {free / 2**30:.1f} GiB are free: "
                         "lower them")


class Bench:
    """One batch on the GPU: the paged inputs, SDPA's contiguous copy, and a timer for every implementation.

    `device` and `timer` (a function of a callable, returning ms) exist for the CPU test of this code,
    which runs tiny shapes in the interpreter with a stand-in timer: its figures mean nothing.
    """

    def __init__(self, batch: int, context: int, dtype: torch.dtype = torch.float16, peak_gbs: float | None = None,
                 device: str = "cuda", timer=None):
        self.batch, self.context, self.dtype = batch, context, dtype
        self.device, self.timer = torch.device(device), timer
        name = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else ""
        self.peak = peak_bandwidth(name, peak_gbs)
        self.args = scrambled_batch(batch, context, dtype, self.device)
        q, k_pool, v_pool, tables, _, kv_lens = self.args
        # SDPA's input: the same keys and values gathered into one contiguous [B, Hkv, L, D] tensor each.
        self.keys = gather_history(k_pool, tables, kv_lens).contiguous()
        self.values = gather_history(v_pool, tables, kv_lens).contiguous()
        self.expected = self.sdpa().float()
        self.sdpa_gbs: float | None = None

    def sdpa(self) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(self.args[0], self.keys, self.values,
                                                                enable_gqa=True)

    def splits(self) -> int:
        """The engine's split-K choice for this batch (see engine.attention.choose_num_splits)."""
        return choose_num_splits(self.batch, KV_HEADS, self.args[3].shape[1], BLOCK_SIZE, self.device)

    def ms(self, run) -> float:
        if self.timer is not None:
            return self.timer(run)
        from triton.testing import do_bench
        return do_bench(run)

    def row(self, impl: str, run, **extra) -> dict:
        """Time `run`; its output's largest difference from SDPA's, GB/s, the fraction of peak and of SDPA."""
        diff = float((run().float() - self.expected).abs().max())
        ms = self.ms(run)
        gbs = kv_bytes(self.batch, self.context, self.dtype) / (ms * 1e-3) / 1e9
        if impl == "sdpa_contiguous":
            self.sdpa_gbs = gbs
        return {"impl": impl, "batch": self.batch, "context": self.context,
                "dtype": str(self.dtype).removeprefix("torch."), **extra, "ms": round(ms, 4),
                "gbs": round(gbs, 1), "peak_gbs": self.peak,
                "fraction_of_peak": round(gbs / self.peak, 3) if self.peak else None,
                "vs_sdpa": round(gbs / self.sdpa_gbs, 3) if self.sdpa_gbs else None,
                "max_abs_diff_vs_sdpa": diff}


def bench_context(batch: int, context: int, dtype: torch.dtype, peak_gbs: float | None = None,
                  num_splits: int | None = None, tune: bool = True, **where) -> list[dict]:
    """SDPA, the engine's kernel (default config) and, with `tune`, the fastest candidate config."""
    from engine.attention.decode_config import candidates, default_config, fastest
    from engine.attention.triton_decode import dtype_name, paged_decode

    bench = Bench(batch, context, dtype, peak_gbs, **where)
    splits = num_splits or bench.splits()
    rows = [bench.row("sdpa_contiguous", bench.sdpa)]
    default = default_config(dtype_name(dtype), HEAD_DIM, Q_HEADS // KV_HEADS)

    def run(config):
        return lambda: paged_decode(*bench.args, num_splits=splits, config=config)

    rows.append(bench.row("paged_triton", run(default), num_splits=splits, config=default.label()))
    if tune:
        best, times = fastest(candidates(dtype_name(dtype), HEAD_DIM, Q_HEADS // KV_HEADS),
                              lambda config: bench.ms(run(config)))
        rows.append(bench.row("paged_triton_tuned", run(best), num_splits=splits, config=best.label(),
                              candidates_ms=times))
    return rows


def ladder(batch: int = 32, context: int = 4096, kernel=None, peak_gbs: float | None = None,
           dtype: torch.dtype = torch.float16, **where) -> list[dict]:
    """From the chapter's per-head kernel to the engine's, one change at a time, each measured.

    per_head: one program per query head (`kernel`: a learner's, else the engine's per-head kernel);
    grouped: one program per KV head for the whole group, float32 elementwise products ("sum");
    grouped_fp16_dot: the products as tl.dot in the storage dtype, float32 accumulation (tensor cores);
    split_k: the better of the two with the history cut into slices (at least 2; the engine's choice
    here is in `engine_splits`); then SDPA on the contiguous copy, the bar to compare with.
    """
    from engine.attention.decode_config import DecodeConfig, default_config, sum_block_n
    from engine.attention.triton_decode import dtype_name, paged_decode, paged_decode_per_head

    bench = Bench(batch, context, dtype, peak_gbs, **where)
    sdpa = bench.row("sdpa_contiguous", bench.sdpa)
    group = Q_HEADS // KV_HEADS
    summed = DecodeConfig(sum_block_n(HEAD_DIM, group), "sum")
    dotted = DecodeConfig(64, "dot")
    rows = [bench.row("per_head", lambda: paged_decode_per_head(*bench.args, kernel=kernel))]
    rows.append(bench.row("grouped", lambda: paged_decode(*bench.args, config=summed), config=summed.label()))
    rows.append(bench.row("grouped_fp16_dot", lambda: paged_decode(*bench.args, config=dotted),
                          config=dotted.label()))
    better = summed if rows[1]["ms"] <= rows[2]["ms"] else dotted
    splits = max(2, bench.splits())
    rows.append(bench.row("split_k", lambda: paged_decode(*bench.args, num_splits=splits, config=better),
                          config=better.label(), num_splits=splits, engine_splits=bench.splits(),
                          engine_config=default_config(dtype_name(dtype), HEAD_DIM, group).label()))
    return rows + [sdpa]


def compare_kernels(batch: int = 32, context: int = 4096, kernel=None, peak_gbs: float | None = None,
                    **where) -> list[dict]:
    """On CUDA, one fp16 batch: the per-head kernel (or `kernel`, with its signature), the grouped kernel
    `paged_attention` runs (default config, the engine's split count), and SDPA on the same K/V made
    contiguous. One dict per implementation: ms, GB/s, fraction of peak and of SDPA, largest |Δ| from SDPA."""
    from engine.attention.triton_decode import paged_decode, paged_decode_per_head

    bench = Bench(batch, context, torch.float16, peak_gbs, **where)
    splits = bench.splits()
    return [bench.row("sdpa_contiguous", bench.sdpa),
            bench.row("per_head_kernel", lambda: paged_decode_per_head(*bench.args, kernel=kernel)),
            bench.row("grouped_kernel", lambda: paged_decode(*bench.args, num_splits=splits), num_splits=splits)]


def smoke_in_interpreter() -> dict:
    """A few tokens through the decode kernels in Triton's interpreter, checked against the torch reference."""
    from engine.attention.triton_decode import paged_decode

    args = scrambled_batch(batch=2, context=40, dtype=torch.float32, device="cpu")
    expected = paged_attention_reference(*args)
    diff = max(float((paged_decode(*args, num_splits=splits) - expected).abs().max()) for splits in (1, 2))
    return {"smoke": "decode, batch 2, context 40, 1 and 2 splits, interpreter", "max_abs_diff_vs_reference": diff,
            "ok": diff < 1e-4}


def parser() -> Parser:
    """The options; each refused before any work in one `error: ...` line (exit 2)."""
    p = Parser(prog="python -m engine.tools.bench_decode", description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int_in(1, MAX_BATCH), default=64, help=f"sequences, 1 to {MAX_BATCH}")
    p.add_argument("--contexts", type=int_in(1, MAX_CONTEXT), nargs="+", action=Distinct,
                   default=[1024, 4096, 16384], help=f"tokens per sequence, 1 to {MAX_CONTEXT}, each once")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="float16", help="the pools' dtype")
    p.add_argument("--peak-gbs", type=positive_float, default=None,
                   help="the card's peak memory bandwidth in GB/s [found by name: H100, H200, A100, L4...]")
    p.add_argument("--splits", type=int_in(1, 64), default=None,
                   help="split-K count, 1 to 64 [the engine's choice for the batch]")
    p.add_argument("--no-tune", action="store_true", help="skip timing the config candidates")
    p.add_argument("--ladder", action="store_true",
                   help="also the steps from the per-head kernel to the engine's, at batch 32 x 4096 and 4 x 16384")
    return p


def main(argv: list[str] | None = None) -> int:
    """Parse and check the options; benchmark on CUDA, or say why not and smoke-test on a CPU."""
    try:
        args = parser().parse_args(argv)
    except SystemExit as stop:                 # --help (0), or a refused option (2, one line printed)
        return stop.code
    dtype = DTYPES[args.dtype]
    if not torch.cuda.is_available():
        print(json.dumps({"note": "bench_decode measures GPU memory bandwidth and needs a CUDA device; "
                                  "running a tiny interpreter check instead (no timing)"}))
        if triton_installed():
            prepare_triton()
            smoke = smoke_in_interpreter()
            print(json.dumps(smoke))
            return 0 if smoke["ok"] else 1
        return 0
    try:
        check_fits(args.batch, args.contexts, dtype)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name()
    peak = peak_bandwidth(name, args.peak_gbs)
    print(json.dumps({"device": name, "peak_gbs": peak, "q_heads": Q_HEADS, "kv_heads": KV_HEADS,
                      "head_dim": HEAD_DIM, "block_size": BLOCK_SIZE,
                      "note": None if peak else "unknown card: pass --peak-gbs for fractions of peak"}), flush=True)
    worst = 0.0
    for context in args.contexts:
        for result in bench_context(args.batch, context, dtype, peak, args.splits, tune=not args.no_tune):
            print(json.dumps(result), flush=True)
            worst = max(worst, result["max_abs_diff_vs_sdpa"])
        torch.cuda.empty_cache()              # the last context's pools are gone: hand their memory back
    if args.ladder:
        for batch, context in ((32, 4096), (4, 16384)):
            for result in ladder(batch, context, peak_gbs=peak, dtype=dtype):
                print(json.dumps({"ladder": f"batch {batch} x {context}", **result}), flush=True)
            torch.cuda.empty_cache()
    if worst > TOLERANCE[dtype]:              # a fast kernel that computes the wrong thing is a failure
        print(json.dumps({"error": f"paged kernel differs from SDPA by {worst:.3g} > {TOLERANCE[dtype]}"}))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
