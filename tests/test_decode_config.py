"""The grouped decode kernel's launch choices, as pure functions: no Triton, no GPU needed.

On a CPU the kernel always runs the default config in Triton's interpreter; these tests pin what a
GPU run would pick (tile sizes, products, split counts, the tuner's choice) without one.
"""
import math

import pytest

from engine.attention.decode_config import (
    MAX_SPLITS, SUM_TILE, DecodeConfig, candidates, check_config, default_config, fastest, ids_per_tile,
    split_count, sum_block_n,
)


@pytest.mark.parametrize("dtype, head_dim, group, expected", [
    ("float16", 128, 2, DecodeConfig(32, "sum")),    # Qwen3-0.6B: 16 query heads over 8 KV heads
    ("bfloat16", 128, 1, DecodeConfig(64, "sum")),
    ("float16", 64, 4, DecodeConfig(32, "sum")),
    ("float16", 128, 8, DecodeConfig(64, "dot")),    # Llama-3-70B: groups of 8, on tensor cores
    ("bfloat16", 256, 16, DecodeConfig(32, "dot")),
    ("float32", 128, 8, DecodeConfig(16, "sum")),    # fp32 tl.dot would run without tensor cores
    ("float32", 64, 16, DecodeConfig(64, "dot")),
])
def test_default_table(dtype, head_dim, group, expected):
    assert default_config(dtype, head_dim, group) == expected


def test_sum_tiles_stay_within_the_register_budget():
    """The "sum" product [rows, block_n, head_dim] fits SUM_TILE wherever a 16-key tile does."""
    for head_dim in (32, 64, 128, 256):
        for group in (1, 2, 3, 4, 8):
            rows = 1 << (group - 1).bit_length()
            block_n = sum_block_n(head_dim, group)
            assert block_n & (block_n - 1) == 0 and 16 <= block_n <= 64
            assert rows * block_n * head_dim <= SUM_TILE or block_n == 16


def test_group_rows_pad_only_for_dot():
    assert DecodeConfig(32, "sum").group_rows(2) == 2
    assert DecodeConfig(32, "sum").group_rows(3) == 4
    assert DecodeConfig(32, "dot").group_rows(2) == 16
    assert DecodeConfig(32, "dot").group_rows(32) == 32


@pytest.mark.parametrize("block_n, block_size, ids", [(32, 16, 2), (64, 8, 8), (16, 32, 1), (16, 16, 1),
                                                      (16, 5, 0), (64, 24, 0)])
def test_table_entries_per_tile(block_n, block_size, ids):
    """Each entry is loaded once per tile; block sizes that are not powers of 2 look up per position."""
    assert ids_per_tile(block_n, block_size) == ids


def test_candidates_are_valid_distinct_and_start_with_the_default():
    for dtype in ("float16", "bfloat16", "float32"):
        for head_dim, group in ((64, 1), (128, 2), (128, 8), (256, 4)):
            found = candidates(dtype, head_dim, group)
            assert found[0] == default_config(dtype, head_dim, group)
            assert len(found) == len(set(found)) and 3 <= len(found) <= 6
            assert {c.products for c in found} == {"sum", "dot"}
            for config in found:
                check_config(config, head_dim, group)


@pytest.mark.parametrize("config, message", [
    (DecodeConfig(8, "dot"), "block_n must be a power of 2 >= 16 for products='dot', got 8"),
    (DecodeConfig(48, "sum"), "block_n must be a power of 2 >= 1 for products='sum', got 48"),
    (DecodeConfig(16, "fma"), "products must be one of ('sum', 'dot'), got 'fma'"),
    (DecodeConfig(16, "sum", num_warps=3), "num_warps must be a power of 2 from 1 to 16, got 3"),
    (DecodeConfig(16, "sum", num_stages=0), "num_stages must be >= 1, got 0"),
])
def test_check_config_names_the_field(config, message):
    with pytest.raises(ValueError) as error:
        check_config(config, 128, 2)
    assert str(error.value) == message


def test_split_count():
    """Many (sequence, KV head) programs: no split; few: enough to reach 2 per SM, slices >= 512 keys, <= 16."""
    assert split_count(64, 8, 256, 16, sm_count=132) == 1          # 512 programs >= 264
    assert split_count(1, 8, 1024, 16, sm_count=132) == MAX_SPLITS  # 8 programs want 33
    assert split_count(4, 8, 1024, 16, sm_count=132) == math.ceil(264 / 32)
    assert split_count(4, 8, 64, 16, sm_count=132) == 2            # 1,024 keys: two slices of 512
    assert split_count(1, 8, 8, 16, sm_count=132) == 1             # 128 keys: too short to split
    assert split_count(0, 8, 8, 16, sm_count=132) == 1             # an empty batch


def test_fastest_picks_the_smallest_time_and_skips_failures():
    """The tuner keeps the fastest config; one that fails (out of shared memory, say) is recorded as None."""
    configs = [DecodeConfig(32, "sum"), DecodeConfig(64, "dot"), DecodeConfig(32, "dot", num_warps=8)]
    times = {configs[0]: 0.30, configs[2]: 0.21}

    def time_ms(config):
        if config not in times:
            raise RuntimeError("out of resources: shared memory")
        return times[config]

    best, table = fastest(configs, time_ms)
    assert best == configs[2]
    assert table == {"sum/n32/w4/s2": 0.3, "dot/n64/w4/s2": None, "dot/n32/w8/s2": 0.21}
    with pytest.raises(RuntimeError, match="no decode config ran: out of resources"):
        fastest(configs[1:2], time_ms)
