"""Paged attention kernels against the torch reference.

Without a GPU the kernels run in Triton's interpreter (set below, before any kernel is defined);
with one they run compiled, and the `gpu` tests add realistic shapes. Shapes stay small so the
interpreter finishes this file in seconds.
"""

import math
import os
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

import engine.attention as attention_pkg
import engine.attention.triton_setup as triton_setup
from engine.attention import paged_attention
from engine.attention.paged_reference import gather_history, paged_attention_reference
from engine.attention.reference import attention


HAS_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if HAS_CUDA else "cpu"
needs_triton = pytest.mark.skipif(not attention_pkg.triton_installed(), reason="triton is Linux-only")

if attention_pkg.triton_installed():
    attention_pkg.prepare_triton()  # TRITON_INTERPRET=1 without CUDA, before the kernel modules define kernels
    from engine.attention.triton_decode import merge_partials, paged_decode, paged_decode_per_head, split_partials
    from engine.attention.triton_primer import gather_rows
    from engine.attention.triton_prefill import paged_prefill

BS = 16
# Around the block size: one token, a block minus one, exactly one, one over, two blocks and one over.
EDGE_LENGTHS = [1, BS - 1, BS, BS + 1, 2 * BS + 1, 300]
TOLERANCE = {torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 3e-2}


def make_pool(lens, kv_heads=2, head_dim=32, block_size=BS, dtype=torch.float32, seed=0, spare=3, pad=0):
    """Random K/V pools holding sequences of the given lengths, with scrambled (permuted) block tables.

    Each sequence's blocks are a random choice of pool blocks in random order; `spare` extra
    blocks belong to nobody. Table columns past a sequence's blocks hold `pad`.
    """
    gen = torch.Generator().manual_seed(seed)
    counts = [math.ceil(n / block_size) for n in lens]
    num_blocks = sum(counts) + spare
    shape = (num_blocks, kv_heads, block_size, head_dim)
    k_pool = torch.randn(shape, generator=gen).to(dtype)
    v_pool = torch.randn(shape, generator=gen).to(dtype)
    order = torch.randperm(num_blocks, generator=gen).tolist()
    tables = torch.full((len(lens), max(counts) + 1), pad, dtype=torch.long)
    for row, count in enumerate(counts):
        tables[row, :count] = torch.tensor(order[:count])
        order = order[count:]
    to = dict(device=DEVICE)
    return k_pool.to(**to), v_pool.to(**to), tables.to(**to), torch.tensor(lens, **to)


def make_queries(batch, q_heads, steps, head_dim, dtype, seed=1):
    """Random queries [B, Hq, T, D] on the test device."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, q_heads, steps, head_dim, generator=gen).to(dtype).to(DEVICE)


def decode_positions(kv_lens):
    """The decode query of each row sits at the last stored position: [B, 1]."""
    return (kv_lens - 1)[:, None]


def assert_close(actual, expected, dtype, rows=None):
    """Compare in float32 with the dtype's tolerance, only where rows ([B, T] bool) is True."""
    tol = TOLERANCE[dtype]
    actual, expected = actual.float(), expected.float()
    if rows is not None:
        keep = rows[:, None, :, None].expand_as(actual)
        actual, expected = actual[keep], expected[keep]
    torch.testing.assert_close(actual, expected, atol=tol, rtol=tol)


# ----- the torch reference -------------------------------------------------------------------------


def test_gather_history_follows_the_block_table():
    """Scatter a contiguous history into the pool through a scrambled table; gathering returns it."""
    lens = [5, 37]
    k_pool, _, tables, kv_lens = make_pool(lens, block_size=8, spare=6, pad=-1)
    history = torch.randn(2, 2, 40, 32, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    for row, n in enumerate(lens):
        for p in range(n):
            k_pool[tables[row, p // 8], :, p % 8] = history[row, :, p]
    gathered = gather_history(k_pool, tables, kv_lens)
    for row, n in enumerate(lens):
        torch.testing.assert_close(gathered[row, :, :n], history[row, :, :n], atol=0, rtol=0)
    # The table really is scrambled: the same blocks read in sorted order give something else.
    in_order = gather_history(k_pool, tables.sort(dim=1).values, kv_lens)
    assert not torch.equal(in_order[1, :, :37], history[1, :, :37])


def test_paged_reference_equals_contiguous_reference():
    """Attention over the pool equals the lead's reference attention on the gathered history."""
    k_pool, v_pool, tables, kv_lens = make_pool([3, 20, 33])
    q = make_queries(3, 4, 1, 32, torch.float32)
    positions = decode_positions(kv_lens)
    expected = attention(q, gather_history(k_pool, tables, kv_lens), gather_history(v_pool, tables, kv_lens),
                         positions, kv_lens)
    torch.testing.assert_close(paged_attention_reference(q, k_pool, v_pool, tables, positions, kv_lens), expected)


@pytest.mark.parametrize("break_it, message", [
    (lambda a: a.update(q=a["q"][..., :16]), "head_dim differs: q has 16, the pool has 32"),
    (lambda a: a.update(q=a["q"][:, :3]), "3 query heads cannot be grouped over 2 KV heads"),
    (lambda a: a.update(kv_lens=a["kv_lens"].int()), "kv_lens must be long"),
    (lambda a: a.update(q_positions=a["q_positions"][:, :0]), "q_positions must be long [B=2, T=1]"),
    (lambda a: a.update(block_tables=a["block_tables"].float()), "block_tables must be int32 or int64"),
    (lambda a: a.update(block_tables=a["block_tables"][:, :1]), "needs 3 blocks of 16, but block_tables has only 1"),
    (lambda a: a.update(v_pool=a["v_pool"][:, :1]), "k_pool and v_pool must both be"),
    (lambda a: a.update(q=a["q"].half()), "dtypes differ: q torch.float16"),
])
def test_bad_inputs_are_named_with_their_numbers(break_it, message):
    """Each kind of mismatch raises a ValueError that names the offending shapes or dtypes."""
    k_pool, v_pool, tables, kv_lens = make_pool([5, 40])
    args = dict(q=make_queries(2, 4, 1, 32, torch.float32), k_pool=k_pool, v_pool=v_pool,
                block_tables=tables, q_positions=decode_positions(kv_lens), kv_lens=kv_lens)
    break_it(args)
    with pytest.raises(ValueError) as error:
        paged_attention_reference(**args)
    assert message in str(error.value)


# ----- the decode kernel --------------------------------------------------------------------------


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("group", [1, 2, 4])
def test_decode_matches_reference(group, dtype):
    """Scrambled tables, GQA groups and lengths around block boundaries, in each dtype."""
    k_pool, v_pool, tables, kv_lens = make_pool(EDGE_LENGTHS, dtype=dtype)
    q = make_queries(len(EDGE_LENGTHS), 2 * group, 1, 32, dtype)
    positions = decode_positions(kv_lens)
    out = paged_decode(q, k_pool, v_pool, tables, positions, kv_lens)
    assert out.dtype == dtype and out.shape == q.shape
    assert_close(out, paged_attention_reference(q, k_pool, v_pool, tables, positions, kv_lens), dtype)


@needs_triton
@pytest.mark.parametrize("block_size, head_dim", [(4, 32), (5, 24), (32, 16)])
def test_decode_block_sizes_and_head_dims(block_size, head_dim):
    """Blocks smaller than a key tile, not a power of 2, larger than 16; a head_dim padded to 32."""
    lens = [1, block_size - 1 or 1, block_size + 1, 3 * block_size + 2, 130]
    k_pool, v_pool, tables, kv_lens = make_pool(lens, head_dim=head_dim, block_size=block_size)
    q = make_queries(len(lens), 4, 1, head_dim, torch.float32)
    positions = decode_positions(kv_lens)
    out = paged_decode(q, k_pool, v_pool, tables, positions, kv_lens)
    assert_close(out, paged_attention_reference(q, k_pool, v_pool, tables, positions, kv_lens), torch.float32)


@needs_triton
def test_decode_query_position_limits_the_keys():
    """A query at position p sees keys 0..p even when more are stored (kv_len > p + 1)."""
    k_pool, v_pool, tables, kv_lens = make_pool([40, 40])
    q = make_queries(2, 4, 1, 32, torch.float32)
    positions = torch.tensor([[39], [20]], device=DEVICE)
    out = paged_decode(q, k_pool, v_pool, tables, positions, kv_lens)
    assert_close(out, paged_attention_reference(q, k_pool, v_pool, tables, positions, kv_lens), torch.float32)
    seeing_all = paged_decode(q, k_pool, v_pool, tables, decode_positions(kv_lens), kv_lens)
    assert not torch.allclose(out[1], seeing_all[1], atol=1e-3)


@needs_triton
@pytest.mark.parametrize("num_splits", [3, 8])
def test_split_k_equals_unsplit(num_splits):
    """Split-K and its log-sum-exp merge give the unsplit result, also for sequences shorter than the split count."""
    lens = [2, 7, BS + 1, 300, 5]  # 2 and 7 tokens leave most of 8 splits empty
    k_pool, v_pool, tables, kv_lens = make_pool(lens, kv_heads=1)  # few programs: the interpreter runs them one by one
    q = make_queries(len(lens), 2, 1, 32, torch.float32)
    positions = decode_positions(kv_lens)
    positions[-1] = -1  # a padding row: every one of its splits is empty
    real = positions >= 0
    whole = paged_decode(q, k_pool, v_pool, tables, positions, kv_lens)
    split = paged_decode(q, k_pool, v_pool, tables, positions, kv_lens, num_splits=num_splits)
    assert torch.isfinite(split).all()  # empty splits get weight 0 in the merge, never exp(-inf - -inf) = NaN
    assert_close(split, whole, torch.float32)
    expected = paged_attention_reference(q, k_pool, v_pool, tables, positions, kv_lens)
    assert_close(split, expected, torch.float32, rows=real)


@needs_triton
@pytest.mark.parametrize("num_splits", [1, 4])
def test_tail_mask_keeps_garbage_out(num_splits):
    """NaN in the unused slots of each last block, in spare blocks and in table padding changes nothing."""
    lens = [1, BS - 1, BS + 1, 2 * BS + 1]
    k_pool, v_pool, tables, kv_lens = make_pool(lens, kv_heads=1, pad=10**6)  # padding far outside the pool
    q = make_queries(len(lens), 2, 1, 32, torch.float32)
    positions = decode_positions(kv_lens)
    clean = paged_decode(q, k_pool, v_pool, tables, positions, kv_lens, num_splits=num_splits)
    used = torch.zeros(k_pool.shape[0], BS, dtype=torch.bool, device=DEVICE)
    for row, n in enumerate(lens):
        for p in range(n):
            used[tables[row, p // BS], p % BS] = True
    for pool in (k_pool, v_pool):
        pool.masked_fill_(~used[:, None, :, None], float("nan"))
    dirty = paged_decode(q, k_pool, v_pool, tables, positions, kv_lens, num_splits=num_splits)
    torch.testing.assert_close(dirty, clean, atol=0, rtol=0)
    # The garbage sits where a kernel without the tail mask would read: one key too many turns rows to NaN.
    one_too_many = torch.tensor([[n] for n in lens], device=DEVICE)
    overread = paged_decode(q, k_pool, v_pool, tables, one_too_many, kv_lens + 1, num_splits=num_splits)
    assert overread[:, :, 0].isnan().any(dim=-1).all()


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("group, block_size, block_n", [(1, 16, 64), (2, 5, 16), (4, 4, 8)])
def test_per_head_kernel_matches_reference(group, block_size, block_n, dtype):
    """The chapter's kernel (one program per query head): scrambled tables, tiles that cut blocks, GQA."""
    lens = [1, block_size - 1 or 1, block_size + 1, 2 * block_size + 1, 40]
    k_pool, v_pool, tables, kv_lens = make_pool(lens, block_size=block_size, dtype=dtype)
    q = make_queries(len(lens), 2 * group, 1, 32, dtype)
    positions = decode_positions(kv_lens)
    positions[-1] = 30  # a query that sees fewer keys than are stored
    out = paged_decode_per_head(q, k_pool, v_pool, tables, positions, kv_lens, block_n=block_n)
    assert out.dtype == dtype and out.shape == q.shape
    assert_close(out, paged_attention_reference(q, k_pool, v_pool, tables, positions, kv_lens), dtype)


@needs_triton
def test_per_head_kernel_ignores_garbage_and_rejects_odd_head_dims():
    """NaN in every slot no sequence owns changes nothing; a head_dim that is not a power of 2 is refused."""
    lens = [3, 9]
    k_pool, v_pool, tables, kv_lens = make_pool(lens, kv_heads=1, block_size=4, pad=0)
    q = make_queries(2, 2, 1, 32, torch.float32)
    positions = decode_positions(kv_lens)
    clean = paged_decode_per_head(q, k_pool, v_pool, tables, positions, kv_lens, block_n=8)
    used = torch.zeros(k_pool.shape[0], 4, dtype=torch.bool, device=DEVICE)
    for row, n in enumerate(lens):
        for p in range(n):
            used[tables[row, p // 4], p % 4] = True
    for pool in (k_pool, v_pool):
        pool.masked_fill_(~used[:, None, :, None], float("nan"))
    dirty = paged_decode_per_head(q, k_pool, v_pool, tables, positions, kv_lens, block_n=8)
    torch.testing.assert_close(dirty, clean, atol=0, rtol=0)
    with pytest.raises(ValueError, match="head_dim to be a power of 2, got 24"):
        paged_decode_per_head(q[..., :24], k_pool[..., :24], v_pool[..., :24], tables, positions, kv_lens)


@needs_triton
def test_torch_merge_of_split_partials_equals_unsplit():
    """merge_partials (the merge kernel's spec) over the split kernel's partials gives the unsplit output."""
    lens = [2, BS + 1, 70]
    k_pool, v_pool, tables, kv_lens = make_pool(lens, kv_heads=1)
    q = make_queries(3, 2, 1, 32, torch.float32)
    positions = decode_positions(kv_lens)
    m, l, acc = split_partials(q, k_pool, v_pool, tables, positions, kv_lens, num_splits=4)
    assert (m[0, :, 1:] == float("-inf")).all() and (l[0, :, 1:] == 0).all()  # 2 keys: one tile, 3 empty splits
    merged = merge_partials(m, l, acc)[..., :32].unsqueeze(2)
    assert_close(merged, paged_decode(q, k_pool, v_pool, tables, positions, kv_lens), torch.float32)
    empty = merge_partials(torch.full((1, 3), float("-inf")), torch.zeros(1, 3), torch.zeros(1, 3, 4))
    assert torch.equal(empty, torch.zeros(1, 4))  # every split empty: zeros, not NaN


@needs_triton
def test_primer_gather_rows():
    """The primer's kernel: rows through an index, edges masked, nothing outside out[:rows, :cols] touched."""
    x = torch.randn(9, 5, device=DEVICE)
    index = torch.tensor([8, 0, 3, 3, 7, 1, 2], device=DEVICE)
    buffer = torch.full((10, 8), -7.0, device=DEVICE)
    gather_rows(x, index, out=buffer[:7, :5], block_rows=4)
    assert torch.equal(buffer[:7, :5], x[index])
    assert (buffer[7:] == -7).all() and (buffer[:, 5:] == -7).all()


# ----- the grouped kernel's paths: products, tiles, splits ---------------------------------------

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32
# products, keys per tile, group, block size, head_dim, dtype, splits: each row a different way through
# tile_blocks (tiles of several blocks, of exactly one, inside one) and the two product kinds.
GROUPED_CASES = [
    ("sum", 16, 1, 8, 64, F16, 1),
    ("sum", 32, 2, 16, 128, F16, 1),     # Qwen3-0.6B's group and head_dim, tiles of two blocks
    ("sum", 16, 4, 32, 64, BF16, 3),     # a tile inside one block
    ("sum", 64, 8, 8, 64, F32, 2),       # eight table entries per tile
    ("dot", 32, 2, 16, 128, F16, 1),
    ("dot", 16, 8, 32, 64, BF16, 4),
    ("dot", 64, 4, 8, 128, F32, 2),
    ("dot", 32, 1, 16, 64, F16, 5),
]


@needs_triton
@pytest.mark.parametrize("products, block_n, group, block_size, head_dim, dtype, splits", GROUPED_CASES,
                         ids=lambda v: str(v).removeprefix("torch."))
def test_grouped_kernel_paths_match_reference(products, block_n, group, block_size, head_dim, dtype, splits):
    """Lengths bs-1, bs, bs+1, 2bs+1 match the reference; rows that see no key (kv_len 0, or a padding
    query at position -1) come back as exact zeros, split or not."""
    from engine.attention.decode_config import DecodeConfig
    bs = block_size
    lens = [bs - 1, bs, bs + 1, 2 * bs + 1, 0, 5]
    k_pool, v_pool, tables, kv_lens = make_pool(lens, kv_heads=2, head_dim=head_dim, block_size=bs, dtype=dtype)
    q = make_queries(len(lens), 2 * group, 1, head_dim, dtype)
    positions = decode_positions(kv_lens)
    positions[-1] = -1                                   # a padding row over a stored history
    sees_keys = positions >= 0
    out = paged_decode(q, k_pool, v_pool, tables, positions, kv_lens, num_splits=splits,
                       config=DecodeConfig(block_n, products))
    assert out.dtype == dtype and out.shape == q.shape
    expected = paged_attention_reference(q, k_pool, v_pool, tables, positions, kv_lens)
    assert_close(out, expected, dtype, rows=sees_keys)
    assert torch.equal(out[~sees_keys[:, 0]], torch.zeros_like(out[~sees_keys[:, 0]]))


@needs_triton
@pytest.mark.parametrize("products", ["sum", "dot"])
def test_every_split_count_gives_the_unsplit_result(products):
    """Split counts 1 to 5 and 16, over histories shorter and longer than the slices, all equal the reference."""
    from engine.attention.decode_config import DecodeConfig
    lens = [1, BS + 1, 70]
    k_pool, v_pool, tables, kv_lens = make_pool(lens, kv_heads=1)
    q = make_queries(len(lens), 2, 1, 32, torch.float32)
    positions = decode_positions(kv_lens)
    expected = paged_attention_reference(q, k_pool, v_pool, tables, positions, kv_lens)
    config = DecodeConfig(16, products)
    for splits in (1, 2, 3, 4, 5, 16):
        out = paged_decode(q, k_pool, v_pool, tables, positions, kv_lens, num_splits=splits, config=config)
        assert_close(out, expected, torch.float32)


@needs_triton
def test_bad_configs_are_refused_with_their_values():
    """A tl.dot tile under 16 keys, a tile that is not a power of 2, unknown products: named, before any launch."""
    from engine.attention.decode_config import DecodeConfig
    k_pool, v_pool, tables, kv_lens = make_pool([5])
    args = (make_queries(1, 2, 1, 32, torch.float32), k_pool, v_pool, tables, decode_positions(kv_lens), kv_lens)
    for config, message in ((DecodeConfig(8, "dot"), "power of 2 >= 16 for products='dot', got 8"),
                            (DecodeConfig(24, "sum"), "power of 2 >= 1 for products='sum', got 24"),
                            (DecodeConfig(16, "mma"), "products must be one of ('sum', 'dot'), got 'mma'")):
        with pytest.raises(ValueError, match=re.escape(message)):
            paged_decode(*args, config=config)


@needs_triton
def test_step_varying_arguments_are_not_specialized():
    """The arguments that change every engine step are in each kernel's do_not_specialize, and are real
    parameter names (Triton ignores a misspelt one silently, and would then compile a variant per step)."""
    import inspect

    from engine.attention import triton_decode, triton_prefill
    kernels = ((triton_decode.paged_decode_grouped_kernel, triton_decode.STEP_VARYING),
               (triton_decode.merge_splits_kernel, ("num_splits",)),
               (triton_prefill.paged_prefill_kernel, triton_prefill.STEP_VARYING))
    for kernel, varying in kernels:
        names = set(getattr(kernel, "do_not_specialize", None) or kernel.kwargs.get("do_not_specialize") or ())
        params = set(inspect.signature(kernel.fn).parameters)
        assert set(varying) <= names, (kernel.fn.__name__, names)
        assert names <= params, (kernel.fn.__name__, names - params)


# ----- the prefill kernel -------------------------------------------------------------------------


def ragged_prefill(new_tokens, histories, steps):
    """q_positions [B, T] for rows that add new_tokens[b] after histories[b] cached tokens (-1 pads)."""
    positions = torch.full((len(new_tokens), steps), -1, dtype=torch.long)
    for row, (n, start) in enumerate(zip(new_tokens, histories)):
        positions[row, :n] = torch.arange(start, start + n)
    kv_lens = torch.tensor([h + n for n, h in zip(new_tokens, histories)])
    return positions.to(DEVICE), kv_lens.to(DEVICE)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("group", [1, 2, 4])
def test_prefill_matches_reference(group, dtype):
    """Ragged rows: a whole prompt, chunks after a paged history (across block edges), a single token."""
    new_tokens = [37, 20, 5, 1]
    histories = [0, BS - 1, 2 * BS + 1, 60]
    positions, kv_lens = ragged_prefill(new_tokens, histories, steps=37)
    k_pool, v_pool, tables, _ = make_pool(kv_lens.tolist(), dtype=dtype)
    q = make_queries(4, 2 * group, 37, 32, dtype)
    out = paged_prefill(q, k_pool, v_pool, tables, positions, kv_lens)
    expected = paged_attention_reference(q, k_pool, v_pool, tables, positions, kv_lens)
    assert_close(out, expected, dtype, rows=positions >= 0)
    assert torch.isfinite(out).all()  # padding rows come back as zeros, not NaN


@needs_triton
def test_prefill_is_causal():
    """Changing the K/V of the last position changes only the last query's output."""
    positions, kv_lens = ragged_prefill([24], [0], steps=24)
    k_pool, v_pool, tables, _ = make_pool([24])
    q = make_queries(1, 2, 24, 32, torch.float32)
    before = paged_prefill(q, k_pool, v_pool, tables, positions, kv_lens)
    last_block, last_slot = tables[0, 23 // BS], 23 % BS
    v_pool[last_block, :, last_slot] += 1.0
    after = paged_prefill(q, k_pool, v_pool, tables, positions, kv_lens)
    torch.testing.assert_close(after[:, :, :23], before[:, :, :23], atol=0, rtol=0)
    assert not torch.allclose(after[:, :, 23], before[:, :, 23])


@needs_triton
def test_kernels_read_strided_views():
    """q transposed from [B, T, H, D], positions a column slice, pools a slice of a bigger pool: no copies needed."""
    positions, kv_lens = ragged_prefill([6, 2], [10, 30], steps=6)
    k_pool, v_pool, tables, _ = make_pool(kv_lens.tolist())
    k_view, v_view = torch.cat([k_pool, k_pool], dim=3)[..., :32], torch.cat([v_pool, v_pool], dim=3)[..., 32:]
    q = make_queries(2, 6, 4, 32, torch.float32).transpose(1, 2)  # [B, H=4, T=6, D], T not the inner stride
    assert not (q.is_contiguous() or k_view.is_contiguous())
    expected = paged_attention_reference(q, k_pool, v_pool, tables, positions, kv_lens)
    assert_close(paged_prefill(q, k_view, v_view, tables, positions, kv_lens), expected, torch.float32,
                 rows=positions >= 0)
    last = positions[:, :1] + torch.tensor([[5], [1]], device=DEVICE)  # a [B, 1] column of a wider tensor
    wide = torch.cat([last, last], dim=1)[:, 1:]
    q1 = q[:, :, :1]
    assert_close(paged_decode(q1, k_view, v_view, tables, wide, kv_lens, num_splits=2),
                 paged_attention_reference(q1, k_pool, v_pool, tables, last, kv_lens), torch.float32)


@needs_triton
@pytest.mark.skipif(HAS_CUDA, reason="checked on the CPU only; on a GPU it would cost a sync per layer")
def test_kernel_path_rejects_a_table_too_narrow():
    """On the CPU the kernels refuse a kv_len their table cannot hold instead of reading past the table."""
    k_pool, v_pool, tables, kv_lens = make_pool([40])
    q = make_queries(1, 2, 1, 32, torch.float32)
    with pytest.raises(ValueError, match="needs 3 blocks of 16, but block_tables has only 2"):
        paged_decode(q, k_pool, v_pool, tables[:, :2], decode_positions(kv_lens), kv_lens)


# ----- the dispatch -------------------------------------------------------------------------------


@needs_triton
def test_dispatch_routes_decode_and_prefill():
    """backend="triton" runs decode for T == 1 (split or not) and prefill for T > 1; all match torch."""
    positions, kv_lens = ragged_prefill([9, 3], [0, 20], steps=9)
    k_pool, v_pool, tables, _ = make_pool(kv_lens.tolist())
    for q, pos in ((make_queries(2, 4, 9, 32, torch.float32), positions),
                   (make_queries(2, 4, 1, 32, torch.float32), decode_positions(kv_lens))):
        expected = paged_attention(q, k_pool, v_pool, tables, pos, kv_lens, backend="torch")
        for splits in (None, 3):
            out = paged_attention(q, k_pool, v_pool, tables, pos, kv_lens, backend="triton", num_splits=splits)
            assert_close(out, expected, torch.float32, rows=pos >= 0)


def test_auto_backend_uses_sdpa_on_cpu_and_rejects_unknown_names():
    """On CPU tensors "auto" is the fused SDPA path, bit for bit, and within 1e-6 of the torch reference;
    a typo in the backend is an error."""
    k_pool, v_pool, tables, kv_lens = make_pool([10, 3])
    k_pool, v_pool, tables, kv_lens = k_pool.cpu(), v_pool.cpu(), tables.cpu(), kv_lens.cpu()
    q = make_queries(2, 4, 1, 32, torch.float32).cpu()
    args = (q, k_pool, v_pool, tables, decode_positions(kv_lens), kv_lens)
    auto = paged_attention(*args)
    torch.testing.assert_close(auto, paged_attention(*args, backend="sdpa"), atol=0, rtol=0)
    torch.testing.assert_close(auto, paged_attention_reference(*args), atol=1e-6, rtol=1e-6)
    with pytest.raises(ValueError, match="backend must be one of"):
        paged_attention(*args, backend="cuda")


def test_split_heuristic_splits_only_when_the_gpu_would_idle(monkeypatch):
    """Many (sequence, KV head) programs: no split; one long sequence: up to 16; a short one: none; CPU: none."""
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(multi_processor_count=132))
    monkeypatch.setattr(attention_pkg, "_SM_COUNTS", {})  # asked once per device, then cached: start empty
    cuda = torch.device("cuda")
    choose = attention_pkg.choose_num_splits
    assert choose(batch=64, kv_heads=8, max_blocks=1024, block_size=16, device=cuda) == 1
    assert choose(batch=1, kv_heads=8, max_blocks=1024, block_size=16, device=cuda) == 16
    assert choose(batch=4, kv_heads=8, max_blocks=1024, block_size=16, device=cuda) == 9  # ceil(264 / 32)
    assert choose(batch=1, kv_heads=8, max_blocks=8, block_size=16, device=cuda) == 1
    assert choose(batch=1, kv_heads=8, max_blocks=1024, block_size=16, device=torch.device("cpu")) == 1


def test_triton_missing_gives_a_clear_error(monkeypatch):
    """Without triton (macOS, Windows) backend="triton" says why and where the kernels do run."""
    monkeypatch.setattr(triton_setup, "triton_installed", lambda: False)
    k_pool, v_pool, tables, kv_lens = make_pool([4])
    q = make_queries(1, 2, 1, 32, torch.float32)
    with pytest.raises(attention_pkg.TritonUnavailable, match="Linux wheels only.*WSL2.*hosted notebook"):
        paged_attention(q, k_pool, v_pool, tables, decode_positions(kv_lens), kv_lens, backend="triton")


@needs_triton
def test_import_is_cheap_works_without_triton_and_kernels_pick_their_mode():
    """In a fresh process: `import engine.attention` leaves triton alone, the torch backend works with triton
    blocked (as on macOS), and importing a kernel module straight away picks the interpreter without CUDA."""
    script = (
        "import sys; import engine.attention as a; assert 'triton' not in sys.modules, 'imported triton'\n"
        "sys.modules['triton'] = None  # now `import triton` fails, as on macOS\n"
        "assert not a.triton_installed()\n"
        "import torch; pool = torch.randn(2, 1, 4, 8); t = torch.tensor([[1, 0]]); n = torch.tensor([5])\n"
        "out = a.paged_attention(torch.randn(1, 1, 1, 8), pool, pool, t, torch.tensor([[4]]), n)\n"
        "assert out.shape == (1, 1, 1, 8)\n"
        "del sys.modules['triton']\n"
        "import engine.attention.triton_decode as d\n"
        "assert d.INTERPRETED == (not torch.cuda.is_available()), d.INTERPRETED\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr


def test_interpreter_switch_must_come_before_the_kernels(monkeypatch):
    """Without CUDA the helper turns the interpreter on, unless the kernels were already compiled: then it says so."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    for name in triton_setup.KERNEL_MODULES:
        monkeypatch.delitem(sys.modules, name, raising=False)
    assert triton_setup.use_interpreter_without_gpu() is True
    assert os.environ["TRITON_INTERPRET"] == "1"
    monkeypatch.delenv("TRITON_INTERPRET")
    compiled = SimpleNamespace(INTERPRETED=False)  # a kernel module that defined its kernels for a GPU
    monkeypatch.setitem(sys.modules, triton_setup.KERNEL_MODULES[0], compiled)
    with pytest.raises(RuntimeError, match="Set TRITON_INTERPRET=1 before the first import"):
        triton_setup.use_interpreter_without_gpu()


# ----- compiled on a GPU: realistic shapes ------------------------------------------------------------


def qwen3_like_batch(lens, dtype, steps=1):
    """Qwen3-0.6B-like heads (16 query, 8 KV, head_dim 128), block size 16, scrambled tables, on CUDA."""
    k_pool, v_pool, tables, kv_lens = make_pool(lens, kv_heads=8, head_dim=128, dtype=dtype, seed=3)
    return make_queries(len(lens), 16, steps, 128, dtype), k_pool, v_pool, tables, kv_lens


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("num_splits", [1, 4, 16])
@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
def test_gpu_decode_compiles_and_matches(dtype, num_splits):
    """Compiled decode at model shapes, unsplit and split, every dtype."""
    q, k_pool, v_pool, tables, kv_lens = qwen3_like_batch([1, 15, 16, 17, 33, 1000, 4097], dtype)
    positions = decode_positions(kv_lens)
    out = paged_decode(q, k_pool, v_pool, tables, positions, kv_lens, num_splits=num_splits)
    assert_close(out, paged_attention_reference(q, k_pool, v_pool, tables, positions, kv_lens), dtype)


@pytest.mark.parametrize("group, head_dim", [(1, 64), (8, 128), (16, 64)])
@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
def test_gpu_decode_group_sizes(group, head_dim):
    """Compiled decode for groups padded to 16 and exactly 16 wide."""
    k_pool, v_pool, tables, kv_lens = make_pool([3, 300, 2000], kv_heads=2, head_dim=head_dim, dtype=torch.float16)
    q = make_queries(3, 2 * group, 1, head_dim, torch.float16)
    positions = decode_positions(kv_lens)
    out = paged_attention(q, k_pool, v_pool, tables, positions, kv_lens)  # "auto" picks triton on CUDA
    assert_close(out, paged_attention_reference(q, k_pool, v_pool, tables, positions, kv_lens), torch.float16)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
def test_gpu_prefill_compiles_and_matches(dtype):
    """Compiled prefill at model shapes: a long prompt, chunks after long histories, padding."""
    positions, kv_lens = ragged_prefill([300, 128, 7], [0, 1000, 4000], steps=300)
    q, k_pool, v_pool, tables, _ = qwen3_like_batch(kv_lens.tolist(), dtype, steps=300)
    out = paged_prefill(q, k_pool, v_pool, tables, positions, kv_lens)
    expected = paged_attention_reference(q, k_pool, v_pool, tables, positions, kv_lens)
    assert_close(out, expected, dtype, rows=positions >= 0)


def gpu_config_cases():
    from engine.attention.decode_config import candidates
    return candidates("float16", 128, 2)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
def test_gpu_every_candidate_config_compiles_and_matches(dtype):
    """Every config the tuner may pick, unsplit and split, at Qwen3-0.6B's shapes."""
    q, k_pool, v_pool, tables, kv_lens = qwen3_like_batch([1, 15, 16, 17, 33, 1000, 4097], dtype)
    positions = decode_positions(kv_lens)
    expected = paged_attention_reference(q, k_pool, v_pool, tables, positions, kv_lens)
    for config in gpu_config_cases():
        for splits in (1, 4):
            out = paged_decode(q, k_pool, v_pool, tables, positions, kv_lens, num_splits=splits, config=config)
            assert_close(out, expected, dtype)
    tuned = paged_decode(q, k_pool, v_pool, tables, positions, kv_lens, tune=True)
    assert_close(tuned, expected, dtype)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
def test_gpu_decode_compiles_once_while_batches_and_tables_change():
    """Batch size, table width and split count change every engine step; none of them may cost a compile."""
    from engine.attention.triton_decode import merge_splits_kernel, paged_decode_grouped_kernel

    def compiled():
        return sum(len(caches[0]) for kernel in (paged_decode_grouped_kernel, merge_splits_kernel)
                   for caches in kernel.device_caches.values())

    def step(lens, splits):
        q, k_pool, v_pool, tables, kv_lens = qwen3_like_batch(lens, torch.float16)
        paged_decode(q, k_pool, v_pool, tables, decode_positions(kv_lens), kv_lens, num_splits=splits)

    step([5], 1)
    step([40, 70], 2)
    before = compiled()
    for lens, splits in (([1], 1), ([17, 300, 2], 1), ([16] * 16, 1), ([33] * 5, 1), ([250, 1], 3),
                         ([1000] * 3, 16), ([5, 6, 7, 8], 5)):
        step(lens, splits)
    assert compiled() == before


@needs_triton
def test_engine_decodes_through_the_kernels_as_from_scratch():
    """The tiny model (fp32) through the paged cache's Triton kernels, prefill and decode steps, gives the
    from-scratch logits for prompts of bs-1, bs, bs+1 and 2bs+1 tokens: compiled on a GPU (20 steps),
    in the interpreter on a CPU (8 steps, a few seconds)."""
    from engine.cache.paged import PagedKVCache
    from engine.checkpoint import tiny_model
    from engine.generate import cached_step, scratch_logits
    from engine.seeded import seeded_tokens
    model = tiny_model(seed=0).to(DEVICE)
    lens = [BS - 1, BS, BS + 1, 2 * BS + 1]
    cache = PagedKVCache(model.config, 64, block_size=BS, device=DEVICE, attention="triton")
    prompts = [seeded_tokens(n, seed=n) for n in lens]
    seqs = list(range(len(lens)))
    for seq in seqs:
        cache.create(seq)
    cached_step(model, cache, seqs, prompts)
    tokens, got = [list(p) for p in prompts], [[] for _ in lens]
    for t in range(20 if HAS_CUDA else 8):
        new = [[seeded_tokens(1, seed=100 * t + s)[0]] for s in seqs]
        for s, row in enumerate(cached_step(model, cache, seqs, new)):
            got[s].append(row[-1])
            tokens[s] += new[s]
    want = scratch_logits(model, tokens)
    for s, n in enumerate(lens):
        torch.testing.assert_close(torch.stack(got[s]), want[s][n:], atol=1e-4, rtol=1e-4)
