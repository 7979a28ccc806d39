"""Launch parameters of the engine's grouped paged-decode kernel: tile size, products, split-K.

Pure Python (no Triton, no GPU), so every choice below is unit-tested on a CPU. The kernel
(`triton_decode.paged_decode_grouped_kernel`) takes a `DecodeConfig`:

  block_n     keys per tile, a power of 2 (independent of the block size: a tile spans several
              blocks, or lies inside one)
  products    "sum": the group's scores and weighted values as float32 elementwise products reduced
              with tl.sum (no padding: a 2-head group is 2 rows); "dot": tl.dot in the storage
              dtype with float32 accumulation (tensor cores), the group padded to 16 rows, the
              smallest tl.dot a GPU compiles
  num_warps, num_stages   Triton's launch options (ignored by the interpreter)

`default_config` is a fixed table by (dtype, head_dim, group); `fastest` times candidates on the
caller's data (the GPU benchmark does, and `paged_decode(..., tune=True)`) and keeps the fastest.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

PRODUCTS = ("sum", "dot")
MIN_DOT = 16                 # tl.dot needs every side >= 16 to compile on a GPU (the interpreter accepts less)
SUM_TILE = 8192              # elements of a "sum" product [group rows, block_n, head_dim]: 64 fp32 registers
#                              per thread at 4 warps, so the tile stays in registers
MAX_SPLITS = 16
MIN_KEYS_PER_SPLIT = 512     # a slice shorter than this costs more to merge than its parallelism saves


def next_power_of_2(n: int) -> int:
    """The smallest power of 2 >= n (1 for n <= 1)."""
    return 1 << max(n - 1, 0).bit_length()


@dataclass(frozen=True)
class DecodeConfig:
    """How one launch of the grouped decode kernel tiles its work (see the module docstring)."""

    block_n: int
    products: str
    num_warps: int = 4
    num_stages: int = 2

    def group_rows(self, group: int) -> int:
        """Rows of the query tile for `group` heads: the group rounded up to a power of 2 (16 for tl.dot)."""
        rows = next_power_of_2(group)
        return max(MIN_DOT, rows) if self.products == "dot" else rows

    def label(self) -> str:
        """A short name for tables and JSON: products, keys per tile, warps, stages."""
        return f"{self.products}/n{self.block_n}/w{self.num_warps}/s{self.num_stages}"


def ids_per_tile(block_n: int, block_size: int) -> int:
    """Block-table entries one tile reads, each loaded once: block_n / block_size, 1 when a tile lies
    inside one block, 0 when the block size is not a power of 2 (then each position looks up its own)."""
    if block_size & (block_size - 1):
        return 0
    return max(1, block_n // block_size)


def check_config(config: DecodeConfig, head_dim: int, group: int) -> None:
    """Raise ValueError naming the field when the kernel could not compile or run with `config`."""
    if config.products not in PRODUCTS:
        raise ValueError(f"products must be one of {PRODUCTS}, got {config.products!r}")
    smallest = MIN_DOT if config.products == "dot" else 1
    if config.block_n < smallest or config.block_n & (config.block_n - 1):
        raise ValueError(f"block_n must be a power of 2 >= {smallest} for products={config.products!r}, "
                         f"got {config.block_n}")
    if config.num_warps not in (1, 2, 4, 8, 16):
        raise ValueError(f"num_warps must be a power of 2 from 1 to 16, got {config.num_warps}")
    if config.num_stages < 1:
        raise ValueError(f"num_stages must be >= 1, got {config.num_stages}")
    if head_dim < 1 or group < 1:
        raise ValueError(f"head_dim and group must be >= 1, got {head_dim} and {group}")


def sum_block_n(head_dim: int, group: int, cap: int = 64) -> int:
    """Keys per tile for "sum": the largest power of 2 whose [rows, block_n, D] product fits SUM_TILE."""
    rows, d_pad = next_power_of_2(group), max(MIN_DOT, next_power_of_2(head_dim))
    return max(MIN_DOT, min(cap, SUM_TILE // (rows * d_pad)))


def default_config(dtype: str, head_dim: int, group: int) -> DecodeConfig:
    """The fixed table: elementwise float32 products for groups up to 4 (no padding to 16 rows), tl.dot in
    the storage dtype for larger fp16/bf16 groups, where 16 rows waste at most half the tensor-core work.

    float32 pools keep "sum" up to groups of 8: their tl.dot must run at full float32 precision ("ieee",
    so that fp32 logits match a from-scratch run within 1e-5), which the tensor cores do not offer.
    `dtype` is the pool's dtype name ("float16", "bfloat16", "float32").
    """
    small = 8 if dtype == "float32" else 4
    if next_power_of_2(group) <= small:
        return DecodeConfig(sum_block_n(head_dim, group), "sum")
    d_pad = max(MIN_DOT, next_power_of_2(head_dim))
    return DecodeConfig(64 if d_pad <= 128 else 32, "dot")


def candidates(dtype: str, head_dim: int, group: int) -> list[DecodeConfig]:
    """A few configs worth timing for this shape: the default first, then both product kinds at two
    tile sizes and two warp counts. Small on purpose: each one is a compilation (about a second)."""
    found = [default_config(dtype, head_dim, group)]
    d_pad = max(MIN_DOT, next_power_of_2(head_dim))
    widest = sum_block_n(head_dim, group)
    for block_n in sorted({max(MIN_DOT, widest // 2), widest}):
        found.append(DecodeConfig(block_n, "sum"))
    for block_n, warps in ((32, 4), (64, 4), (64, 8)):
        if block_n * d_pad <= 16384:           # a K tile of at most 32 KiB in fp16
            found.append(DecodeConfig(block_n, "dot", num_warps=warps))
    unique: list[DecodeConfig] = []
    for config in found:
        if config not in unique:
            unique.append(config)
    return unique


def split_count(batch: int, kv_heads: int, max_blocks: int, block_size: int, sm_count: int) -> int:
    """Split-K count for decode: split only when the (sequence, KV head) programs cannot fill the GPU.

    The target is two programs per streaming multiprocessor. Below it, split until the target is
    reached, but keep every slice at least MIN_KEYS_PER_SPLIT keys long (the table's width bounds the
    context, so no length is read off the GPU) and use at most MAX_SPLITS.
    """
    programs = batch * kv_heads
    target = 2 * sm_count
    if programs == 0 or programs >= target:
        return 1
    by_occupancy = math.ceil(target / programs)
    by_length = (max_blocks * block_size) // MIN_KEYS_PER_SPLIT
    return max(1, min(by_occupancy, by_length, MAX_SPLITS))


def fastest(configs: list[DecodeConfig], time_ms: Callable[[DecodeConfig], float]) -> tuple[DecodeConfig, dict]:
    """The config with the smallest `time_ms(config)`, and every config's label -> ms (None: it failed).

    A config that fails to compile or launch (e.g. out of shared memory on a smaller card) is skipped,
    not fatal; if every one fails, the first one's error is raised.
    """
    times: dict[str, float | None] = {}
    best, best_ms, first_error = None, math.inf, None
    for config in configs:
        try:
            ms = float(time_ms(config))
        except Exception as exc:  # noqa: BLE001 - a config the card cannot run is skipped, and recorded
            times[config.label()] = None
            first_error = first_error or exc
            continue
        times[config.label()] = round(ms, 5)
        if ms < best_ms:
            best, best_ms = config, ms
    if best is None:
        raise RuntimeError(f"no decode config ran: {first_error}") from first_error
    return best, times
