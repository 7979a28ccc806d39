"""Chapter 8's checks: int8 blocks with one scale per block per KV head, and the byte math of MLA.

The quantization checks take the learner's cache class (the engine's `QuantizedPagedKVCache` with the
learner's `quantize_into`, `dequantize` and `copy_on_write`). The first three probe one method each
on hand-made numbers and compare with an oracle written here; the last two run the tiny model through
the cache, with forks, swaps and the prefix cache, and compare logits with an fp32 from-scratch run.
When a check fails, it replays the classic bugs on the same numbers and names the one that happened.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import torch

import engine.checkpoint  # noqa: F401  (tiny() builds the model with it: imported before any cell)
from engine.cache.prefix import PrefixCache
from engine.checks import (CheckFailed, ceil_div, check, compare_logits, continuations, expect_equal, fail, passed,
                           made_beside, review_choice, review_number, shows_text, tiny, where_it_lives)
from engine.generate import cached_step, scratch_logits
from engine.seeded import seeded_tokens

QMAX = 127
SCALE_FLOOR = 1e-12          # the engine's floor for the scale of an all-zero block
# Logits through int8 blocks vs the fp32 from-scratch run: the engine's int8 cache stays below 0.1 on
# the checks' runs of the tiny model (logits of magnitude ~3); a scale set once and clamped is off by
# ~1-3. A quantizer that truncates or shares one scale over a write stays within ~0.15, as close to the
# engine's as runs differ from each other, so the decisive check also audits every write (_audited).
INT8_ATOL = 0.25
ONE_SCALE_PER_WRITE = ("one scale for the whole write: every block (and head) this write touches got the "
                       "largest |value| of all its rows / 127. A block's scale, per KV head, comes from that "
                       "block's own rows only (scatter_reduce_ by each row's block index, or a loop over the "
                       "touched blocks)")
ACROSS_BLOCKS = ("each head's scale came from all the rows of the write, across blocks: a block's scale comes "
                 "from its own rows only (scatter_reduce_ by each row's block index, or a loop over the "
                 "touched blocks)")
ACROSS_HEADS = ("both heads of a block got one scale: keep one scale per block per KV head (the max over "
                "head_dim and the block's tokens, separately for each head)")
SHARED_HINT = ("a write may change only the blocks it writes into: another sequence may be reading any "
               "other block (a fork, the prefix cache), and changing its codes or scale rewrites that "
               "sequence's history. Keep one scale per block and touch only scales[touched blocks]")


def _cache(cls, num_blocks: int = 8, block_size: int = 4):
    return cls(tiny().config, num_blocks, block_size=block_size, dtype=torch.float32, device="cpu")


def _rows(n: int, seed: int, heads: int, dim: int, magnitudes=None) -> torch.Tensor:
    """n rows [n, heads, dim] of seeded normal values, head h scaled by magnitudes[h]."""
    rows = torch.randn(n, heads, dim, generator=torch.Generator().manual_seed(seed))
    if magnitudes is not None:
        rows = rows * torch.tensor(magnitudes, dtype=torch.float32)[None, :, None]
    return rows


def _snapshot(pool, scales):
    return pool.clone(), scales.clone()


def _codes_close(got: torch.Tensor, ratio: torch.Tensor) -> bool:
    """Codes equal round(ratio), except where ratio sits on a .5 tie (either neighbour is fine)."""
    want = torch.round(ratio).clamp(-QMAX, QMAX)
    tie = ((ratio - ratio.floor()) - 0.5).abs() < 1e-3
    return bool(((got.float() == want) | (tie & ((got.float() - want).abs() <= 1))).all())


def _untouched(before, pool, scales, written: set[int], what: str) -> None:
    """Fail if a block outside `written` changed its codes or its scale."""
    old_pool, old_scales = before
    for block in range(pool.shape[0]):
        if block in written:
            continue
        if not torch.equal(pool[block], old_pool[block]) or not torch.equal(scales[block], old_scales[block]):
            pooled = bool((scales == scales[0]).all()) and len(written) < pool.shape[0]
            fail(f"{what}: block {block} was not written, yet its codes or scale changed (scale "
                 f"{old_scales[block].tolist()} -> {scales[block].tolist()})",
                 hint=("every block of the pool now has the same scale: one scale for the whole pool. "
                       "Keep one scale per block (per KV head) and set only scales[touched blocks]")
                 if pooled else SHARED_HINT)


def _expect_scales(got, want, rows_by_block, what: str) -> None:
    """Compare scales [U, H]; on a difference, name the classic mistake that gives `got`."""
    if torch.allclose(got, want, rtol=1e-5, atol=1e-12):
        return
    maxima = [r.abs().amax(dim=(0, 2)) for r in rows_by_block]              # per block, per head
    per_block = torch.stack([m.max().expand_as(m) for m in maxima]) / QMAX
    pooled = torch.stack(maxima).max() / QMAX
    one_per_block = torch.allclose(got, per_block, rtol=1e-5)
    if torch.allclose(got, pooled.expand_as(got), rtol=1e-5) and not one_per_block:
        hint = ("every block got the same scale, the largest value of the whole write: one scale for "
                "the whole pool. Each block's scale comes from its own tokens only")
    elif one_per_block and not torch.allclose(per_block, want, rtol=1e-5):
        hint = ACROSS_HEADS
    elif torch.allclose(got, (torch.stack(maxima).amax(dim=0) / QMAX).expand_as(got), rtol=1e-5):
        hint = ACROSS_BLOCKS
    elif any(torch.allclose(got, want * QMAX / d, rtol=1e-5) for d in (128, 255, 256)):
        hint = "symmetric int8 maps the largest |value| to 127: scale = max|x| / 127"
    elif torch.allclose(got, want * QMAX, rtol=1e-5):
        hint = "the scale is max|x| / 127, not max|x| itself (codes must fill [-127, 127])"
    else:
        hint = "scale[block, head] = largest |value| of that head among the block's tokens / 127"
    fail(f"{what}: the scales", [[round(x, 6) for x in r] for r in want.tolist()],
         [[round(x, 6) for x in r] for r in got.tolist()], hint)


def _expect_codes(got, rows, scales_per_row, what: str, several_rows: bool = False) -> None:
    """got [N, H, D] int codes against round(rows / scale); name truncation, a missing clamp, or (for a
    write of several rows into one block) rows rounded while the scale was still growing."""
    ratio = rows / scales_per_row[:, :, None]
    if _codes_close(got, ratio):
        return

    def rounded_by(fn) -> bool:      # got == fn(ratio), but for ratios within a hair of fn's steps
        return bool(((got.float() == fn(ratio - 1e-4).clamp(-QMAX, QMAX))
                     | (got.float() == fn(ratio + 1e-4).clamp(-QMAX, QMAX))).all())

    if rounded_by(torch.trunc):
        hint = ("the codes are x / scale truncated toward zero (a bare .to(torch.int8)): round first, "
                "torch.round(x / scale), or every value loses up to a whole step instead of half")
    elif rounded_by(torch.floor):
        hint = ("the codes are x / scale rounded down (floor), so every value moves down by up to a whole "
                "step: round to the nearest code, torch.round(x / scale)")
    elif rounded_by(lambda x: torch.trunc(x + 0.5)):
        hint = ("the codes are (x / scale + 0.5) cast to an integer, which rounds negative values the wrong "
                "way (-1.7 becomes -1, not -2): round with torch.round(x / scale)")
    elif rounded_by(torch.ceil):
        hint = ("the codes are x / scale rounded up (ceil), so every value moves up by up to a whole step: "
                "round to the nearest code, torch.round(x / scale)")
    elif bool((got.float() * ratio < 0).any() & (ratio.abs() > 120).any()):
        hint = "a code past 127 wrapped around to a negative number: clamp to [-127, 127] before the cast"
    elif several_rows and bool((got.float() - torch.round(ratio)).abs().max() <= 1):
        hint = ("some codes are one step off: were the rows rounded one at a time while the block's scale "
                "was still growing (earlier rows then re-rounded)? Compute the block's new scale from all "
                "of this write's rows for it first, then round every row once with that scale")
    else:
        hint = "code = round(x / scale), clamped to [-127, 127], stored at (block, :, offset)"
    wrong = (got.float() != torch.round(ratio)).nonzero()[0].tolist()
    fail(f"{what}: the code of row {wrong[0]}, head {wrong[1]}, element {wrong[2]}",
         int(torch.round(ratio[tuple(wrong)])), int(got[tuple(wrong)]), hint)


def _audit_write(before, pool, scales, blocks, offsets, rows, what: str) -> None:
    """Fail unless one quantize_into call did what Exercise 8.1 says with the numbers it was given:
    each touched block's scale per head = max(kept, its own rows' max / 127), at least SCALE_FLOOR
    (kept 0 for a block written at offset 0); the codes it held re-rounded to that scale; each row
    rounded with it; no other block changed."""
    old_pool, old_scales = before
    touched, where = torch.unique(blocks, return_inverse=True)
    _untouched(before, pool, scales, set(touched.tolist()), what)
    per_row = rows.abs().amax(dim=-1).float() / QMAX                               # [N, H]
    mine = [where == u for u in range(len(touched))]
    fresh = torch.tensor([bool((offsets[m] == 0).any()) for m in mine])
    kept = torch.where(fresh[:, None], 0.0, old_scales[touched])
    own = torch.stack([per_row[m].amax(dim=0) for m in mine])                      # [U, H]

    def grown(wanted):
        return torch.maximum(kept, wanted).clamp(min=SCALE_FLOOR)

    want, got = grown(own), scales[touched]
    if not torch.allclose(got, want, rtol=1e-5, atol=1e-12):
        candidates = [
            (grown(per_row.amax().expand_as(own)), ONE_SCALE_PER_WRITE),
            (grown(per_row.amax(dim=0, keepdim=True).expand_as(own)), ACROSS_BLOCKS),
            (grown(own.amax(dim=1, keepdim=True).expand_as(own)), ACROSS_HEADS),
            (torch.maximum(old_scales[touched], own).clamp(min=SCALE_FLOOR),
             "a write at offset 0 starts a fresh block: the previous owner's scale is not part of anyone's "
             "history, so the kept scale is 0"),
            (own.clamp(min=SCALE_FLOOR) if int(offsets[0]) == 0 and not bool(fresh.all()) else None,
             "blocks of this write that did not start at offset 0 were started afresh, because another block "
             "of the same write starts there: decide per block, from the lowest offset among that block's "
             "own rows (scatter_reduce_ with \"amin\", or a loop over the touched blocks)"),
            (own.clamp(min=SCALE_FLOOR), "the scale must still cover the tokens already stored: new scale = "
             "max(old scale, this write's max / 127)"),
            (torch.where(kept > 0, kept, own).clamp(min=SCALE_FLOOR),
             "the scale stayed where the first tokens set it, so larger tokens were clamped: grow the scale "
             "to cover them, and re-round the codes already in the block"),
            (grown(own * QMAX / 128), "symmetric int8 maps the largest |value| to 127: scale = max|x| / 127"),
            (grown(own * QMAX), "the scale is max|x| / 127, not max|x| itself (codes must fill [-127, 127])"),
        ]
        hint = next((h for c, h in candidates if c is not None and torch.allclose(got, c, rtol=1e-5, atol=1e-12)),
                    "scale[block, head] = max(kept scale, largest |value| of that head among the block's "
                    "rows of this write / 127)")
        u = int((~torch.isclose(got, want, rtol=1e-5, atol=1e-12)).any(dim=1).nonzero()[0])
        fail(f"{what}: the scales of block {int(touched[u])}", [round(x, 6) for x in want[u].tolist()],
             [round(x, 6) for x in got[u].tolist()], hint)
    for u, block in enumerate(touched.tolist()):
        if fresh[u]:
            continue
        held = torch.ones(pool.shape[2], dtype=torch.bool)
        held[offsets[mine[u]]] = False                 # the slots this write did not fill
        before_codes = old_pool[block][:, held].transpose(0, 1)                    # [K, H, D]
        after_codes = pool[block][:, held].transpose(0, 1)
        values = before_codes.float() * old_scales[block][None, :, None]
        new_scales = got[u].expand(len(after_codes), -1)
        if _codes_close(after_codes, values / new_scales[:, :, None]):
            continue
        if torch.equal(after_codes, before_codes):
            fail(f"{what}: block {block}'s scale grew, but the codes it already held are unchanged, so "
                 f"they read back up to {float((got[u] / old_scales[block]).max()):.2f}x too large",
                 hint="re-round the codes already in the block to the new scale: round(q * s_old / s_new)")
        _expect_codes(after_codes, values, new_scales,
                      f"{what}: the codes block {block} already held, re-rounded to its new scale")
    _expect_codes(pool[blocks, :, offsets], rows.float(), got[where], f"{what}: the written codes",
                  several_rows=True)


@where_it_lives
def _audited(cls):
    """A subclass of cls whose every quantize_into call is checked with _audit_write; the first failure
    is kept, as a message, in `audit_problem` (the write itself goes on as the learner's code did it)."""

    class Audited(cls):
        audit_problem: str | None = None
        audit_stage = "a write"

        def quantize_into(self, pool, scales, blocks, offsets, rows):
            before = (pool.clone(), scales.clone())
            super().quantize_into(pool, scales, blocks, offsets, rows)
            if self.audit_problem is None:
                pools = [("K", i, p) for i, p in enumerate(self.k_pools)]
                pools += [("V", i, p) for i, p in enumerate(self.v_pools)]
                kind, layer = next(((k, i) for k, i, p in pools if p is pool), ("?", "?"))
                what = (f"{self.audit_stage}, layer {layer} {kind}: a write of {len(rows)} row(s) into "
                        f"block(s) {sorted(set(blocks.tolist()))}")
                try:
                    _audit_write(before, pool, scales, blocks, offsets, rows, what)
                except CheckFailed as failure:
                    self.audit_problem = str(failure)

    Audited.__name__ = Audited.__qualname__ = cls.__name__
    return Audited


def _write(cache, pool, scales, blocks, offsets, rows):
    """quantize_into, with what it wrote into pool and scales copied into these (from where it ran)."""
    written_pool, written_scales = _quantized(cache, pool, scales, blocks, offsets, rows)
    pool.copy_(written_pool)
    scales.copy_(written_scales)


@where_it_lives
def _quantized(cache, pool, scales, blocks, offsets, rows):
    """cache.quantize_into(pool, scales, ...) where the cache lives; returns pool and scales as written
    (a tensor sent to the learner's process is a copy: what is written there comes back as the answer)."""
    cache.quantize_into(pool, scales, torch.tensor(blocks), torch.tensor(offsets), rows)
    return pool, scales


@where_it_lives
def _random_codes(cache, seed: int) -> None:
    """Seeded random codes in every pool and scales in [0.01, 0.11) in every scale tensor, set where the
    cache lives (codes and scales by hand: quantize_into is not needed for them)."""
    generator = torch.Generator().manual_seed(seed)
    for pool in list(cache.k_pools) + list(cache.v_pools):
        pool.copy_(torch.randint(-QMAX, QMAX + 1, pool.shape, generator=generator).to(pool.dtype))
    for scales in list(cache.k_scales) + list(cache.v_scales):
        scales.copy_(torch.rand(scales.shape, generator=generator) * 0.1 + 0.01)


@check
def check_quantize_on_write(cls) -> None:
    """quantize_into: per-block per-head scales, rounded codes, a scale that grows with re-rounded
    codes, a fresh start at offset 0, and no change to any block that is not written."""
    cache = _cache(cls)
    pool, scales = cache.k_pools[0], cache.k_scales[0]
    heads, dim = pool.shape[1], pool.shape[3]

    # 1. Three tokens into an empty block, in one write; head 1 is five times larger than head 0.
    rows = _rows(3, seed=1, heads=heads, dim=dim, magnitudes=[1.0, 5.0][:heads])
    before = _snapshot(pool, scales)
    _write(cache, pool, scales, [3, 3, 3], [0, 1, 2], rows)
    want = rows.abs().amax(dim=(0, 2)) / QMAX
    _expect_scales(scales[3:4], want[None], [rows], "after writing 3 tokens into empty block 3")
    _expect_codes(pool[3, :, :3].transpose(0, 1), rows, want.expand(3, heads),
                  "after writing 3 tokens into empty block 3", several_rows=True)
    _untouched(before, pool, scales, {3}, "after writing into block 3")

    # 2. Two blocks in one write, one of them ten times larger.
    small, big = _rows(2, seed=2, heads=heads, dim=dim), _rows(1, seed=3, heads=heads, dim=dim) * 10
    before = _snapshot(pool, scales)
    _write(cache, pool, scales, [1, 1, 6], [0, 1, 0], torch.cat([small, big]))
    want = torch.stack([small.abs().amax(dim=(0, 2)), big.abs().amax(dim=(0, 2))]) / QMAX
    _expect_scales(scales[[1, 6]], want, [small, big], "after one write into blocks 1 (2 tokens) and 6 "
                   "(1 token, 10x larger)")
    _untouched(before, pool, scales, {1, 6}, "after writing into blocks 1 and 6")

    # 3. A fourth token, four times larger than block 3's largest value: the scale must grow.
    old_codes, old_scale = pool[3, :, :3].clone(), scales[3].clone()
    large = _rows(1, seed=4, heads=heads, dim=dim)
    large = large / large.abs().amax() * rows.abs().amax() * 4
    before = _snapshot(pool, scales)
    _write(cache, pool, scales, [3], [3], large)
    new_scale = torch.maximum(old_scale, large.abs().amax(dim=(0, 2)) / QMAX)
    got_scale = scales[3].clone()
    if torch.allclose(got_scale, old_scale) and not torch.allclose(old_scale, new_scale):
        clipped = float(large.abs().amax() / (old_scale.max() * QMAX))
        fail(f"after a token {clipped:.1f}x larger than block 3's range arrives at offset 3: the scales "
             f"of block 3", new_scale.tolist(), got_scale.tolist(),
             f"the scale stayed where the first tokens set it, so the new token was clamped (clipped by up "
             f"to {clipped:.1f}x): grow the scale to cover it, and re-round the codes already in the block")
    _expect_scales(got_scale[None], new_scale[None], [torch.cat([rows, large])],
                   "after a 4x larger token arrives at offset 3 of block 3")
    kept = pool[3, :, :3]
    if torch.equal(kept, old_codes) and not torch.allclose(old_scale, new_scale):
        fail("after block 3's scale grew: the codes of its first 3 tokens are unchanged, so they read back "
             f"{float((new_scale / old_scale).max()):.1f}x too large",
             hint="re-round the codes already in the block to the new scale: round(q * s_old / s_new)")
    _expect_codes(kept.transpose(0, 1), old_codes.transpose(0, 1).float() * old_scale[None, :, None],
                  new_scale.expand(3, heads), "after block 3's scale grew: its first 3 tokens, re-rounded")
    _expect_codes(pool[3, :, 3:4].transpose(0, 1), large, new_scale.expand(1, heads),
                  "the 4x larger token at offset 3 of block 3")
    _untouched(before, pool, scales, {3}, "after growing block 3")

    # 4. A smaller token into block 1: a scale never shrinks while it still covers stored tokens. The
    #    same write starts fresh block 5 at offset 0, listed first: freshness is decided per block.
    old_codes, old_scale = pool[1].clone(), scales[1].clone()
    tiny_row = _rows(1, seed=5, heads=heads, dim=dim) * 0.01
    _write(cache, pool, scales, [5, 1], [0, 2], torch.cat([_rows(1, seed=9, heads=heads, dim=dim), tiny_row]))
    if not torch.allclose(scales[1], old_scale):
        what = ("one write of a token into fresh block 5 (offset 0) and a much smaller one into block 1 "
                "(offset 2): the scales of block 1")
        if not bool(pool[1, :, :2].any()):
            fail(what, old_scale.tolist(), scales[1].tolist(),
                 "block 1 was started afresh (its 2 stored tokens zeroed) because another block of the "
                 "same write starts at offset 0: decide per block, from the lowest offset among that "
                 "block's own rows (scatter_reduce_ with \"amin\", or a loop over the touched blocks)")
        fail(what, old_scale.tolist(), scales[1].tolist(),
             "the scale must still cover the 2 tokens already stored: new scale = max(old scale, "
             "this write's max / 127)")
    if not torch.equal(pool[1, :, :2], old_codes[:, :2]):
        fail("after a smaller token into block 1: the codes of its first 2 tokens changed",
             hint="when the scale does not grow, the stored codes stay exactly as they are")

    # 5. Block 6 handed to a new owner: a write at offset 0 starts afresh, whatever the block held.
    fresh = _rows(2, seed=6, heads=heads, dim=dim) * 0.1
    _write(cache, pool, scales, [6, 6], [0, 1], fresh)
    want = fresh.abs().amax(dim=(0, 2)) / QMAX
    if not torch.allclose(scales[6], want, rtol=1e-5):
        stale = torch.allclose(scales[6], torch.maximum(want, big.abs().amax(dim=(0, 2)) / QMAX), rtol=1e-5)
        fail("block 6 is written again from offset 0 (freed and reallocated): its scales", want.tolist(),
             scales[6].tolist(),
             "a write at offset 0 starts a fresh block: the previous owner's scale and codes are not part "
             "of anyone's history, so the scale comes from this write alone" if stale else
             "scale = this write's largest |value| per head / 127")
    _expect_codes(pool[6, :, :2].transpose(0, 1), fresh, want.expand(2, heads),
                  "block 6 written afresh", several_rows=True)

    # 6. An all-zero token into a fresh block: the scale stays positive, the codes are 0.
    _write(cache, pool, scales, [7], [0], torch.zeros(1, heads, dim))
    if not bool((scales[7] >= SCALE_FLOOR).all()) or bool(pool[7, :, 0].any()):
        fail("after writing an all-zero token into fresh block 7: (its scales, any nonzero code?)",
             (f"every scale >= SCALE_FLOOR ({SCALE_FLOOR:g})", False),
             (scales[7].tolist(), bool(pool[7, :, 0].any())),
             "an all-zero block still needs a positive scale: new scale at least SCALE_FLOOR "
             "(.clamp(min=SCALE_FLOOR)), or x / scale is 0 / 0 = NaN")
    passed("quantize_into: one scale per block per head (max|x| / 127), rounded codes, a scale that grows "
           "with re-rounded codes and never shrinks, a fresh start at offset 0, other blocks untouched")


@check
def check_dequantize_on_read(cls) -> None:
    """dequantize(pool, scales, blocks): codes times their block's scale, for any shape of block ids."""
    cache = _cache(cls)
    pool, scales = cache.k_pools[0], cache.k_scales[0]
    generator = torch.Generator().manual_seed(7)
    pool.copy_(torch.randint(-QMAX, QMAX + 1, pool.shape, generator=generator).to(pool.dtype))
    scales.copy_(torch.rand(scales.shape, generator=generator) * 0.1 + 0.01)
    blocks = torch.tensor([[2, 5, 0], [7, 7, 1]])
    got = cache.dequantize(pool, scales, blocks)
    want = pool[blocks].float() * scales[blocks][..., None, None]
    what = f"dequantize(pool, scales, blocks) with blocks {blocks.tolist()}"
    if not isinstance(got, torch.Tensor):
        fail(f"{what} returned {type(got).__name__}", hint="return one tensor, blocks.shape + [Hkv, bs, D]")
    if tuple(got.shape) != tuple(want.shape):
        fail(f"{what}: the shape", tuple(want.shape), tuple(got.shape),
             "index the pool with the whole blocks tensor, pool[blocks], then scale it: "
             "blocks.shape + [Hkv, block_size, head_dim]")
    if not got.is_floating_point():
        fail(f"{what}: the dtype", "a floating dtype (cache.read_dtype)", str(got.dtype),
             "convert the codes to floats before multiplying: int8 * scale would not hold the value")
    if got.dtype != cache.read_dtype:
        fail(f"{what}: the dtype", str(cache.read_dtype), str(got.dtype),
             "return the values in self.read_dtype: codes.to(self.read_dtype) times the scales")
    got = got.float()
    if torch.allclose(got, pool[blocks].float()):
        fail(f"{what}: the values are the raw codes", hint="multiply each code by its block's scale: "
             "codes * scales[blocks][..., None, None]")
    if not torch.allclose(got, want, rtol=1e-6, atol=1e-7):
        row = scales[torch.arange(blocks.numel()).view_as(blocks) % scales.shape[0]]
        if torch.allclose(got, pool[blocks].float() * row[..., None, None], rtol=1e-6):
            hint = ("the scales were taken by position in `blocks`, not by block id: use "
                    "scales[blocks], the scale of the physical block each code came from")
        elif torch.allclose(got, pool[blocks].float() * scales[blocks].mean(dim=-1)[..., None, None, None],
                            rtol=1e-6):
            hint = "each KV head has its own scale: scales[blocks] is blocks.shape + [Hkv]"
        else:
            hint = ("value = code * scale of (that block, that head): "
                    "pool[blocks] * scales[blocks][..., None, None]")
        index = ((got - want).abs() > 1e-6).nonzero()[0].tolist()
        fail(f"{what}: the value at index {index}", round(float(want[tuple(index)]), 6),
             round(float(got[tuple(index)]), 6), hint)
    passed(f"dequantize: {tuple(blocks.shape)} block ids -> {tuple(got.shape)} values, each code times "
           "its own block's and head's scale")


def _prefill(cache, seq: int, tokens: list[int]):
    cache.create(seq)
    return cached_step(tiny(), cache, [seq], [tokens])[0]


def _block_bytes(cache, block: int) -> list[torch.Tensor]:
    tensors = list(cache.k_pools) + list(cache.v_pools) + list(cache.k_scales) + list(cache.v_scales)
    return [t[block].clone() for t in tensors]


@check
def check_copy_on_write_carries_scales(cls) -> None:
    """copy_on_write: the paged cache's copy, plus the block's scales in every layer, K and V."""
    cache = _cache(cls, num_blocks=16)
    cache.create(0)
    cache.reserve(0, 10)                                       # blocks of 4: full, full, half
    _random_codes(cache, seed=11)
    table = list(cache.tables[0])
    before = [t.clone() for t in list(cache.k_scales) + list(cache.v_scales)]
    cache.copy_on_write(0, 2)                                  # private: nothing to do
    expect_equal(cache.tables[0], table, "copy_on_write(0, 2) on a block only sequence 0 uses: its table",
                 "a private block is written in place; only a shared block is copied")
    if not all(torch.equal(a, b) for a, b in zip(before, list(cache.k_scales) + list(cache.v_scales))):
        fail("copy_on_write on a private block changed some scales", hint="nothing is copied, nothing changes")
    cache.fork(0, 1)
    old = table[2]
    cache.copy_on_write(1, 2)
    new = cache.tables[1][2]
    if new == old:
        fail(f"after fork(0, 1), copy_on_write(1, 2) left sequence 1 on the shared block {old}",
             hint="call the paged cache's own copy first, PagedKVCache.copy_on_write(self, seq, index): "
                  "it allocates the copy, copies the codes and repoints the table")
    expect_equal(cache.allocator.refcount(old), 1, f"refcount of the original block {old} after the copy",
                 "PagedKVCache.copy_on_write releases the writer's reference; call it once")
    layers = len(cache.k_pools)
    names = [f"K codes of layer {i}" for i in range(layers)] + [f"V codes of layer {i}" for i in range(layers)]
    names += [f"K scales of layer {i}" for i in range(layers)] + [f"V scales of layer {i}" for i in range(layers)]
    missing = [name for name, a, b in zip(names, _block_bytes(cache, old), _block_bytes(cache, new))
               if not torch.equal(a, b)]
    if missing:
        codes_only = all("scales" in name for name in missing)
        if codes_only and len(missing) == 2 * layers:
            hint = ("the copy has the codes but none of the scales, so it reads back wrong: copy "
                    "k_scales[layer][block] and v_scales[layer][block] of every layer to the fresh block")
        elif codes_only and all(name.startswith("V") for name in missing):
            hint = "the V scales must travel too, not only the K scales"
        elif codes_only:
            hint = "copy the scales of every layer, not only the first"
        else:
            hint = "the codes were not copied: let PagedKVCache.copy_on_write do the copy"
        fail(f"after copy_on_write(1, 2): the fresh block {new} differs from block {old} in: "
             f"{', '.join(missing)}", hint=hint)
    passed(f"copy_on_write: the fresh block {new} holds block {old}'s codes and its scales in all "
           f"{layers} layers, K and V; a private block is left alone")


def _diagnose(cls) -> str:
    """The hint of the first unit check that fails on cls, else a general one."""
    for probe in (check_quantize_on_write, check_dequantize_on_read, check_copy_on_write_carries_scales):
        try:
            probe.__wrapped__(cls)
        except CheckFailed as failure:
            return f"{probe.__name__} fails too: {failure}"
        except Exception as exc:  # a crash in a probe: report it plainly
            return f"{probe.__name__} crashes with {type(exc).__name__}: {exc}"
    return ("the history read back is off by more than int8 rounding: compare the dequantized history "
            "with the fp32 K and V of the same positions")


def _quiet(fn, *args):
    """Run a check's body without its ✓ line (used for diagnosis)."""
    with contextlib.redirect_stdout(io.StringIO()):
        return fn(*args)


def _compare(diagnose, got, want, what: str, first_position: int) -> float:
    """compare_logits within INT8_ATOL; on a failure, the hint is diagnose(), the bug the probes find."""
    try:
        return compare_logits(got, want, what, first_position, atol=INT8_ATOL)
    except CheckFailed:
        return compare_logits(got, want, what, first_position, hint=diagnose(), atol=INT8_ATOL)


class _Recorder:
    """Runs cached steps and keeps every step's logits; compare() checks them all against one
    from-scratch run of each sequence's final tokens (causal, so each row is that position's logits)."""

    def __init__(self, cls, cache):
        self.cls, self.cache = cls, cache
        self.diagnose = lambda: _quiet(_diagnose, cls)
        self.seqs: dict[int, list[int]] = {}
        self.records: list[tuple[str, int, int, torch.Tensor]] = []

    def step(self, active: list[int], new: dict[int, list[int]], stage: str) -> list[torch.Tensor]:
        for s in active:
            self.seqs[s] = self.seqs.get(s, []) + new[s]
        self.cache.audit_stage = stage
        got = cached_step(tiny(), self.cache, active, [new[s] for s in active])
        for s, g in zip(active, got):
            self.records.append((stage, s, len(self.seqs[s]) - len(new[s]), g))
        return got

    def compare(self) -> float:
        """The worst |Δ| over every recorded step; fails at the first step (in run order) beyond INT8_ATOL."""
        names = list(self.seqs)
        want = dict(zip(names, scratch_logits(tiny(), [self.seqs[s] for s in names])))
        worst = 0.0
        for stage, s, start, got in self.records:
            expected = want[s][start:start + len(got)]
            worst = max(worst, _compare(self.diagnose, got, expected, f"{stage}, sequence {s}", start))
        return worst


@check
def check_sharing_keeps_scales(cls, block_size: int = 4) -> None:
    """Fork, swap and the prefix cache through int8 blocks: shared blocks keep their codes and scales
    bit for bit while siblings write, swap brings back the same bytes, and every logit stays within
    INT8_ATOL of an fp32 from-scratch run."""
    bs = block_size
    cache = _cache(cls, num_blocks=48, block_size=bs)
    run = _Recorder(cls, cache)
    step, seqs = run.step, run.seqs
    cache.create(0)
    step([0], {0: seeded_tokens(2 * bs + 2, seed=21)}, "prefill")
    cache.fork(0, 1)
    seqs[1] = list(seqs[0])
    parent_blocks = list(cache.tables[0])
    frozen = {b: _block_bytes(cache, b) for b in parent_blocks}

    step([1], {1: [200]}, "the child's first token after fork(0, 1)")
    for block in parent_blocks:
        if any(not torch.equal(a, b) for a, b in zip(frozen[block], _block_bytes(cache, block))):
            fail(f"after fork(0, 1) the child wrote one token, and the parent's block {block} changed "
                 "(codes or scales)", hint=SHARED_HINT if block != parent_blocks[-1] else
                 "the child must write into its own copy of the shared partial block (copy_on_write), "
                 "never requantize the parent's")
    step([0, 1], {0: [7, 8, 9], 1: [50, 51, 52]}, "parent and child after 3 more different tokens")

    # Swap the child out and back in: the same codes and scales, maybe in other blocks.
    history = [cache.dequantize(p, s, torch.tensor(cache.tables[1])).clone()
               for p, s in zip(cache.k_pools + cache.v_pools, cache.k_scales + cache.v_scales)]
    cache.swap_out(1)
    filler = _prefill(cache, 2, seeded_tokens(bs + 1, seed=22))       # takes the freed blocks
    del filler
    cache.swap_in(1)
    after = [cache.dequantize(p, s, torch.tensor(cache.tables[1]))
             for p, s in zip(cache.k_pools + cache.v_pools, cache.k_scales + cache.v_scales)]
    if any(not torch.equal(a, b) for a, b in zip(history, after)):
        fail("after swap_out(1) and swap_in(1), sequence 1's history reads back differently",
             hint="a block's scales belong to it: whatever moves the codes must move the scales")
    step([0, 1], {0: [3], 1: [4]}, "after the child was swapped out and back in")

    # The prefix cache: a second request reuses the first one's full blocks, scales included.
    prefix = made_beside(cache, PrefixCache, cache)
    prompt = seeded_tokens(3 * bs, seed=23)
    cache.create(5)
    step([5], {5: prompt}, "a 3-block prompt")
    prefix.remember(5, prompt)
    published = list(cache.tables[5])
    frozen = {b: _block_bytes(cache, b) for b in published}
    other = prompt[:2 * bs] + seeded_tokens(bs + 1, seed=24)
    reused = prefix.attach(6, other)
    expect_equal(reused, 2 * bs, "tokens the prefix cache reuses for a prompt sharing 2 full blocks")
    seqs[6] = other[:reused]
    step([6], {6: other[reused:]}, "a prompt that reuses 2 cached int8 blocks")
    for block in published:
        if any(not torch.equal(a, b) for a, b in zip(frozen[block], _block_bytes(cache, block))):
            fail(f"a prefix-cache hit wrote, and cached block {block} changed (codes or scales)",
                 hint=SHARED_HINT)
    worst = run.compare()
    passed(f"sharing int8 blocks: a fork, a swap and a prefix-cache hit keep every shared block's codes "
           f"and scales bit for bit; worst |Δ| vs fp32 from scratch {worst:.3f} (allowed {INT8_ATOL:g})")


def written_out(cls, block_size: int = 4):
    """A run for continuations: the trained model's prompt through int8 blocks of `cls`, prefilled, then
    decoded a token a step."""
    return continuations.plain_run(lambda config, tokens: cls(config, ceil_div(tokens, block_size) + 1,
                                                              block_size=block_size, dtype=torch.float32,
                                                              device="cpu"))


def _engine_int8():
    """The engine's own int8 cache, to write the text int8 blocks should give (int8 is not exact, so not
    from scratch); None where this engine's int8 methods are the student edition's stubs."""
    from engine.cache.quantized import QuantizedPagedKVCache
    codes = [getattr(getattr(QuantizedPagedKVCache, name), "__code__", None)
             for name in ("quantize_into", "dequantize")]
    return None if any(code is None or "_edition" in code.co_names for code in codes) else QuantizedPagedKVCache


def text_of(cls, block_size: int = 4) -> str:
    """The trained model's text through the learner's int8 cache beside the engine's (from scratch where the
    engine's is not there to run)."""
    engine_int8 = _engine_int8()
    reference = written_out(engine_int8, block_size) if engine_int8 else None
    return continuations.shown(written_out(cls, block_size), reference=reference)


@check
def check_int8_logits(cls, block_size: int = 4, seed: int = 0, steps: int = 20) -> None:
    """The decisive check: a ragged batch (lengths bs-1, bs, bs+1, 2bs+1) prefilled and decoded for
    `steps` steps through int8 blocks, with a fork and a swap on the way; every step's logits within
    INT8_ATOL of the fp32 from-scratch run."""
    bs = block_size
    lengths = [bs - 1, bs, bs + 1, 2 * bs + 1]
    prompts = {s: seeded_tokens(n, seed=100 * seed + s) for s, n in enumerate(lengths)}
    cache = _cache(_audited(cls), num_blocks=5 * (ceil_div(2 * bs + 1 + steps, bs) + 1), block_size=bs)
    run = _Recorder(cls, cache)
    audit = "the first write that breaks the rule of Exercise 8.1: "
    run.diagnose = lambda: (audit + cache.audit_problem.replace(". Hint: ", "; its hint: ")
                            if cache.audit_problem else _quiet(_diagnose, cls))
    step, seqs = run.step, run.seqs
    active = list(prompts)
    for s in active:
        cache.create(s)
    out = step(active, prompts, "prefill")
    last = {s: o[-1] for s, o in zip(active, out)}
    for t in range(steps):
        if t == steps // 3:                      # a fork of the longest sequence, mid-block
            cache.fork(3, 4)
            seqs[4], last[4] = list(seqs[3]), last[3]
            active.append(4)
        if t == steps // 2:
            cache.swap_out(1)
            active.remove(1)
        if t == steps // 2 + 2:
            cache.swap_in(1)
            active.append(1)
        new = {s: [int(last[s].argmax()) if s != 4 else (int(last[s].argmax()) + 1) % 256] for s in active}
        out = step(active, new, f"decode step {t + 1}")
        last.update({s: o[-1] for s, o in zip(active, out)})
    with shows_text(lambda: text_of(cls, bs)):
        worst = run.compare()
    if cache.audit_problem:
        fail(f"every logit stayed within {INT8_ATOL:g} of the fp32 run (worst |Δ| {worst:.3f}), but a write "
             f"did not store what quantize_into must: {cache.audit_problem}")
    for s in list(cache.tables):
        cache.free(s)
    expect_equal(cache.allocator.num_free, cache.allocator.num_blocks, "after freeing every sequence: num_free")
    passed(f"int8 blocks: prefill of {lengths} + {steps} decode steps, a fork and a swap; worst |Δ| vs fp32 "
           f"from scratch {worst:.3f} (allowed {INT8_ATOL:g})")


# ---- architectures that change the byte math ------------------------------------------------------

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
CONFIG_FILES = {"llama-2-13b": "llama-2-13b.json", "llama-3-8b": "llama-3-8b.json",
                "llama-3-70b": "llama-3-70b.json", "qwen3-0.6b": "qwen3-0.6b.json",
                "deepseek-v2": "mla/deepseek-v2.json"}


def load_hf(name: str) -> dict:
    """A published config.json from engine/configs as a dict (MLA configs live in configs/mla/)."""
    return json.loads((CONFIGS / CONFIG_FILES[name]).read_text())


def kv_bytes_reference(hf: dict, dtype_bytes: int = 2) -> int:
    """The engine's answer to Exercise 8.2, for the chapter's figures: KV bytes of one token."""
    return _oracle(hf, dtype_bytes)["right"]


def _oracle(hf: dict, dtype_bytes: int) -> dict:
    """Bytes per token, right and as each classic mistake computes it."""
    layers, heads = hf["num_hidden_layers"], hf["num_attention_heads"]
    kv_heads = hf.get("num_key_value_heads") or heads
    head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
    gqa = 2 * layers * kv_heads * head_dim * dtype_bytes
    out = {"gqa_all_heads": 2 * layers * heads * head_dim * dtype_bytes,
           "hidden_over_heads": 2 * layers * kv_heads * (hf["hidden_size"] // heads) * dtype_bytes,
           "one_layer": gqa // layers, "k_only": gqa // 2, "two_bytes": gqa // dtype_bytes * 2}
    if "kv_lora_rank" in hf:
        latent, rope = hf["kv_lora_rank"], hf["qk_rope_head_dim"]
        right = layers * (latent + rope) * dtype_bytes
        per_head = hf.get("qk_nope_head_dim", 0) + rope
        mla = {"right": right, "mla_twice": 2 * right, "latent_only": layers * latent * dtype_bytes,
               "mla_as_mha": gqa, "mla_full_heads": layers * heads * (per_head + hf.get("v_head_dim", 0))
               * dtype_bytes, "one_layer": right // layers, "two_bytes": right // dtype_bytes * 2}
        out = {**mla, **{key: value for key, value in out.items() if key not in mla}}   # MLA's first
    else:
        out["right"] = gqa
    return out


HEAD_DIM_NULL = ('a config.json may say "head_dim": null (the key is there, its value None): then, as '
                 "the engine does, head_dim = hidden_size // num_attention_heads (hf.get(\"head_dim\") or "
                 "..., not hf.get(\"head_dim\", ...))")
HINTS = {
    "head_dim_null": HEAD_DIM_NULL,
    "mla_twice": "an MLA layer caches one latent vector that K and V are both rebuilt from: count it once, "
                 "not once for K and once for V",
    "latent_only": "the decoupled RoPE key (qk_rope_head_dim per layer) is cached beside the latent",
    "mla_as_mha": "a config with kv_lora_rank is MLA: it caches kv_lora_rank + qk_rope_head_dim numbers "
                  "per layer, not K and V per head",
    "mla_full_heads": "that is the K and V an MLA layer rebuilds for its heads, not what it caches: the "
                      "cache holds kv_lora_rank + qk_rope_head_dim numbers per layer",
    "gqa_all_heads": "with grouped-query attention only num_key_value_heads heads are cached, not "
                     "num_attention_heads",
    "hidden_over_heads": "when the config states head_dim, use it (Qwen3's is not hidden_size / heads)",
    "one_layer": "every layer has its own cache: multiply by num_hidden_layers",
    "k_only": "a GQA/MHA cache stores K and V: the factor 2",
    "two_bytes": "use dtype_bytes (1 for int8/fp8, 2 for bf16/fp16), not a fixed 2",
}


@check
def check_kv_bytes_from_config(kv_bytes_per_token) -> None:
    """kv_bytes_per_token(hf, dtype_bytes=2): GQA/MHA from heads and head_dim, MLA from the latent."""
    synthetic_mla = {"num_hidden_layers": 3, "num_attention_heads": 8, "num_key_value_heads": 8,
                     "hidden_size": 256, "kv_lora_rank": 96, "qk_rope_head_dim": 16,
                     "qk_nope_head_dim": 32, "v_head_dim": 32}
    cases = [(name, load_hf(name), b) for name in CONFIG_FILES for b in (2, 1)]
    cases.append(("a small MLA config (3 layers, latent 96, rope 16)", synthetic_mla, 2))
    cases.append(('llama-3-8b with "head_dim": null', {**load_hf("llama-3-8b"), "head_dim": None}, 2))
    for name, hf, dtype_bytes in cases:
        oracle = _oracle(hf, dtype_bytes)
        try:
            got = kv_bytes_per_token(dict(hf), dtype_bytes)
        except TypeError as error:
            if "head_dim" not in hf or hf["head_dim"] is not None:
                raise
            fail(f"kv_bytes_per_token_hf({name}, dtype_bytes={dtype_bytes}) crashed with TypeError: {error}",
                 hint=HEAD_DIM_NULL)
        if got != oracle["right"]:
            bug = next((key for key, value in oracle.items() if key != "right" and value == got), None)
            if hf.get("head_dim", 0) is None and bug is None:
                bug = "head_dim_null"
            fail(f"kv_bytes_per_token_hf({name}, dtype_bytes={dtype_bytes})", oracle["right"], got,
                 HINTS.get(bug, "GQA/MHA: 2 * layers * kv_heads * head_dim * bytes; MLA (kv_lora_rank in "
                                "the config): layers * (kv_lora_rank + qk_rope_head_dim) * bytes"))
    mla, gqa = kv_bytes_per_token(load_hf("deepseek-v2"), 2), kv_bytes_per_token(load_hf("llama-3-70b"), 2)
    passed(f"kv_bytes_per_token_hf: {len(cases)} cases; DeepSeek-V2 (MLA) {mla:,} B/token, Llama-3-70B (GQA) "
           f"{gqa:,} B/token, {gqa / mla:.2f}x more")


# ---- auto-graded review questions -----------------------------------------------------------------

# The numbers the review questions ask about (tests/test_checks_ch08.py holds the questions' text to them).
R1 = {"layers": 80, "kv_heads": 8, "head_dim": 128, "block_size": 16}
R3 = {"tokens": 100_000, "block_size": 48}


@check
def check_review_int8_bytes(answer) -> None:
    """R1: KV bytes per token of Llama-3-70B in int8 blocks of 16, one float32 scale per block, KV
    head, layer, K and V (164,160)."""
    layers, kv_heads, head_dim, bs = R1["layers"], R1["kv_heads"], R1["head_dim"], R1["block_size"]
    codes = 2 * layers * kv_heads * head_dim
    scales = 2 * layers * kv_heads * 4
    want = codes + scales / bs
    review_number(answer, "R1", "r1_answer", want,
                  f"{want:,.0f} bytes per token, {want / (2 * codes):.2%} of fp16's {2 * codes:,}",
                  f"is not the bytes one token costs in int8 blocks of {bs} ({layers} layers, {kv_heads} KV heads "
                  f"of {head_dim}, one float32 scale per block, KV head, layer, K and V)",
                  f"codes: 2 * layers * kv_heads * head_dim bytes; scales: 2 * layers * kv_heads * 4 bytes per "
                  f"block of {bs} tokens",
                  {codes: f"that is the codes alone: each block also stores its scales (4 bytes per KV head, "
                          f"per layer, for K and for V), shared by its {bs} tokens",
                   2 * codes: "that is fp16 (2 bytes per number); int8 stores 1",
                   codes + scales: f"a block's scales are shared by its {bs} tokens: divide them by the block size",
                   codes + scales / bs / kv_heads: "there is one scale per KV head, not one per block",
                   codes + scales / (2 * bs): "K and V have a scale each"})


@check
def check_review_mla_block(answer) -> None:
    """R2: the MLA block size whose bytes come closest to a 16-token Llama-3-70B block (c: 64)."""
    gqa, mla = 16 * 327_680, 69_120
    review_choice(answer, "R2", "r2_answer", "c", f"64 MLA tokens take {64 * mla / 2**20:.2f} MiB, against "
                  f"{gqa / 2**20:.0f} MiB for 16 Llama-3-70B tokens",
                  {letter: f"{size} MLA tokens take {size * mla / 2**20:.2f} MiB, against {gqa / 2**20:.0f} MiB "
                           "for a 16-token Llama-3-70B block" for letter, size in zip("abd", (16, 32, 128))},
                  "divide the GQA block's bytes by MLA's bytes per token (69,120) and take the nearest size")


@check
def check_review_table_entries(answer) -> None:
    """R3: block-table entries of one 100,000-token sequence in blocks of 48: ceil(100000 / 48) = 2,084."""
    tokens, size = R3["tokens"], R3["block_size"]
    want = ceil_div(tokens, size)
    review_number(answer, "R3", "r3_answer", want,
                  f"{want:,} entries: {tokens // size:,} full blocks and one partial block of "
                  f"{tokens % size} tokens",
                  f"is not the number of block-table entries of one {tokens:,}-token sequence in blocks of {size} "
                  f"tokens", f"one entry per block: ceil({tokens:,} / {size})",
                  {tokens // size: "the last, partial block needs an entry too: round up",
                   tokens / size: "a table holds whole blocks: round up to a whole number",
                   ceil_div(tokens, 16): f"that is for blocks of 16; the question asks for blocks of {size}",
                   tokens * size: "entries = tokens / block size, not times",
                   2 ** 20 // 64: f"16,384 answers an earlier wording of R3 (1,048,576 tokens in blocks of 64), "
                                  f"kept in an older copy of this notebook; R3 now asks for one sequence of "
                                  f"{tokens:,} tokens in blocks of {size}: ceil({tokens:,} / {size})"})
