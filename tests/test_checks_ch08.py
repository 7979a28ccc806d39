"""The chapter-8 checks pass on the engine's int8 cache and on a right byte count, fail on stubs, and fail
on each classic bug of quantize-on-write, dequantize-on-read, copy-on-write and the MLA byte math with a
hint that names that bug."""
import pytest
import torch

from engine.cache.paged import PagedKVCache
from engine.cache.quantized import QMAX, SCALE_FLOOR, QuantizedPagedKVCache
from engine.checks import ch08
from fixtures.check_support import fails

pytestmark = pytest.mark.usefixtures("one_thread")

CACHE_CHECKS = [
    ch08.check_quantize_on_write,
    ch08.check_dequantize_on_read,
    ch08.check_copy_on_write_carries_scales,
    ch08.check_sharing_keeps_scales,
    ch08.check_int8_logits,
]


@pytest.mark.parametrize("check", CACHE_CHECKS, ids=lambda c: c.__name__)
def test_reference_passes(check, capsys):
    check(QuantizedPagedKVCache)
    assert capsys.readouterr().out.startswith("✓")


def test_hidden_variant_passes(capsys):
    ch08.check_int8_logits(QuantizedPagedKVCache, block_size=8, seed=1)
    assert "worst |Δ|" in capsys.readouterr().out


class StubCache(QuantizedPagedKVCache):
    def quantize_into(self, pool, scales, blocks, offsets, rows):
        raise NotImplementedError()

    def dequantize(self, pool, scales, blocks):
        raise NotImplementedError()

    def copy_on_write(self, seq, index):
        raise NotImplementedError()


@pytest.mark.parametrize("check", CACHE_CHECKS, ids=lambda c: c.__name__)
def test_stub_is_not_implemented(check):
    message = fails(check, StubCache)
    assert "not implemented yet" in message
    assert "StubCache." in message


# ---- planted bugs in quantize_into: each is the reference with one thing wrong ----------------------

def quantize(cache, pool, scales, blocks, offsets, rows, *, fresh=True, grow=True, requantize=True,
             per_head=True, divisor=QMAX, rounding=torch.round, pool_scale=False, shrink=False,
             floor=SCALE_FLOOR):
    """The reference quantize_into, with switches that plant the classic bugs."""
    touched, where = torch.unique(blocks, return_inverse=True)
    need = rows.abs().amax(dim=-1).float() / divisor
    if not per_head:
        need = need.amax(dim=-1, keepdim=True).expand_as(need)
    wanted = torch.zeros(len(touched), rows.shape[1])
    wanted.scatter_reduce_(0, where[:, None].expand_as(need), need, "amax")
    if pool_scale:
        wanted = wanted.amax(dim=0, keepdim=True).expand_as(wanted)
    first = torch.full((len(touched),), cache.block_size, dtype=offsets.dtype)
    first.scatter_reduce_(0, where, offsets, "amin")
    old = torch.where((first > 0)[:, None], scales[touched], 0.0) if fresh else scales[touched].clone()
    if shrink:
        new = torch.where((first > 0)[:, None] & (wanted == 0), old, wanted).clamp(min=floor)
    elif grow:
        new = torch.maximum(old, wanted).clamp(min=floor)
    else:                                            # the first write fixes the scale
        new = torch.where(old > 0, old, wanted).clamp(min=floor)
    if requantize:
        kept = pool[touched].float() * (old / new)[:, :, None, None]
        pool[touched] = rounding(kept).clamp(-QMAX, QMAX).to(pool.dtype)
    scales[touched] = new
    if pool_scale:
        scales[:] = new[0]
    codes = rounding(rows.float() / new[where][:, :, None]).clamp(-QMAX, QMAX)
    pool[blocks, :, offsets] = codes.to(pool.dtype)


def planted(name, **switches):
    def quantize_into(self, pool, scales, blocks, offsets, rows):
        quantize(self, pool, scales, blocks, offsets, rows, **switches)
    return type(name, (QuantizedPagedKVCache,), {"quantize_into": quantize_into})


NoRounding = planted("NoRounding", rounding=torch.trunc)
ClampAtFirstScale = planted("ClampAtFirstScale", grow=False, requantize=False)
GrowWithoutRequantize = planted("GrowWithoutRequantize", requantize=False)
KeepsPreviousOwnersScale = planted("KeepsPreviousOwnersScale", fresh=False)
OneScalePerBlock = planted("OneScalePerBlock", per_head=False)
OneScaleForThePool = planted("OneScaleForThePool", pool_scale=True)
Divides128 = planted("Divides128", divisor=128)
ScaleShrinks = planted("ScaleShrinks", shrink=True)
NoScaleFloor = planted("NoScaleFloor", floor=0.0)


class RescalesOtherBlocks(QuantizedPagedKVCache):
    """Re-rounds every block of the pool to its own max after each write: it rewrites blocks it does
    not own, shared ones included."""

    def quantize_into(self, pool, scales, blocks, offsets, rows):
        super().quantize_into(pool, scales, blocks, offsets, rows)
        others = torch.ones(pool.shape[0], dtype=torch.bool)
        others[blocks] = False
        scales[others] = scales[others] * 0.5


class FreshPerWrite(QuantizedPagedKVCache):
    """Decides "fresh block" once per write (its first row at offset 0), not per block."""

    def quantize_into(self, pool, scales, blocks, offsets, rows):
        for block in torch.unique(blocks).tolist():
            mine = blocks == block
            old = scales[block].clone() if int(offsets[0]) > 0 else torch.zeros_like(scales[block])
            new = torch.maximum(old, rows[mine].abs().amax(dim=(0, 2)) / QMAX).clamp(min=SCALE_FLOOR)
            pool[block] = torch.round(pool[block].float() * (old / new)[:, None, None]).to(pool.dtype)
            scales[block] = new
            codes = torch.round(rows[mine] / new[None, :, None]).clamp(-QMAX, QMAX)
            pool[block, :, offsets[mine]] = codes.to(pool.dtype).transpose(0, 1)


class RowByRow(QuantizedPagedKVCache):
    """Quantizes one row at a time, growing the scale (and re-rounding) row by row."""

    def quantize_into(self, pool, scales, blocks, offsets, rows):
        for block, offset, row in zip(blocks.tolist(), offsets.tolist(), rows):
            old = scales[block].clone() if offset > 0 else torch.zeros_like(scales[block])
            new = torch.maximum(old, row.abs().amax(dim=-1) / QMAX).clamp(min=SCALE_FLOOR)
            pool[block] = torch.round(pool[block].float() * (old / new)[:, None, None]).to(pool.dtype)
            scales[block] = new
            pool[block, :, offset] = torch.round(row / new[:, None]).clamp(-QMAX, QMAX).to(pool.dtype)


# ---- planted bugs in dequantize ------------------------------------------------------------------

class ForgetsTheScale(QuantizedPagedKVCache):
    def dequantize(self, pool, scales, blocks):
        return pool[blocks].to(self.read_dtype)


class ScaleByPosition(QuantizedPagedKVCache):
    def dequantize(self, pool, scales, blocks):
        position = torch.arange(blocks.numel()).view_as(blocks) % scales.shape[0]
        return pool[blocks].to(self.read_dtype) * scales[position][..., None, None]


class ReadsInFloat64(QuantizedPagedKVCache):
    def dequantize(self, pool, scales, blocks):
        return pool[blocks].double() * scales[blocks][..., None, None].double()


class OneScaleAcrossHeads(QuantizedPagedKVCache):
    def dequantize(self, pool, scales, blocks):
        return pool[blocks].to(self.read_dtype) * scales[blocks].mean(dim=-1)[..., None, None, None]


# ---- planted bugs in copy_on_write ---------------------------------------------------------------

class CopyForgetsScales(QuantizedPagedKVCache):
    def copy_on_write(self, seq, index):
        PagedKVCache.copy_on_write(self, seq, index)


class CopyKeyScalesOnly(QuantizedPagedKVCache):
    def copy_on_write(self, seq, index):
        block = self.tables[seq][index]
        PagedKVCache.copy_on_write(self, seq, index)
        fresh = self.tables[seq][index]
        if fresh != block:
            for scales in self.k_scales:
                scales[fresh] = scales[block]


class WritesIntoTheSharedBlock(QuantizedPagedKVCache):
    """No copy at all: the next write would requantize a block another sequence reads."""

    def copy_on_write(self, seq, index):
        pass


@pytest.mark.parametrize("check, bug, words", [
    (ch08.check_quantize_on_write, NoRounding, ["truncated toward zero", "torch.round"]),
    (ch08.check_quantize_on_write, ClampAtFirstScale, ["scale stayed where the first tokens set it",
                                                       "clamped"]),
    (ch08.check_quantize_on_write, GrowWithoutRequantize, ["codes of its first 3 tokens are unchanged",
                                                           "re-round"]),
    (ch08.check_quantize_on_write, KeepsPreviousOwnersScale, ["offset 0", "previous owner's scale"]),
    (ch08.check_quantize_on_write, OneScalePerBlock, ["one scale per block per KV head"]),
    (ch08.check_quantize_on_write, OneScaleForThePool, ["one scale for the whole pool"]),
    (ch08.check_quantize_on_write, Divides128, ["127"]),
    (ch08.check_quantize_on_write, ScaleShrinks, ["must still cover the 2 tokens already stored"]),
    (ch08.check_quantize_on_write, RescalesOtherBlocks, ["was not written", "another sequence may be reading"]),
    (ch08.check_quantize_on_write, FreshPerWrite, ["fresh block 5", "decide per block"]),
    (ch08.check_int8_logits, FreshPerWrite, ["from-scratch run", "decide per block"]),
    (ch08.check_quantize_on_write, RowByRow, ["one step off", "one at a time"]),
    (ch08.check_quantize_on_write, NoScaleFloor, ["all-zero token", "SCALE_FLOOR"]),
    (ch08.check_dequantize_on_read, ReadsInFloat64, ["the dtype", "self.read_dtype"]),
    (ch08.check_dequantize_on_read, ForgetsTheScale, ["raw codes", "multiply each code by its block's scale"]),
    (ch08.check_dequantize_on_read, ScaleByPosition, ["by position in `blocks`", "scales[blocks]"]),
    (ch08.check_dequantize_on_read, OneScaleAcrossHeads, ["each KV head has its own scale"]),
    (ch08.check_copy_on_write_carries_scales, CopyForgetsScales, ["none of the scales", "every layer"]),
    (ch08.check_copy_on_write_carries_scales, CopyKeyScalesOnly, ["V scales"]),
    (ch08.check_copy_on_write_carries_scales, WritesIntoTheSharedBlock, ["left sequence 1 on the shared block",
                                                                         "PagedKVCache.copy_on_write"]),
    # the same bugs in the engine, through the milestone checks
    (ch08.check_sharing_keeps_scales, WritesIntoTheSharedBlock, ["would requantize K/V another sequence reads"]),
    (ch08.check_sharing_keeps_scales, RescalesOtherBlocks, ["the parent's block 0 changed",
                                                           "another sequence may be reading"]),
    (ch08.check_sharing_keeps_scales, CopyForgetsScales, ["from-scratch run", "none of the scales"]),
    (ch08.check_int8_logits, ClampAtFirstScale, ["from-scratch run", "allowed 0.25", "clamped"]),
    (ch08.check_int8_logits, ForgetsTheScale, ["from-scratch run", "raw codes"]),
    (ch08.check_int8_logits, GrowWithoutRequantize, ["from-scratch run", "re-round"]),
    (ch08.check_int8_logits, OneScaleForThePool, ["from-scratch run", "one scale for the whole pool"]),
    (ch08.check_int8_logits, CopyForgetsScales, ["from-scratch run", "none of the scales"]),
], ids=lambda x: getattr(x, "__name__", ""))
def test_bug_is_caught(check, bug, words):
    message = fails(check, bug)
    for word in words:
        assert word in message, message


@pytest.mark.parametrize("bug", [NoRounding, ClampAtFirstScale, GrowWithoutRequantize, KeepsPreviousOwnersScale,
                                 OneScalePerBlock, OneScaleForThePool, Divides128, ScaleShrinks,
                                 RescalesOtherBlocks, FreshPerWrite, RowByRow], ids=lambda b: b.__name__)
def test_a_quantize_bug_leaves_the_other_exercises_passing(bug):
    ch08.check_dequantize_on_read(bug)
    ch08.check_copy_on_write_carries_scales(bug)


# ---- Exercise 8.2: bytes per token from a config dict ---------------------------------------------

def kv_bytes(hf, dtype_bytes=2):
    layers = hf["num_hidden_layers"]
    if "kv_lora_rank" in hf:
        return layers * (hf["kv_lora_rank"] + hf["qk_rope_head_dim"]) * dtype_bytes
    heads = hf["num_attention_heads"]
    kv_heads = hf.get("num_key_value_heads") or heads
    head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
    return 2 * layers * kv_heads * head_dim * dtype_bytes


def gqa_only(hf, dtype_bytes=2):
    heads = hf["num_attention_heads"]
    return (2 * hf["num_hidden_layers"] * (hf.get("num_key_value_heads") or heads)
            * (hf.get("head_dim") or hf["hidden_size"] // heads) * dtype_bytes)


def mla_twice(hf, dtype_bytes=2):
    return 2 * kv_bytes(hf, dtype_bytes) if "kv_lora_rank" in hf else kv_bytes(hf, dtype_bytes)


def latent_only(hf, dtype_bytes=2):
    if "kv_lora_rank" in hf:
        return hf["num_hidden_layers"] * hf["kv_lora_rank"] * dtype_bytes
    return kv_bytes(hf, dtype_bytes)


def all_query_heads(hf, dtype_bytes=2):
    return kv_bytes({**hf, "num_key_value_heads": hf["num_attention_heads"]}, dtype_bytes)


def ignores_head_dim(hf, dtype_bytes=2):
    return kv_bytes({k: v for k, v in hf.items() if k != "head_dim"}, dtype_bytes)


def one_layer(hf, dtype_bytes=2):
    return kv_bytes(hf, dtype_bytes) // hf["num_hidden_layers"]


def always_two_bytes(hf, dtype_bytes=2):
    return kv_bytes(hf, 2)


def test_kv_bytes_reference_passes(capsys):
    ch08.check_kv_bytes_from_config(kv_bytes)
    assert "69,120 B/token" in capsys.readouterr().out
    assert ch08.kv_bytes_reference(ch08.load_hf("deepseek-v2")) == 60 * 576 * 2


@pytest.mark.parametrize("bug, words", [
    (gqa_only, ["deepseek-v2", "expected 69120", "kv_lora_rank is MLA"]),
    (mla_twice, ["expected 69120, got 138240", "count it once"]),
    (latent_only, ["expected 69120, got 61440", "RoPE key"]),
    (all_query_heads, ["llama-3-8b", "num_key_value_heads"]),
    (ignores_head_dim, ["qwen3-0.6b", "head_dim"]),
    (one_layer, ["llama-2-13b", "num_hidden_layers"]),
    (always_two_bytes, ["dtype_bytes=1", "not a fixed 2"]),
], ids=lambda x: getattr(x, "__name__", ""))
def test_kv_bytes_bug_is_caught(bug, words):
    message = fails(ch08.check_kv_bytes_from_config, bug)
    for word in words:
        assert word in message, message


def test_kv_bytes_stub_is_not_implemented():
    def stub(hf, dtype_bytes=2):
        raise NotImplementedError()
    assert "not implemented yet" in fails(ch08.check_kv_bytes_from_config, stub)


# ---- auto-graded review questions ------------------------------------------------------------------

def test_review_answers_pass(capsys):
    ch08.check_review_int8_bytes(2 * 80 * 8 * 128 + 2 * 80 * 8 * 4 / 16)
    ch08.check_review_mla_block("c")
    ch08.check_review_table_entries(16384)
    assert capsys.readouterr().out.count("✓") == 3


@pytest.mark.parametrize("check, answer, words", [
    (ch08.check_review_int8_bytes, None, ["not answered yet"]),
    (ch08.check_review_int8_bytes, 163_840, ["codes alone", "scales"]),
    (ch08.check_review_int8_bytes, 327_680, ["fp16"]),
    (ch08.check_review_int8_bytes, 163_840 + 5_120, ["divide them by the block size"]),
    (ch08.check_review_mla_block, None, ["not answered yet"]),
    (ch08.check_review_mla_block, "d", ["128 MLA tokens", "69,120"]),
    (ch08.check_review_mla_block, "e", ["one letter"]),
    (ch08.check_review_table_entries, 65_536, ["blocks of 16"]),
    (ch08.check_review_table_entries, "many", ["must be a number"]),
])
def test_review_wrong_answers_get_their_hint(check, answer, words):
    message = fails(check, answer)
    for word in words:
        assert word in message, message


def test_dequantize_and_copy_checks_run_without_quantize_into(capsys):
    """Each exercise's check runs on its own method: a learner may write them in any order."""
    class QuantizeNotWritten(QuantizedPagedKVCache):
        def quantize_into(self, pool, scales, blocks, offsets, rows):
            raise NotImplementedError()
    ch08.check_dequantize_on_read(QuantizeNotWritten)
    ch08.check_copy_on_write_carries_scales(QuantizeNotWritten)
    assert capsys.readouterr().out.count("✓") == 2
